//! One collection's chunks, dense and lexical indexes, and filter cache.

use crate::dense::{Dense, DenseParams, SearchPath};
use crate::lexical::Lexical;
use crate::{Chunk, Hit, IndexError};
use ragtime_core::{Cancel, Filter};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

struct DocEntry {
    metadata: Arc<Value>,
    chunks: Vec<i64>,
}

#[derive(Default)]
struct Corpus {
    chunks: HashMap<i64, Arc<Chunk>>,
    docs: HashMap<i64, DocEntry>,
    /// A document's id by its external id.
    by_external: HashMap<String, i64>,
}

/// Which chunks a search may return.
#[derive(Debug, Clone)]
pub enum Allowed {
    /// Every live chunk of the collection.
    All,
    /// Only these chunk ids (sorted).
    Only(Arc<Vec<usize>>),
}

impl Allowed {
    pub fn count(&self, total: usize) -> usize {
        match self {
            Allowed::All => total,
            Allowed::Only(v) => v.len(),
        }
    }
}

pub struct CollectionIndex {
    corpus: RwLock<Corpus>,
    dense: Dense,
    lexical: Lexical,
    /// Bumped on every change; keys the filter cache.
    version: AtomicU64,
    filter_cache: Mutex<HashMap<String, FilterEntry>>,
    last_used: AtomicU64,
}

/// A filter's allowed points, as of an index version.
type FilterEntry = (u64, Arc<Vec<usize>>);

const FILTER_CACHE_ENTRIES: usize = 256;

impl CollectionIndex {
    pub fn new(dim: usize, params: DenseParams) -> Result<Self, IndexError> {
        Ok(Self {
            corpus: RwLock::new(Corpus::default()),
            dense: Dense::new(dim, params),
            lexical: Lexical::new()?,
            version: AtomicU64::new(0),
            filter_cache: Mutex::new(HashMap::new()),
            last_used: AtomicU64::new(crate::now_ms()),
        })
    }

    pub fn len(&self) -> usize {
        self.corpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An estimate of the memory the collection's indexes hold: chunk
    /// texts and metadata, the vectors and graph, the BM25 segments.
    pub fn memory_bytes(&self) -> usize {
        let texts: usize = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            corpus
                .chunks
                .values()
                .map(|c| c.text.len() + c.title.len() + c.section.len() + c.external_id.len() + 160)
                .sum::<usize>()
                + corpus.docs.len() * 96
        };
        texts + self.dense.memory_bytes() + self.lexical.memory_bytes()
    }

    /// When a search last used the collection (milliseconds on the
    /// process's monotonic clock, see [`crate::now_ms`]).
    pub fn last_used_ms(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    /// Marks the collection used now.
    pub fn touch(&self) {
        self.last_used.store(crate::now_ms(), Ordering::Relaxed);
    }

    pub fn chunk(&self, id: i64) -> Option<Arc<Chunk>> {
        self.corpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks
            .get(&id)
            .cloned()
    }

    /// Adds chunks with their embeddings to both indexes and commits the
    /// lexical index, so they are searchable when this returns.
    pub fn add(&self, chunks: Vec<(Chunk, Vec<f32>)>) -> Result<(), IndexError> {
        if chunks.is_empty() {
            return Ok(());
        }
        for (_, v) in &chunks {
            self.dense.check_dim(v)?;
        }
        self.lexical.add(chunks.iter().map(|(c, _)| c))?;
        self.dense
            .add(chunks.iter().map(|(c, v)| (c.chunk_id, v.as_slice())));
        {
            let mut corpus = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            for (c, _) in chunks {
                let doc = corpus
                    .docs
                    .entry(c.document_id)
                    .or_insert_with(|| DocEntry {
                        metadata: c.metadata.clone(),
                        chunks: Vec::new(),
                    });
                doc.metadata = c.metadata.clone();
                doc.chunks.push(c.chunk_id);
                corpus
                    .by_external
                    .insert(c.external_id.clone(), c.document_id);
                corpus.chunks.insert(c.chunk_id, Arc::new(c));
            }
        }
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The chunks of the document with this external id.
    pub fn chunks_of(&self, external_id: &str) -> Vec<i64> {
        let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
        corpus
            .by_external
            .get(external_id)
            .and_then(|d| corpus.docs.get(d))
            .map(|d| d.chunks.clone())
            .unwrap_or_default()
    }

    /// Removes chunks from both indexes.
    pub fn remove(&self, chunk_ids: &[i64]) -> Result<(), IndexError> {
        if chunk_ids.is_empty() {
            return Ok(());
        }
        self.lexical.remove(chunk_ids)?;
        {
            let mut corpus = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            for id in chunk_ids {
                if let Some(c) = corpus.chunks.remove(id)
                    && let Some(doc) = corpus.docs.get_mut(&c.document_id)
                {
                    doc.chunks.retain(|x| x != id);
                    if doc.chunks.is_empty() {
                        corpus.docs.remove(&c.document_id);
                        if corpus.by_external.get(&c.external_id) == Some(&c.document_id) {
                            corpus.by_external.remove(&c.external_id);
                        }
                    }
                }
            }
        }
        self.dense.remove(chunk_ids);
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The chunks `filter` allows (cached until the collection changes).
    pub fn allowed(&self, filter: &Filter) -> Allowed {
        if filter.is_all() {
            return Allowed::All;
        }
        let key = format!("{filter:?}");
        let version = self.version.load(Ordering::Acquire);
        if let Some((v, set)) = self
            .filter_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            && *v == version
        {
            return Allowed::Only(set.clone());
        }
        let set = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let mut ids: Vec<usize> = corpus
                .docs
                .values()
                .filter(|d| filter.matches(&d.metadata))
                .flat_map(|d| d.chunks.iter().map(|&c| c as usize))
                .collect();
            ids.sort_unstable();
            Arc::new(ids)
        };
        let mut cache = self
            .filter_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= FILTER_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, (version, set.clone()));
        Allowed::Only(set)
    }

    /// Nearest chunks to a unit query vector among the allowed ones.
    pub fn dense_search(
        &self,
        query: &[f32],
        k: usize,
        allowed: &Allowed,
        cancel: &Cancel,
    ) -> (Vec<Hit>, SearchPath) {
        self.touch();
        self.dense.search(query, k, allowed, self.len(), cancel)
    }

    /// BM25 over title and text among the allowed chunks.
    pub fn lexical_search(
        &self,
        query: &str,
        k: usize,
        allowed: &Allowed,
        cancel: &Cancel,
    ) -> Result<Vec<Hit>, IndexError> {
        self.touch();
        self.lexical.search(query, k, allowed, cancel)
    }
}
