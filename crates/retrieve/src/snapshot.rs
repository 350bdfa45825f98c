//! A collection's indexes saved to disk and loaded back, so a process
//! starts from them instead of rebuilding the HNSW graph and the BM25
//! segments from the store (at 100k chunks the graph alone is minutes of
//! inserts on two cores; loading its dump is a read).
//!
//! A snapshot folder holds `chunks.jsonl` (one line per document: its ids,
//! title, metadata and chunks' text), the graph as usearch saves it
//! (`dense.usearch`: the int8 vectors it walks and their links), the full-precision vectors (`dense.vectors`) and the
//! two tantivy indexes' files (`chunks-bm25/`, `documents-bm25/`). What it reflects of the store (the change-log
//! position) is the caller's to record.

use crate::{Chunk, IndexError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

/// One line of `chunks.jsonl`.
#[derive(Serialize, Deserialize)]
struct DocumentLine<'a> {
    document_id: i64,
    #[serde(borrow)]
    external_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    title: std::borrow::Cow<'a, str>,
    metadata: Value,
    chunks: Vec<ChunkLine<'a>>,
}

#[derive(Serialize, Deserialize)]
struct ChunkLine<'a> {
    chunk_id: i64,
    position: i32,
    #[serde(borrow)]
    section: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    text: std::borrow::Cow<'a, str>,
}

pub(crate) const CHUNKS_FILE: &str = "chunks.jsonl";
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

/// Writes the documents' chunks, one line per document.
pub(crate) fn write_chunks<'a>(
    path: &Path,
    documents: impl Iterator<Item = (i64, Vec<&'a Arc<Chunk>>)>,
) -> Result<Saved, IndexError> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut saved = Saved {
        chunks: 0,
        documents: 0,
        files: BTreeMap::new(),
    };
    for (document_id, chunks) in documents {
        let Some(first) = chunks.first() else {
            continue;
        };
        let line = DocumentLine {
            document_id,
            external_id: first.external_id.as_str().into(),
            title: first.title.as_str().into(),
            metadata: (*first.metadata).clone(),
            chunks: chunks
                .iter()
                .map(|c| ChunkLine {
                    chunk_id: c.chunk_id,
                    position: c.position,
                    section: c.section.as_str().into(),
                    text: c.text.as_str().into(),
                })
                .collect(),
        };
        serde_json::to_writer(&mut out, &line).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        saved.chunks += chunks.len();
        saved.documents += 1;
    }
    // Flushed to disk with the rest of the folder (`sync_tree`).
    out.into_inner().map_err(|e| e.into_error())?;
    Ok(saved)
}

/// Reads the chunks [`write_chunks`] wrote, calling `each` with every
/// document's chunks.
pub(crate) fn read_chunks(path: &Path, mut each: impl FnMut(Vec<Chunk>)) -> Result<(), IndexError> {
    let file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    for (n, line) in file.lines().enumerate() {
        let line = line?;
        let d: DocumentLine = serde_json::from_str(&line)
            .map_err(|e| IndexError::Snapshot(format!("{} line {}: {e}", path.display(), n + 1)))?;
        let metadata = Arc::new(d.metadata);
        each(
            d.chunks
                .into_iter()
                .map(|c| Chunk {
                    chunk_id: c.chunk_id,
                    document_id: d.document_id,
                    external_id: d.external_id.clone().into_owned(),
                    position: c.position,
                    title: d.title.clone().into_owned(),
                    section: c.section.into_owned(),
                    metadata: metadata.clone(),
                    text: c.text.into_owned(),
                })
                .collect(),
        );
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
