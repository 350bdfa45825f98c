//! BM25 with tantivy (English stemming) over entries with a title, a
//! section path and a text: one index holds a collection's chunks, another
//! its whole documents.
//!
//! An index lives in memory or, given a folder, on disk: tantivy's own
//! `MmapDirectory`, so its postings sit in the page cache (which the
//! kernel gives back under pressure), not the heap. A folder is this
//! process's scratch space, never read by another run: the store is the
//! durable record, a snapshot the saved copy. Saving hard-links the
//! committed files into the snapshot (tantivy never rewrites a segment
//! file, and replaces `meta.json` by a rename, so the link keeps the
//! committed state); opening links a snapshot's files into a new folder.
//! One copy on disk either way.

use crate::IndexError;
use ragtime_core::Cancel;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::columnar::Column;
use tantivy::directory::error::OpenReadError;
use tantivy::directory::{Directory, MmapDirectory, RamDirectory};
use tantivy::indexer::IndexWriterOptions;
use tantivy::query::QueryParser;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::{
    DocAddress, DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, SegmentOrdinal,
    SegmentReader, Term, doc,
};

/// Weights of a match in the title and in the section path against one in
/// the text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Boosts {
    pub title: f32,
    pub section: f32,
}

impl Boosts {
    /// Chunks: section words belong to every chunk of a section, so at full
    /// weight they outrank the chunk that states the answer (answers
    /// benchmark: 0.83 of answers in the top 5 at 1.0, 0.89 at 0.3).
    pub const CHUNKS: Self = Self {
        title: 1.0,
        section: 0.3,
    };
    /// Whole documents: the title boost chosen on the SciFact train queries
    /// (`ragtime-bench fusion`).
    pub const DOCUMENTS: Self = Self {
        title: 0.4,
        section: 0.3,
    };
}

/// What BM25 ranks documents by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LexicalUnit {
    /// Whole documents (title, section paths, text as fields).
    Documents,
    /// Their chunks: a document ranks by its best chunk.
    Chunks,
    /// Whole documents where a collection's documents are short (at most
    /// [`AUTO_MAX_CHUNKS`] chunks on average), chunks where they are long:
    /// BM25 over a long, many-topic document dilutes the part that
    /// answers (SciFact's abstracts, 3.6 chunks each: documents 0.679
    /// against chunks 0.642; the Rust Reference's pages: answer in the top
    /// 5 0.80 by documents, 0.84 by chunks).
    #[default]
    Auto,
}

/// [`LexicalUnit::Auto`]'s line between short and long documents.
pub const AUTO_MAX_CHUNKS: usize = 8;

/// What one index entry holds.
pub struct Entry<'a> {
    pub id: u64,
    pub title: &'a str,
    pub section: &'a str,
    pub text: &'a str,
}

/// Memory an index write may buffer before it flushes a segment.
const WRITE_BUDGET_BYTES: usize = 32_000_000;

/// The tantivy index and its reader, made at the collection's first write:
/// an empty collection holds none (an in-RAM index with its reader costs
/// memory whether or not it holds anything).
struct Built {
    index: Index,
    reader: IndexReader,
}

pub struct Lexical {
    schema: Schema,
    built: std::sync::OnceLock<Built>,
    /// Where the index lives on disk (`None`: in memory).
    folder: Option<PathBuf>,
    /// One write at a time. There is no writer between writes: a tantivy
    /// `IndexWriter` keeps an indexing thread, a segment updater and merge
    /// threads alive, six threads per collection for as long as it is open,
    /// so an idle collection would cost threads for ever. A write opens one
    /// (one indexing, one merge thread), commits, waits for its merges and
    /// closes it; the reader holds no threads (manual reload).
    writing: Mutex<()>,
    id: Field,
    title: Field,
    section: Field,
    text: Field,
}

impl Lexical {
    /// An empty index in `folder` (made at the first write; in memory when
    /// `None`).
    pub fn new_in(folder: Option<PathBuf>) -> Result<Self, IndexError> {
        let mut schema = Schema::builder();
        let stemmed = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let id = schema.add_u64_field("id", INDEXED | FAST);
        let title = schema.add_text_field("title", stemmed.clone());
        let section = schema.add_text_field("section", stemmed.clone());
        let text = schema.add_text_field("text", stemmed);
        Ok(Self {
            schema: schema.build(),
            built: std::sync::OnceLock::new(),
            folder,
            writing: Mutex::new(()),
            id,
            title,
            section,
            text,
        })
    }

    /// Opens a writer, lets `f` fill it, commits, waits for the merges the
    /// commit started, closes it and makes the change searchable.
    fn write(
        &self,
        f: impl FnOnce(&mut IndexWriter) -> tantivy::Result<()>,
    ) -> Result<(), IndexError> {
        let _one = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let built = match self.built.get() {
            Some(b) => b,
            None => {
                let index = match &self.folder {
                    None => Index::create_in_ram(self.schema.clone()),
                    Some(folder) => Index::create(
                        open_folder(folder)?,
                        self.schema.clone(),
                        Default::default(),
                    )?,
                };
                let reader = index
                    .reader_builder()
                    .reload_policy(ReloadPolicy::Manual)
                    .try_into()?;
                self.built.get_or_init(|| Built { index, reader })
            }
        };
        let options = IndexWriterOptions::builder()
            .num_worker_threads(1)
            .num_merge_threads(1)
            .memory_budget_per_thread(WRITE_BUDGET_BYTES)
            .build();
        let mut w: IndexWriter = built.index.writer_with_options(options)?;
        f(&mut w)?;
        w.commit()?;
        w.wait_merging_threads()?;
        built.reader.reload()?;
        Ok(())
    }

    /// Puts the index's committed files (its segments, `meta.json` and the
    /// list of the files it manages) into `dir`, which exists and is
    /// empty: hard links to an index on disk, copies of one in memory.
    /// Nothing is written for an index never written to.
    pub fn save(&self, dir: &Path) -> Result<(), IndexError> {
        let _one = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(built) = self.built.get() else {
            return Ok(());
        };
        let directory = built.index.directory();
        let mut files = directory.list_managed_files();
        files.insert(PathBuf::from("meta.json"));
        files.insert(PathBuf::from(".managed.json"));
        for file in files {
            if let Some(folder) = &self.folder {
                let from = folder.join(&file);
                if !from.exists() {
                    // Listed but already merged away.
                    continue;
                }
                link_or_copy(&from, &dir.join(&file))?;
                continue;
            }
            match directory.atomic_read(&file) {
                Ok(bytes) => std::fs::write(dir.join(&file), bytes)?,
                // Listed but already merged away.
                Err(OpenReadError::FileDoesNotExist(_)) => {}
                Err(e) => return Err(tantivy::TantivyError::from(e).into()),
            }
        }
        Ok(())
    }

    /// An index from the files [`Lexical::save`] wrote into `dir`: linked
    /// into `folder` and read from there in place, or read into memory
    /// when `folder` is `None` (an empty index when `dir` holds none).
    pub fn load(dir: &Path, folder: Option<PathBuf>) -> Result<Self, IndexError> {
        let me = Self::new_in(folder)?;
        if !dir.join("meta.json").is_file() {
            return Ok(me);
        }
        let directory: Box<dyn Directory> = match &me.folder {
            Some(folder) => Box::new(open_folder(folder)?),
            None => Box::new(RamDirectory::create()),
        };
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            match &me.folder {
                Some(folder) => link_or_copy(&entry.path(), &folder.join(entry.file_name()))?,
                None => directory
                    .atomic_write(Path::new(&entry.file_name()), &std::fs::read(entry.path())?)?,
            }
        }
        let index = Index::open(directory)?;
        if index.schema() != me.schema {
            return Err(IndexError::Snapshot(format!(
                "{}: the saved index has another schema",
                dir.display()
            )));
        }
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let _ = me.built.set(Built { index, reader });
        Ok(me)
    }

    /// The bytes the index's segments take (0 before the first write).
    fn segment_bytes(&self) -> usize {
        self.built.get().map_or(0, |b| {
            b.reader
                .searcher()
                .space_usage()
                .map_or(0, |u| u.total().get_bytes() as usize)
        })
    }

    /// The bytes of the index held in this process's heap (an index in
    /// memory: all of it).
    pub fn memory_bytes(&self) -> usize {
        if self.folder.is_some() {
            0
        } else {
            self.segment_bytes()
        }
    }

    /// The bytes of the index read in place from its files (an index on
    /// disk: all of it).
    pub fn mapped_bytes(&self) -> usize {
        if self.folder.is_some() {
            self.segment_bytes()
        } else {
            0
        }
    }

    /// Removes the entries `remove` names and adds `add`, in one commit.
    pub fn replace<'a>(
        &self,
        remove: &[u64],
        add: impl Iterator<Item = Entry<'a>>,
    ) -> Result<(), IndexError> {
        let mut add = add.peekable();
        if add.peek().is_none() && (remove.is_empty() || self.built.get().is_none()) {
            return Ok(());
        }
        self.write(|w| {
            for id in remove {
                w.delete_term(Term::from_field_u64(self.id, *id));
            }
            for e in add {
                w.add_document(doc!(
                    self.id => e.id,
                    self.title => e.title,
                    self.section => e.section,
                    self.text => e.text,
                ))?;
            }
            Ok(())
        })
    }

    /// The `k` best entries for `query` (ids and BM25 scores) among the
    /// allowed ones (all when `None`; else sorted ids). Once `cancel` fires
    /// (its deadline passes) it stops collecting — checked before each
    /// index segment and every few thousand matches — and returns the best
    /// of what it had.
    pub fn search(
        &self,
        query: &str,
        k: usize,
        allowed: Option<&Arc<Vec<usize>>>,
        boosts: Boosts,
        cancel: &Cancel,
    ) -> Result<Vec<(u64, f32)>, IndexError> {
        let Some(built) = self.built.get() else {
            return Ok(Vec::new());
        };
        if k == 0 || query.trim().is_empty() || cancel.is_cancelled() {
            return Ok(Vec::new());
        }
        let mut parser =
            QueryParser::for_index(&built.index, vec![self.title, self.section, self.text]);
        parser.set_field_boost(self.title, boosts.title);
        parser.set_field_boost(self.section, boosts.section);
        // Lenient: user text is not query syntax; what cannot parse is dropped.
        let (q, _errors) = parser.parse_query_lenient(query);
        let searcher = built.reader.searcher();
        Ok(searcher.search(
            &q,
            &TopScored {
                k,
                allowed: allowed.cloned(),
                cancel: cancel.clone(),
                floor: Mutex::new(Score::NEG_INFINITY),
            },
        )?)
    }
}

/// The tantivy directory on disk at `folder` (made if missing).
fn open_folder(folder: &Path) -> Result<MmapDirectory, IndexError> {
    std::fs::create_dir_all(folder)?;
    Ok(MmapDirectory::open(folder).map_err(tantivy::TantivyError::from)?)
}

/// Hard-links `from` at `to`, or copies it where a link cannot be made
/// (another file system).
fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::hard_link(from, to).or_else(|_| std::fs::copy(from, to).map(drop))
}

/// The `k` best-scoring documents of a search, as (id, score), among the
/// allowed ids (sorted; all when `None`), until `cancel` fires. Ids come
/// from the `id` fast field (a column read, opened once per segment for
/// the filter and the hits alike), not the stored document (a block
/// decompressed per hit).
///
/// Written here rather than wrapping tantivy's `TopDocs` because a wrapper
/// loses what makes a top-k search fast: `TopDocs` walks a segment with
/// `for_each_pruning` (block-max WAND: blocks of postings that cannot beat
/// the k-th best score are skipped), and any other collector is fed every
/// match. A query of common words matches most of a large collection, so
/// the wrapped search scored every chunk of it. This one prunes too, and
/// keeps what the wrapper did: the filter (a document that is not allowed
/// leaves the threshold as it was) and the cancel flag (looked at before
/// each segment and every few hundred documents scored; once it fires the
/// threshold becomes infinite, which ends the walk).
///
/// The segments share one threshold: BM25's statistics are the whole
/// index's, so scores compare across segments, and a segment's walk starts
/// from the k-th best score of those walked before it ([`TopScored::floor`])
/// instead of from nothing. An index built in bulk holds a dozen segments
/// at a million chunks; a query of common words otherwise fills a fresh
/// top k in each of them before it can skip a block.
struct TopScored {
    k: usize,
    allowed: Option<Arc<Vec<usize>>>,
    cancel: Cancel,
    /// The k-th best score of any one segment walked so far (once it had
    /// k allowed documents): the global k best all score at least this,
    /// so a later segment skips what does not beat it. A document that
    /// only ties it would rank below the k earlier ones anyway (ties go in
    /// document order), so the result is the same as without — given that
    /// segments are walked in order, which tantivy's default (one-thread)
    /// search executor does; the indexes here never set another.
    floor: Mutex<Score>,
}

/// Documents scored between two looks at the cancel flag.
const CHECK_EVERY: u32 = 256;

/// A segment's best documents so far: the worst of them on top.
struct SegmentTop {
    k: usize,
    /// (score, doc): the heap's top is the lowest score, and among equal
    /// scores the highest doc id (a later document does not displace an
    /// earlier one of the same score).
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(Scored, std::cmp::Reverse<DocId>)>>,
    ord: SegmentOrdinal,
    ids: Column<u64>,
    allowed: Option<Arc<Vec<usize>>>,
    alive: Option<tantivy::fastfield::AliveBitSet>,
    cancel: Cancel,
    seen: u32,
    stopped: bool,
    /// The score to beat before this segment's own top k is full.
    floor: Score,
}

/// A score ordered totally (tantivy's scores are finite).
#[derive(Clone, Copy, PartialEq)]
struct Scored(Score);

impl Eq for Scored {}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl SegmentTop {
    /// The score a document must beat from now on.
    fn threshold(&self) -> Score {
        if self.stopped {
            return Score::INFINITY;
        }
        match self.heap.peek() {
            Some(std::cmp::Reverse((Scored(s), _))) if self.heap.len() >= self.k => {
                s.max(self.floor)
            }
            _ => self.floor,
        }
    }

    /// Takes `doc` if it is alive, allowed and among the best; answers the
    /// threshold from now on.
    fn offer(&mut self, doc: DocId, score: Score) -> Score {
        if self.stopped {
            return Score::INFINITY;
        }
        self.seen += 1;
        if self.seen.is_multiple_of(CHECK_EVERY) && self.cancel.is_cancelled() {
            self.stopped = true;
            return Score::INFINITY;
        }
        let alive = self.alive.as_ref().is_none_or(|a| a.is_alive(doc));
        let allowed = self.allowed.as_ref().is_none_or(|set| {
            self.ids
                .first(doc)
                .is_some_and(|id| set.binary_search(&(id as usize)).is_ok())
        });
        if alive && allowed && score > self.floor {
            let entry = std::cmp::Reverse((Scored(score), std::cmp::Reverse(doc)));
            if self.heap.len() < self.k {
                self.heap.push(entry);
            } else if self.heap.peek().is_some_and(|worst| entry < *worst) {
                self.heap.pop();
                self.heap.push(entry);
            }
        }
        self.threshold()
    }
}

impl SegmentCollector for SegmentTop {
    /// (score, address, id) of the segment's best.
    type Fruit = Vec<(Score, DocAddress, Option<u64>)>;

    fn collect(&mut self, doc: DocId, score: Score) {
        self.offer(doc, score);
    }

    fn harvest(self) -> Self::Fruit {
        let ord = self.ord;
        self.heap
            .into_iter()
            .map(|std::cmp::Reverse((Scored(s), std::cmp::Reverse(doc)))| {
                (s, DocAddress::new(ord, doc), self.ids.first(doc))
            })
            .collect()
    }
}

impl Collector for TopScored {
    type Fruit = Vec<(u64, Score)>;
    type Child = SegmentTop;

    fn for_segment(
        &self,
        ord: SegmentOrdinal,
        reader: &SegmentReader,
    ) -> tantivy::Result<SegmentTop> {
        Ok(SegmentTop {
            k: self.k,
            heap: std::collections::BinaryHeap::with_capacity(self.k.min(1024) + 1),
            ord,
            ids: reader.fast_fields().u64("id")?,
            allowed: self.allowed.clone(),
            alive: reader.alive_bitset().cloned(),
            cancel: self.cancel.clone(),
            seen: 0,
            stopped: self.cancel.is_cancelled(),
            floor: *self.floor.lock().unwrap_or_else(PoisonError::into_inner),
        })
    }

    fn requires_scoring(&self) -> bool {
        true
    }

    fn collect_segment(
        &self,
        weight: &dyn tantivy::query::Weight,
        ord: SegmentOrdinal,
        reader: &SegmentReader,
    ) -> tantivy::Result<Vec<(Score, DocAddress, Option<u64>)>> {
        let mut top = self.for_segment(ord, reader)?;
        if !top.stopped && self.k > 0 {
            weight.for_each_pruning(top.floor, reader, &mut |doc, score| top.offer(doc, score))?;
        }
        if !top.stopped && top.heap.len() >= self.k {
            let mut floor = self.floor.lock().unwrap_or_else(PoisonError::into_inner);
            *floor = floor.max(top.threshold());
        }
        Ok(top.harvest())
    }

    /// The best `k` of every segment's, best first; equal scores in
    /// document order.
    fn merge_fruits(
        &self,
        fruits: Vec<Vec<(Score, DocAddress, Option<u64>)>>,
    ) -> tantivy::Result<Self::Fruit> {
        let mut all: Vec<(Score, DocAddress, Option<u64>)> = fruits.into_iter().flatten().collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(all
            .into_iter()
            .take(self.k)
            .filter_map(|(score, _, id)| Some((id?, score)))
            .collect())
    }
}
