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
//! position) is the caller's to record.

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
/// file's path relative to `root` and its size in `files`.
pub(crate) fn sync_tree(
    root: &Path,
    dir: &Path,
    files: &mut BTreeMap<String, u64>,
) -> Result<(), IndexError> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            sync_tree(root, &path, files)?;
        } else {
            let file = std::fs::File::open(&path)?;
            file.sync_all()?;
            let rel = path.strip_prefix(root).map_err(std::io::Error::other)?;
            files.insert(rel.to_string_lossy().into_owned(), file.metadata()?.len());
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}
