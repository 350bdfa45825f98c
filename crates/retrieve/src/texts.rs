//! Chunks' words — each chunk's section path and text — kept out of the
//! heap and read for the chunks a search returns.
//!
//! A chunk's words are the bulk of what a collection holds (1–2 KiB a
//! chunk against the 24 bytes that say where they are), and a search
//! reads a few dozen of them, so they live in files: those of an opened
//! snapshot read in place from its memory-mapped `chunks.texts` (the page
//! cache holds what was read, and the kernel gives it back under
//! pressure), those written since appended to a file of the collection's
//! work folder and read back with `pread`. Without a work folder they are
//! appended to one heap buffer instead (a collection held in memory).
//!
//! A record is two little-endian `u32` lengths (section, text) and the two
//! strings; a [`Span`] is where one lies. A record is written once and
//! never changed: a chunk rewritten gets a new record and the old one is
//! [released](Texts::release). Once the released bytes pass the live ones
//! by [`COMPACT_FLOOR`] ([`Texts::wasteful`]), the collection copies its
//! live records into a new file ([`Texts::compacted`]) and swaps it in
//! with their new spans ([`Texts::install`]), the snapshot's mapped file
//! dropped with the rest: a collection whose documents are rewritten holds
//! at most about twice its live words on disk (or in the heap), and each
//! byte written is copied about once more.

use crate::IndexError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};
use tantivy::directory::OwnedBytes;

/// The first bytes of a snapshot's texts file.
const MAGIC: &[u8; 8] = b"RTTEXT01";

/// A record's two lengths.
const LENGTHS: usize = 8;

/// Set in [`Span::at`] for a record of the opened snapshot's file.
const SAVED: u64 = 1 << 63;

/// Where one chunk's words are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    at: u64,
    len: u32,
}

/// One chunk's words, read back.
pub(crate) struct Words {
    pub section: String,
    pub text: String,
}

/// Released bytes past the live ones that a compaction waits for: a small
/// collection is not copied over for a few rewrites.
pub const COMPACT_FLOOR: u64 = 4 << 20;

/// The name of the records' file in a work folder, and of the one a
/// compaction writes before it is swapped in.
const SINK_FILE: &str = "texts";
const COMPACTING_FILE: &str = "texts.compacting";

enum Sink {
    Memory(Vec<u8>),
    File { file: File, len: u64 },
}

impl Sink {
    fn len(&self) -> u64 {
        match self {
            Sink::Memory(v) => v.len() as u64,
            Sink::File { len, .. } => *len,
        }
    }
}

struct Held {
    /// The opened snapshot's file, read in place.
    saved: Option<OwnedBytes>,
    /// The records written since.
    sink: Sink,
}

pub(crate) struct Texts {
    held: RwLock<Held>,
    /// Where the records' file is (`None`: in the heap).
    folder: Option<PathBuf>,
    /// Bytes of records no chunk reads any more.
    released: std::sync::atomic::AtomicU64,
}

/// A compaction's new records, made by [`Texts::compacted`] and swapped in
/// by [`Texts::install`].
pub(crate) struct Compacted {
    sink: Sink,
}

fn encode(out: &mut Vec<u8>, section: &str, text: &str) -> Result<u32, IndexError> {
    let too_long = || IndexError::Snapshot("a chunk's text is over 4 GiB".into());
    let s = u32::try_from(section.len()).map_err(|_| too_long())?;
    let t = u32::try_from(text.len()).map_err(|_| too_long())?;
    out.extend_from_slice(&s.to_le_bytes());
    out.extend_from_slice(&t.to_le_bytes());
    out.extend_from_slice(section.as_bytes());
    out.extend_from_slice(text.as_bytes());
    u32::try_from(LENGTHS + section.len() + text.len()).map_err(|_| too_long())
}

/// A record's section and text, borrowed; an error when its lengths do
/// not add up to it or it is not UTF-8.
fn parse(record: &[u8]) -> Result<(&str, &str), IndexError> {
    let bad = || IndexError::Snapshot("a chunk's text record is damaged".into());
    if record.len() < LENGTHS {
        return Err(bad());
    }
    let s = u32::from_le_bytes(record[..4].try_into().expect("4 bytes")) as usize;
    let t = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes")) as usize;
    if LENGTHS.checked_add(s).and_then(|n| n.checked_add(t)) != Some(record.len()) {
        return Err(bad());
    }
    let section = std::str::from_utf8(&record[LENGTHS..LENGTHS + s]).map_err(|_| bad())?;
    let text = std::str::from_utf8(&record[LENGTHS + s..]).map_err(|_| bad())?;
    Ok((section, text))
}

fn decode(record: &[u8]) -> Result<Words, IndexError> {
    let (section, text) = parse(record)?;
    Ok(Words {
        section: section.to_owned(),
        text: text.to_owned(),
    })
}

impl Texts {
    /// No records; those written go to a file `texts` in `folder` (made
    /// now), or to the heap when `None`.
    pub fn new(folder: Option<&Path>) -> Result<Self, IndexError> {
        let sink = match folder {
            None => Sink::Memory(Vec::new()),
            Some(folder) => {
                std::fs::create_dir_all(folder)?;
                Sink::File {
                    file: create(&folder.join(SINK_FILE))?,
                    len: 0,
                }
            }
        };
        Ok(Self {
            held: RwLock::new(Held { saved: None, sink }),
            folder: folder.map(Path::to_owned),
            released: Default::default(),
        })
    }

    /// The records of the snapshot file at `path` ([`Saving`]
    /// wrote it), read in place; the ones written from now on go where
    /// [`Texts::new`] says.
    pub fn open(path: &Path, folder: Option<&Path>) -> Result<Self, IndexError> {
        let bad = |what: &str| IndexError::Snapshot(format!("{}: {what}", path.display()));
        let map = crate::map_file(path)?;
        if map.len() < MAGIC.len() || &map.as_slice()[..MAGIC.len()] != MAGIC {
            return Err(bad("not a texts file"));
        }
        let me = Self::new(folder)?;
        me.write().saved = Some(map);
        Ok(me)
    }

    fn read_held(&self) -> std::sync::RwLockReadGuard<'_, Held> {
        self.held.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Held> {
        self.held.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the record at `span` as read by no chunk any more.
    pub fn release(&self, span: Span) {
        self.released
            .fetch_add(u64::from(span.len), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the released records are worth a compaction: more of them
    /// than live ones, by [`COMPACT_FLOOR`].
    pub fn wasteful(&self) -> bool {
        let held = self.read_held();
        let all = held.sink.len() + held.saved.as_ref().map_or(0, |m| m.len() as u64);
        let released = self.released.load(std::sync::atomic::Ordering::Relaxed);
        let live = all.saturating_sub(released);
        released > live + COMPACT_FLOOR
    }

    /// The records at `spans` copied, in order, into a new file of the work
    /// folder (a new heap buffer without one), and their new spans; nothing
    /// changes until [`Texts::install`]. The caller holds off every write
    /// meanwhile (the spans must stay the live ones); reads go on.
    pub fn compacted(&self, spans: &[Span]) -> Result<(Compacted, Vec<Span>), IndexError> {
        let mut out = Vec::with_capacity(spans.len());
        let mut record = Vec::new();
        let mut at = 0u64;
        let mut copy_into = |to: &mut dyn Write| -> Result<(), IndexError> {
            for span in spans {
                self.copy(*span, &mut record)?;
                to.write_all(&record)?;
                out.push(Span { at, len: span.len });
                at += u64::from(span.len);
            }
            Ok(to.flush()?)
        };
        let sink = match &self.folder {
            None => {
                let mut buf = Vec::new();
                copy_into(&mut buf)?;
                buf.shrink_to_fit();
                Sink::Memory(buf)
            }
            Some(folder) => {
                let file = create(&folder.join(COMPACTING_FILE))?;
                copy_into(&mut BufWriter::with_capacity(1 << 20, &file))?;
                Sink::File { file, len: at }
            }
        };
        Ok((Compacted { sink }, out))
    }

    /// Swaps in a compaction's records (the caller swaps in their spans
    /// under the same lock its readers take): the old file is removed and
    /// the snapshot's file unmapped.
    pub fn install(&self, compacted: Compacted) -> Result<(), IndexError> {
        if let Some(folder) = &self.folder {
            // The old file's handle stays valid for a read under way.
            std::fs::rename(folder.join(COMPACTING_FILE), folder.join(SINK_FILE))?;
        }
        let mut held = self.write();
        held.sink = compacted.sink;
        held.saved = None;
        self.released.store(0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The span of the opened snapshot's record at `at`, `len` bytes
    /// long; `None` where the file does not hold it.
    pub fn saved_span(&self, at: u64, len: u32) -> Option<Span> {
        let size = self.read_held().saved.as_ref()?.len() as u64;
        let end = at.checked_add(u64::from(len))?;
        (at >= MAGIC.len() as u64 && end <= size && len as usize >= LENGTHS).then_some(Span {
            at: at | SAVED,
            len,
        })
    }

    /// Whether the records at `spans` (up to 64 of them, spread over the
    /// list) read back: a texts file that is not the one its list of
    /// spans was written with is refused at opening, not found out when a
    /// search returns its words.
    pub fn check_sample(
        &self,
        spans: impl ExactSizeIterator<Item = Span>,
    ) -> Result<(), IndexError> {
        let step = spans.len().div_ceil(64).max(1);
        for span in spans.step_by(step) {
            self.with_record(span, |record| parse(record).map(drop))
                .map_err(|_| {
                    IndexError::Snapshot(
                        "the texts file is not the one its chunks were saved with".into(),
                    )
                })?;
        }
        Ok(())
    }

    /// Writes the records, in order, and answers where each went.
    pub fn append<'a>(
        &self,
        records: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<Vec<Span>, IndexError> {
        let mut buf = Vec::new();
        let mut lens = Vec::new();
        for (section, text) in records {
            lens.push(encode(&mut buf, section, text)?);
        }
        let mut held = self.write();
        let start = match &mut held.sink {
            Sink::Memory(v) => {
                // Grown by a quarter, not doubled: what a compaction
                // bounds is not then twice over in spare capacity.
                if v.capacity() - v.len() < buf.len() {
                    v.reserve_exact(buf.len().max(v.len() / 4));
                }
                let start = v.len() as u64;
                v.extend_from_slice(&buf);
                start
            }
            Sink::File { file, len } => {
                file.write_all_at(&buf, *len)?;
                let start = *len;
                *len += buf.len() as u64;
                start
            }
        };
        let mut at = start;
        Ok(lens
            .into_iter()
            .map(|len| {
                let span = Span { at, len };
                at += u64::from(len);
                span
            })
            .collect())
    }

    /// `f` of the record at `span`, read in place where it can be (the
    /// mapped snapshot file, the heap buffer under its lock), from the
    /// workspace file otherwise.
    fn with_record<R>(
        &self,
        span: Span,
        f: impl FnOnce(&[u8]) -> Result<R, IndexError>,
    ) -> Result<R, IndexError> {
        let len = span.len as usize;
        let held = self.read_held();
        if span.at & SAVED != 0 {
            let at = (span.at & !SAVED) as usize;
            let map = held
                .saved
                .as_ref()
                .ok_or_else(|| IndexError::Snapshot("no saved texts".into()))?;
            return f(&map.as_slice()[at..at + len]);
        }
        match &held.sink {
            Sink::Memory(v) => f(&v[span.at as usize..span.at as usize + len]),
            Sink::File { file, .. } => {
                let mut record = vec![0; len];
                file.read_exact_at(&mut record, span.at)?;
                f(&record)
            }
        }
    }

    /// Puts the record at `span` in `out` (cleared first), checked to be
    /// one: what a snapshot copies without decoding it into strings.
    pub fn copy(&self, span: Span, out: &mut Vec<u8>) -> Result<(), IndexError> {
        out.clear();
        self.with_record(span, |record| {
            parse(record)?;
            out.extend_from_slice(record);
            Ok(())
        })
    }

    /// The words at `span`.
    pub fn read(&self, span: Span) -> Result<Words, IndexError> {
        self.with_record(span, decode)
    }

    /// Heap bytes the records take (those of a collection in memory).
    pub fn memory_bytes(&self) -> usize {
        match &self.read_held().sink {
            Sink::Memory(v) => v.capacity(),
            Sink::File { .. } => 0,
        }
    }

    /// Bytes of the files the records are read from in place.
    pub fn file_bytes(&self) -> usize {
        let held = self.read_held();
        let written = match &held.sink {
            Sink::Memory(_) => 0,
            Sink::File { len, .. } => *len as usize,
        };
        written + held.saved.as_ref().map_or(0, OwnedBytes::len)
    }
}

/// A new records file at `path` (emptied if there was one), open to read
/// and write.
fn create(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

/// Writes a snapshot's texts file: the records given, in order, each
/// answered with the (offset, length) [`Texts::saved_span`] takes back.
pub(crate) struct Saving {
    out: BufWriter<File>,
    at: u64,
    path: PathBuf,
}

impl Saving {
    pub fn create(path: &Path) -> Result<Self, IndexError> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        out.write_all(MAGIC)?;
        Ok(Self {
            out,
            at: MAGIC.len() as u64,
            path: path.to_owned(),
        })
    }

    /// Writes one record ([`Texts::copy`] read and checked it).
    pub fn write(&mut self, record: &[u8]) -> Result<(u64, u32), IndexError> {
        let len = u32::try_from(record.len())
            .map_err(|_| IndexError::Snapshot("a chunk's text is over 4 GiB".into()))?;
        self.out.write_all(record)?;
        let at = self.at;
        self.at += u64::from(len);
        Ok((at, len))
    }

    /// Flushes what was written (the snapshot's save syncs it with the
    /// rest of its folder).
    pub fn finish(self) -> Result<PathBuf, IndexError> {
        self.out.into_inner().map_err(|e| e.into_error())?;
        Ok(self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_from_memory_a_file_and_a_snapshot() {
        let dir = tempfile::tempdir().expect("dir");
        for folder in [None, Some(dir.path().join("work"))] {
            let texts = Texts::new(folder.as_deref()).expect("texts");
            let spans = texts
                .append([("A › b", "first é"), ("", "second")].into_iter())
                .expect("append");
            let more = texts.append([("c", "third")].into_iter()).expect("append");
            let read = |s| texts.read(s).expect("read");
            assert_eq!(read(spans[0]).section, "A › b");
            assert_eq!(read(spans[0]).text, "first é");
            assert_eq!(read(spans[1]).text, "second");
            assert_eq!(read(more[0]).section, "c");
            assert_eq!(texts.memory_bytes() > 0, folder.is_none());

            let path = dir.path().join("chunks.texts");
            let mut saving = Saving::create(&path).expect("create");
            let mut at = Vec::new();
            let mut record = Vec::new();
            for s in [more[0], spans[0]] {
                texts.copy(s, &mut record).expect("copy");
                at.push(saving.write(&record).expect("write"));
            }
            saving.finish().expect("finish");
            let opened = Texts::open(&path, None).expect("open");
            let third = opened.saved_span(at[0].0, at[0].1).expect("span");
            assert_eq!(opened.read(third).expect("read").text, "third");
            let first = opened.saved_span(at[1].0, at[1].1).expect("span");
            assert_eq!(opened.read(first).expect("read").text, "first é");
            // A span past the file's end, or one that is not a record's,
            // is refused or read as damaged, never a panic.
            assert!(opened.saved_span(at[1].0, at[1].1 + 1).is_none());
            assert!(opened.saved_span(0, 12).is_none());
            let skewed = opened
                .saved_span(at[0].0 + 1, at[0].1 - 1)
                .expect("in the file");
            assert!(opened.read(skewed).is_err());
        }
        std::fs::write(dir.path().join("other"), b"not texts").expect("write");
        assert!(Texts::open(&dir.path().join("other"), None).is_err());
    }
}
