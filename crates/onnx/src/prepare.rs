//! Prepare once: the rewritten graphs are written beside the model, keyed
//! by its checksum, and later starts load them instead of rewriting.
//!
//! Rewriting means decoding the whole model, matching and re-encoding it
//! twice (the simplified fp32 graph for queries, and its int8 variant for
//! passages): about 25 ms in a release build, against about 18 ms to read
//! and checksum the model and find its prepared files (most of a load,
//! about 300 ms, is ONNX Runtime optimising the two sessions, either way;
//! see `cargo run --release -p ragtime-embed --example load_time`). That
//! work depends only on the model's bytes, so it is done once per model:
//! [`prepare`] writes, for `dir/model.onnx` with SHA-256 `h`,
//!
//! - `dir/model.<h[..16]>.query.onnx`: [`simplify`](crate::simplify)d;
//! - `dir/model.<h[..16]>.passage-int8.onnx`: simplified, then
//!   [`int8_matmuls`](crate::int8_matmuls) (only when the model has int8
//!   weights);
//! - `dir/model.<h[..16]>.prepared.json`: the full checksum, what the
//!   rewrites did and the sizes of the two graphs, written last. It is what
//!   makes the graphs count as prepared: a later call finds it, checks the
//!   checksum, the [`FORMAT`] and the sizes, and returns the files without
//!   decoding anything.
//!
//! Every file is written to a temporary file in the same folder, synced
//! and renamed into place, so a concurrent process sees either no file or
//! a whole one; two processes preparing at once write the same bytes. A
//! changed model has another checksum, hence new files; the files of other
//! checksums of the same model are then removed. [`load_or_prepare`] (what
//! the embedder uses) falls back to preparing in memory when the folder
//! cannot be written.

use crate::decode_model;
use crate::graph::GraphError;
use crate::session::{LoadError, load_session, load_session_from_memory};
use crate::simplify::Simplified;
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The version of the rewrites: prepared files of another version are
/// prepared again. Bump it when a rewrite changes what it writes.
pub const FORMAT: u32 = 1;

/// Hex digits of the checksum in the prepared files' names.
const KEY_LEN: usize = 16;

const QUERY: &str = "query.onnx";
const PASSAGE: &str = "passage-int8.onnx";
const MANIFEST: &str = "prepared.json";

#[derive(Debug, Error)]
pub enum PrepareError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not an ONNX model: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{path}: {source}")]
    Graph {
        path: PathBuf,
        #[source]
        source: GraphError,
    },
}

/// How [`prepare`] or [`load_or_prepare`] got the graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Prepared files for this checksum were there already.
    Reused,
    /// Rewritten now and written beside the model.
    Written,
    /// Rewritten now and held in memory: the folder is not writable.
    InMemory,
}

/// One prepared graph: a file beside the model, or bytes in memory.
#[derive(Debug, Clone)]
pub enum PreparedGraph {
    File(PathBuf),
    /// `path` is where the file would be (it names the graph in errors).
    Memory {
        path: PathBuf,
        bytes: Vec<u8>,
    },
}

impl PreparedGraph {
    /// The file, or the name it would have.
    pub fn path(&self) -> &Path {
        match self {
            Self::File(path) | Self::Memory { path, .. } => path,
        }
    }

    /// An optimised ONNX Runtime session of this graph.
    pub fn session(
        &self,
        ort_lib: &Path,
        intra_threads: usize,
    ) -> Result<ort::session::Session, LoadError> {
        match self {
            Self::File(path) => load_session(ort_lib, path, intra_threads),
            Self::Memory { path, bytes } => {
                load_session_from_memory(ort_lib, path, bytes, intra_threads)
            }
        }
    }
}

/// The prepared graphs of a model and what the rewrites did.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The original model.
    pub source: PathBuf,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// The simplified fp32 graph (queries).
    pub query: PreparedGraph,
    /// The simplified graph with int8 matrix products (passages); `None`
    /// when the model has no int8 weights to compute with.
    pub passage_int8: Option<PreparedGraph>,
    pub simplified: Simplified,
    /// Matrix products rewritten to int8 compute.
    pub int8_products: usize,
    pub outcome: Outcome,
}

/// What is written beside the prepared graphs, last.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    source_sha256: String,
    simplified: Simplified,
    int8_products: usize,
    query_bytes: u64,
    passage_int8_bytes: Option<u64>,
}

/// The names of a model's prepared files for one checksum.
struct Names {
    query: PathBuf,
    passage: PathBuf,
    manifest: PathBuf,
}

/// The folder of `path` (`.` for a bare file name).
fn folder(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The model's file name without `.onnx`.
fn stem(model: &Path) -> String {
    model
        .file_stem()
        .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned())
}

fn names(model: &Path, sha256: &str) -> Names {
    let key = &sha256[..KEY_LEN.min(sha256.len())];
    let name = |suffix: &str| folder(model).join(format!("{}.{key}.{suffix}", stem(model)));
    Names {
        query: name(QUERY),
        passage: name(PASSAGE),
        manifest: name(MANIFEST),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PrepareError + '_ {
    move |source| PrepareError::Io {
        path: path.to_owned(),
        source,
    }
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The graphs rewritten in memory.
struct Rewritten {
    query: Vec<u8>,
    passage: Option<Vec<u8>>,
    simplified: Simplified,
    int8_products: usize,
}

fn rewrite(model: &Path, bytes: Vec<u8>) -> Result<Rewritten, PrepareError> {
    let mut graph = decode_model(bytes.into()).map_err(|source| PrepareError::Decode {
        path: model.to_owned(),
        source,
    })?;
    let graph_err = |source| PrepareError::Graph {
        path: model.to_owned(),
        source,
    };
    let simplified = crate::simplify(&mut graph).map_err(graph_err)?;
    let query = graph.encode_to_vec();
    let int8_products = crate::int8_matmuls(&mut graph).map_err(graph_err)?;
    let passage = (int8_products > 0).then(|| graph.encode_to_vec());
    Ok(Rewritten {
        query,
        passage,
        simplified,
        int8_products,
    })
}

/// The manifest at `names`, when it says the graphs there are complete
/// and prepared from `sha256` by this version.
fn prepared_before(names: &Names, sha256: &str) -> Option<Manifest> {
    let text = std::fs::read(&names.manifest).ok()?;
    let m: Manifest = serde_json::from_slice(&text).ok()?;
    let size = |p: &Path| std::fs::metadata(p).ok().map(|m| m.len());
    let complete = m.format == FORMAT
        && m.source_sha256 == sha256
        && size(&names.query) == Some(m.query_bytes)
        && m.passage_int8_bytes
            .is_none_or(|n| size(&names.passage) == Some(n));
    if !complete {
        tracing::debug!(manifest = %names.manifest.display(), "prepared files out of date");
    }
    complete.then_some(m)
}

/// Writes `bytes` to `path` through a synced temporary file in the same
/// folder, renamed into place; `like` gives the file its permissions.
fn write_atomic(path: &Path, bytes: &[u8], like: &std::fs::Permissions) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".ragtime-prepare-")
        .suffix(".tmp")
        .permissions(like.clone())
        .tempfile_in(folder(path))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Writes the rewritten graphs and, last, their manifest.
fn write(model: &Path, names: &Names, sha256: &str, r: &Rewritten) -> Result<(), PrepareError> {
    let like = std::fs::metadata(model)
        .map_err(io_err(model))?
        .permissions();
    write_atomic(&names.query, &r.query, &like).map_err(io_err(&names.query))?;
    match &r.passage {
        Some(p) => write_atomic(&names.passage, p, &like).map_err(io_err(&names.passage))?,
        None => match std::fs::remove_file(&names.passage) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err(&names.passage)(e));
            }
            _ => {}
        },
    }
    let manifest = Manifest {
        format: FORMAT,
        source_sha256: sha256.to_owned(),
        simplified: r.simplified,
        int8_products: r.int8_products,
        query_bytes: r.query.len() as u64,
        passage_int8_bytes: r.passage.as_ref().map(|p| p.len() as u64),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| PrepareError::Io {
        path: names.manifest.clone(),
        source: e.into(),
    })?;
    write_atomic(&names.manifest, &json, &like).map_err(io_err(&names.manifest))
}

/// Removes the prepared files of `model` for other checksums (best effort:
/// a failure is logged).
fn remove_stale(model: &Path, sha256: &str) {
    let Ok(entries) = std::fs::read_dir(folder(model)) else {
        return;
    };
    let prefix = format!("{}.", stem(model));
    let ours = &sha256[..KEY_LEN.min(sha256.len())];
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((key, suffix)) = rest.split_once('.') else {
            continue;
        };
        let ours_or_not_a_key =
            key == ours || key.len() != KEY_LEN || !key.bytes().all(|b| b.is_ascii_hexdigit());
        if ours_or_not_a_key || ![QUERY, PASSAGE, MANIFEST].contains(&suffix) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => {
                tracing::info!(file = %entry.path().display(), "removed a stale prepared graph")
            }
            Err(e) => {
                tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove a stale prepared graph")
            }
        }
    }
}

/// What to do when the prepared graphs cannot be written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// Write them, or fail.
    Files,
    /// Write them, or keep them in memory with a warning.
    FilesOrMemory,
    /// Keep them in memory.
    Memory,
}

fn run(model: &Path, store: Store) -> Result<Prepared, PrepareError> {
    let bytes = std::fs::read(model).map_err(io_err(model))?;
    let sha256 = sha256_hex(&bytes);
    let names = names(model, &sha256);
    let files = |passage: bool| {
        let query = PreparedGraph::File(names.query.clone());
        (
            query,
            passage.then(|| PreparedGraph::File(names.passage.clone())),
        )
    };
    if store != Store::Memory
        && let Some(m) = prepared_before(&names, &sha256)
    {
        let (query, passage_int8) = files(m.passage_int8_bytes.is_some());
        return Ok(Prepared {
            source: model.to_owned(),
            sha256,
            query,
            passage_int8,
            simplified: m.simplified,
            int8_products: m.int8_products,
            outcome: Outcome::Reused,
        });
    }
    let r = rewrite(model, bytes)?;
    let written = match store {
        Store::Memory => false,
        Store::Files => {
            write(model, &names, &sha256, &r)?;
            true
        }
        Store::FilesOrMemory => match write(model, &names, &sha256, &r) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the prepared graphs beside the model: preparing them in memory at every start");
                false
            }
        },
    };
    let (query, passage_int8, outcome) = if written {
        tracing::info!(
            query = %names.query.display(),
            int8_products = r.int8_products,
            "prepared graphs written"
        );
        remove_stale(model, &sha256);
        let (query, passage) = files(r.passage.is_some());
        (query, passage, Outcome::Written)
    } else {
        let query = PreparedGraph::Memory {
            path: names.query.clone(),
            bytes: r.query,
        };
        let passage = r.passage.map(|bytes| PreparedGraph::Memory {
            path: names.passage.clone(),
            bytes,
        });
        (query, passage, Outcome::InMemory)
    };
    Ok(Prepared {
        source: model.to_owned(),
        sha256,
        query,
        passage_int8,
        simplified: r.simplified,
        int8_products: r.int8_products,
        outcome,
    })
}

/// Prepares `model` (an `.onnx` file) once: returns the prepared files
/// when they are there for its checksum, and otherwise rewrites it and
/// writes them beside it. Fails when they cannot be written.
pub fn prepare(model: &Path) -> Result<Prepared, PrepareError> {
    run(model, Store::Files)
}

/// As [`prepare`], but when the folder cannot be written the graphs are
/// prepared in memory (with a warning) instead of failing.
pub fn load_or_prepare(model: &Path) -> Result<Prepared, PrepareError> {
    run(model, Store::FilesOrMemory)
}

/// Rewrites `model` in memory, neither reading nor writing prepared files.
pub fn prepare_in_memory(model: &Path) -> Result<Prepared, PrepareError> {
    run(model, Store::Memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ModelProto;

    #[test]
    fn names_are_keyed_by_the_checksum_beside_the_model() {
        let sha = sha256_hex(b"abc");
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let n = names(Path::new("/m/model.onnx"), &sha);
        assert_eq!(n.query, Path::new("/m/model.ba7816bf8f01cfea.query.onnx"));
        assert_eq!(
            n.passage,
            Path::new("/m/model.ba7816bf8f01cfea.passage-int8.onnx")
        );
        assert_eq!(
            n.manifest,
            Path::new("/m/model.ba7816bf8f01cfea.prepared.json")
        );
        let bare = names(Path::new("model.onnx"), &sha);
        assert_eq!(bare.query, Path::new("./model.ba7816bf8f01cfea.query.onnx"));
    }

    #[test]
    fn a_file_that_is_not_a_model_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.onnx");
        // A length-delimited field (the graph) cut short.
        std::fs::write(&path, b"\x3a\x05ab").expect("write");
        let e = prepare(&path).expect_err("truncated");
        assert!(matches!(e, PrepareError::Decode { .. }), "{e}");
        let e = prepare(&dir.path().join("missing.onnx")).expect_err("missing");
        assert!(matches!(e, PrepareError::Io { .. }), "{e}");
        // Nothing was written.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }

    #[test]
    fn a_model_without_a_graph_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, ModelProto::default().encode_to_vec()).expect("write");
        let e = prepare(&path).expect_err("no graph");
        assert!(
            matches!(
                e,
                PrepareError::Graph {
                    source: GraphError::NoGraph,
                    ..
                }
            ),
            "{e}"
        );
    }
}
