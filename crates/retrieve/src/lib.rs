//! Retrieval indexes, one set per collection, built from the store or
//! opened from a snapshot of them (`snapshot`): a filtered HNSW
//! (`usearch`, over int8 copies of unit vectors, rescored by cosine) over the chunks, and
//! BM25 indexes (`tantivy`, English stemming) over the same chunks and
//! over whole documents, with the same metadata filters. Given a
//! [`Workspace`], the BM25 indexes live on disk, memory-mapped; the
//! vectors and the chunks' words opened from a snapshot are read from it
//! in place, and words written since from a file in the workspace
//! (`texts`): the heap holds where each chunk is, not what it says.
//!
//! Filters are evaluated before the vector search: the filter picks the
//! allowed chunks (per document, cached per corpus version), then the HNSW
//! traversal only collects allowed points — or, when the allowed set is
//! small, an exact scan of just those vectors replaces the graph search.

mod collection;
mod dense;
mod lexical;
mod snapshot;
mod texts;
mod workspace;

pub use collection::{Allowed, AllowedSet, CollectionIndex, in_document_score};
pub use dense::{CLIP_SIGMAS, DenseParams, SearchPath, dot_i8, quantize_at};
pub use lexical::{AUTO_MAX_CHUNKS, Boosts, LexicalUnit};
pub use snapshot::{Saved, verify_files};
pub use workspace::{WorkDir, Workspace};

use ragtime_core::Filter;
pub use ragtime_core::{Chunk, DocHit, Hit};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum IndexError {
    #[error("lexical index: {0}")]
    Lexical(#[from] tantivy::TantivyError),
    #[error("vector has {got} dimensions, the index {want}")]
    Dim { got: usize, want: usize },
    #[error("snapshot: {0}")]
    Snapshot(String),
    #[error("snapshot: {0}")]
    Io(#[from] std::io::Error),
}

/// The file at `path`, memory-mapped for random reads (through tantivy's
/// memory-mapped directory: the map without unsafe code here, which the
/// workspace forbids). The file must not change while mapped: a saved
/// index's files are written once and never rewritten.
pub(crate) fn map_file(
    path: &std::path::Path,
) -> Result<tantivy::directory::OwnedBytes, IndexError> {
    use tantivy::directory::{Advice, Directory, MmapDirectory};
    let bad = |what: String| IndexError::Snapshot(format!("{}: {what}", path.display()));
    let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(bad("not a file".into()));
    };
    let folder =
        MmapDirectory::open_with_madvice(folder, Advice::Random).map_err(|e| bad(e.to_string()))?;
    Ok(folder
        .open_read(std::path::Path::new(name))
        .map_err(|e| bad(e.to_string()))?
        .read_bytes()?)
}

/// All collections' indexes.
pub struct Indexes {
    dim: usize,
    params: DenseParams,
    collections: RwLock<HashMap<String, Arc<CollectionIndex>>>,
    /// Where new collections' lexical indexes live (`None`: in memory).
    workspace: Option<Workspace>,
}

impl Indexes {
    pub fn new(dim: usize, params: DenseParams) -> Self {
        Self {
            dim,
            params,
            collections: RwLock::new(HashMap::new()),
            workspace: None,
        }
    }

    /// Collections made from now on keep their lexical indexes in
    /// `workspace`, on disk.
    pub fn with_workspace(mut self, workspace: Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }

    /// A new folder for one collection's on-disk indexes: `None` (in
    /// memory) without a workspace, or where the folder cannot be made (a
    /// full or read-only disk costs memory, not the collection).
    pub fn folder(&self) -> Option<WorkDir> {
        let w = self.workspace.as_ref()?;
        w.folder()
            .inspect_err(|e| {
                tracing::warn!(path = %w.root().display(), error = %e, "no folder for a collection's indexes; they stay in memory");
            })
            .ok()
    }

    /// A new, empty collection index (not put in place), in this set's
    /// workspace if it has one.
    pub fn create(&self) -> Result<CollectionIndex, IndexError> {
        CollectionIndex::new_in(self.dim, self.params, self.folder())
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The index of `name`, if any chunk was ever added to it.
    pub fn get(&self, name: &str) -> Option<Arc<CollectionIndex>> {
        self.collections
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The index of `name`, created empty if missing.
    pub fn get_or_create(&self, name: &str) -> Result<Arc<CollectionIndex>, IndexError> {
        if let Some(c) = self.get(name) {
            return Ok(c);
        }
        let mut map = self
            .collections
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = map.get(name) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.create()?);
        map.insert(name.to_owned(), c.clone());
        Ok(c)
    }

    /// Drops a collection's indexes (its memory is freed once no search
    /// holds them); `false` if none were loaded.
    pub fn remove(&self, name: &str) -> bool {
        self.collections
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)
            .is_some()
    }

    /// Every loaded collection, by name.
    pub fn loaded(&self) -> Vec<(String, Arc<CollectionIndex>)> {
        let map = self
            .collections
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Puts a collection's indexes in place (a load from the store).
    pub fn insert(&self, name: &str, index: Arc<CollectionIndex>) {
        self.collections
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), index);
    }

    pub fn params(&self) -> DenseParams {
        self.params
    }

    /// Total live chunks over all collections.
    pub fn len(&self) -> usize {
        self.collections
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|c| c.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Milliseconds since the process's first call: a monotonic clock for
/// collections' last use.
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Parses a filter given as JSON, naming it `filter` in errors.
pub fn parse_filter(v: &Value) -> Result<Filter, ragtime_core::FilterError> {
    Filter::parse(v, "filter")
}
