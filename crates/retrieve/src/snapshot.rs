//! A collection's indexes saved to disk and loaded back, so a process
//! starts from them instead of rebuilding the HNSW graph and the BM25
//! segments from the store (at 100k chunks the graph alone is minutes of
//! inserts on two cores; loading its dump is a read).
//!
//! A snapshot folder holds `chunks.jsonl` (one line per document: its ids,
//! title, metadata and where its chunks' words are), `chunks.texts` (those
//! words, read in place once opened), the graph as usearch saves it
//! (`dense.usearch`: the int8 vectors it walks and their links), the full-precision vectors (`dense.vectors`) and the
//! two tantivy indexes' files (`chunks-bm25/`, `documents-bm25/`). What it reflects of the store (the change-log
//! position) is the caller's to record, with each file's size and CRC-32
//! ([`Saved`]): a loader walks the graph's links and the records' offsets
//! as they are, so a damaged file must be found by [`verify_files`] before one
//! is opened, not by what it does to the process.

use crate::IndexError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

/// One line of `chunks.jsonl`: a document and where its chunks' words are
/// in `chunks.texts`.
#[derive(Serialize, Deserialize)]
pub(crate) struct DocumentLine {
    pub document_id: i64,
    pub external_id: String,
    pub title: String,
    pub metadata: Value,
    pub chunks: Vec<ChunkLine>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ChunkLine {
    pub chunk_id: i64,
    pub position: i32,
    /// The chunk's record in `chunks.texts`: offset and length.
    pub at: u64,
    pub len: u32,
}

pub(crate) const CHUNKS_FILE: &str = "chunks.jsonl";
pub(crate) const TEXTS_FILE: &str = "chunks.texts";
pub(crate) const CHUNKS_BM25: &str = "chunks-bm25";
pub(crate) const DOCUMENTS_BM25: &str = "documents-bm25";

/// What a saved collection holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub chunks: usize,
    pub documents: usize,
    /// Every file written, by its path in the folder, and its size.
    pub files: BTreeMap<String, u64>,
    /// Every file's CRC-32 (IEEE), by its path in the folder.
    pub crc32: BTreeMap<String, u32>,
}

/// Writes the documents, one line each.
pub(crate) fn write_chunks(
    path: &Path,
    documents: impl Iterator<Item = Result<DocumentLine, IndexError>>,
) -> Result<Saved, IndexError> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut saved = Saved {
        chunks: 0,
        documents: 0,
        files: BTreeMap::new(),
        crc32: BTreeMap::new(),
    };
    for line in documents {
        let line = line?;
        if line.chunks.is_empty() {
            continue;
        }
        serde_json::to_writer(&mut out, &line).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        saved.chunks += line.chunks.len();
        saved.documents += 1;
    }
    // Flushed to disk with the rest of the folder (`sync_tree`).
    out.into_inner().map_err(|e| e.into_error())?;
    Ok(saved)
}

/// Reads the documents [`write_chunks`] wrote, calling `each` with every
/// one.
pub(crate) fn read_chunks(
    path: &Path,
    mut each: impl FnMut(DocumentLine) -> Result<(), IndexError>,
) -> Result<(), IndexError> {
    let file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    for (n, line) in file.lines().enumerate() {
        let line = line?;
        let d: DocumentLine = serde_json::from_str(&line)
            .map_err(|e| IndexError::Snapshot(format!("{} line {}: {e}", path.display(), n + 1)))?;
        each(d)?;
    }
    Ok(())
}

/// Flushes every file under `dir` (and the folders) to disk, listing each
/// file's path relative to `root`, its size and its CRC-32 in `saved`.
pub(crate) fn sync_tree(root: &Path, dir: &Path, saved: &mut Saved) -> Result<(), IndexError> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            sync_tree(root, &path, saved)?;
        } else {
            let mut file = std::fs::File::open(&path)?;
            file.sync_all()?;
            let rel = path.strip_prefix(root).map_err(std::io::Error::other)?;
            let rel = rel.to_string_lossy().into_owned();
            saved.crc32.insert(rel.clone(), crc32(&mut file)?);
            saved.files.insert(rel, file.metadata()?.len());
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// A file's CRC-32 (IEEE), read from its start.
fn crc32(file: &mut std::fs::File) -> std::io::Result<u32> {
    use std::io::Read;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Checks that every file a snapshot's record lists is in `dir` with the
/// size and, where recorded, the CRC-32 [`Saved`] gave it (sizes first,
/// all of them, so a short file is found without reading the rest). The
/// error names the first file that differs.
pub fn verify_files(
    dir: &Path,
    sizes: &BTreeMap<String, u64>,
    crc32s: &BTreeMap<String, u32>,
) -> Result<(), String> {
    for (name, size) in sizes {
        match std::fs::metadata(dir.join(name)) {
            Ok(m) if m.len() == *size => {}
            Ok(m) => {
                return Err(format!(
                    "{name} has {} bytes, its record says {size}",
                    m.len()
                ));
            }
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    for (name, want) in crc32s {
        let got = std::fs::File::open(dir.join(name))
            .and_then(|mut f| crc32(&mut f))
            .map_err(|e| format!("{name}: {e}"))?;
        if got != *want {
            return Err(format!(
                "{name} reads as CRC-32 {got:08x}, its record says {want:08x}: the file is damaged"
            ));
        }
    }
    Ok(())
}
