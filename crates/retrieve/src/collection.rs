//! One collection's chunks, dense and lexical indexes, and filter cache.

use crate::dense::{Dense, DenseParams, SearchPath};
use crate::lexical::{AUTO_MAX_CHUNKS, Boosts, Entry, Lexical, LexicalUnit};
use crate::snapshot::{self, Saved, read_chunks, sync_tree, write_chunks};
use crate::workspace::WorkDir;
use crate::{Chunk, DocHit, Hit, IndexError};
use ragtime_core::{Cancel, Filter};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
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

/// Which chunks and documents a search may return.
#[derive(Debug, Clone)]
pub enum Allowed {
    /// Every live chunk of the collection.
    All,
    /// Only these.
    Only(Arc<AllowedSet>),
}

/// The chunks and documents a filter allows (sorted ids).
#[derive(Debug, Default)]
pub struct AllowedSet {
    pub chunks: Arc<Vec<usize>>,
    pub documents: Arc<Vec<usize>>,
}

impl Allowed {
    /// The allowed chunk ids (`None`: all).
    pub fn chunks(&self) -> Option<&Arc<Vec<usize>>> {
        match self {
            Allowed::All => None,
            Allowed::Only(set) => Some(&set.chunks),
        }
    }

    /// The allowed document ids (`None`: all).
    pub fn documents(&self) -> Option<&Arc<Vec<usize>>> {
        match self {
            Allowed::All => None,
            Allowed::Only(set) => Some(&set.documents),
        }
    }

    /// The allowed chunks, of `total`.
    pub fn count(&self, total: usize) -> usize {
        match self {
            Allowed::All => total,
            Allowed::Only(v) => v.chunks.len(),
        }
    }
}

pub struct CollectionIndex {
    corpus: RwLock<Corpus>,
    dense: Dense,
    /// BM25 over chunks ...
    lexical: Lexical,
    /// ... and over whole documents (title, section paths, the chunks'
    /// text joined without their overlaps).
    documents: Lexical,
    /// Bumped on every change; keys the filter cache.
    version: AtomicU64,
    filter_cache: Mutex<HashMap<String, FilterEntry>>,
    last_used: AtomicU64,
    /// The folder the lexical indexes live in (`None`: in memory); last,
    /// so it is removed after they are closed.
    _folder: Option<WorkDir>,
}

/// The lexical indexes' folders in a collection's [`WorkDir`].
fn lexical_folders(
    folder: Option<&WorkDir>,
) -> (Option<std::path::PathBuf>, Option<std::path::PathBuf>) {
    match folder {
        None => (None, None),
        Some(f) => (
            Some(f.path().join(snapshot::CHUNKS_BM25)),
            Some(f.path().join(snapshot::DOCUMENTS_BM25)),
        ),
    }
}

/// Within a document, the weight of a chunk's own BM25 score (scaled to
/// the best chunk's of the query) added to its similarity to the query
/// vector: the chunk that holds the query's words comes first (the answers
/// benchmark's answer-in-top-5 fell from 0.86 to 0.80 when only the vector
/// chose).
const IN_DOCUMENT_LEXICAL: f32 = 0.5;

/// A filter's allowed points, as of an index version.
type FilterEntry = (u64, Arc<AllowedSet>);

const FILTER_CACHE_ENTRIES: usize = 256;

impl CollectionIndex {
    /// An empty collection, every index in memory.
    pub fn new(dim: usize, params: DenseParams) -> Result<Self, IndexError> {
        Self::new_in(dim, params, None)
    }

    /// An empty collection whose lexical indexes live in `folder` (in
    /// memory when `None`).
    pub fn new_in(
        dim: usize,
        params: DenseParams,
        folder: Option<WorkDir>,
    ) -> Result<Self, IndexError> {
        let (chunks, documents) = lexical_folders(folder.as_ref());
        Ok(Self {
            corpus: RwLock::new(Corpus::default()),
            dense: Dense::new(dim, params),
            lexical: Lexical::new_in(chunks)?,
            documents: Lexical::new_in(documents)?,
            version: AtomicU64::new(0),
            filter_cache: Mutex::new(HashMap::new()),
            last_used: AtomicU64::new(crate::now_ms()),
            _folder: folder,
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

    /// Documents with at least one chunk.
    pub fn documents(&self) -> usize {
        self.corpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .docs
            .len()
    }

    /// What BM25 ranks this collection's documents by under `unit`
    /// ([`LexicalUnit::Auto`] resolved by its documents' mean length).
    pub fn lexical_unit(&self, unit: LexicalUnit) -> LexicalUnit {
        match unit {
            LexicalUnit::Auto if self.len() > AUTO_MAX_CHUNKS * self.documents().max(1) => {
                LexicalUnit::Chunks
            }
            LexicalUnit::Auto => LexicalUnit::Documents,
            u => u,
        }
    }

    /// An estimate of the memory the collection's indexes hold: chunk
    /// texts and metadata, the vectors and graph, the BM25 segments held
    /// in memory.
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
        texts
            + self.dense.memory_bytes()
            + self.lexical.memory_bytes()
            + self.documents.memory_bytes()
    }

    /// Bytes of the files the indexes read in place (memory-mapped: what
    /// of them was read sits in the page cache, not in this process's
    /// heap; [`CollectionIndex::memory_bytes`] does not count them).
    pub fn mapped_bytes(&self) -> usize {
        self.dense.mapped_bytes() + self.lexical.mapped_bytes() + self.documents.mapped_bytes()
    }

    /// Moves on every change: whether the collection changed since a look.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
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
        self.lexical
            .replace(&[], chunks.iter().map(|(c, _)| chunk_entry(c)))?;
        self.dense
            .add(chunks.iter().map(|(c, v)| (c.chunk_id, v.as_slice())));
        let touched: Vec<i64> = {
            let mut touched: Vec<i64> = chunks.iter().map(|(c, _)| c.document_id).collect();
            touched.sort_unstable();
            touched.dedup();
            touched
        };
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
        self.reindex_documents(&touched)?;
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Puts the documents' current text in the document index (removing
    /// those with no chunks left).
    fn reindex_documents(&self, ids: &[i64]) -> Result<(), IndexError> {
        let docs: Vec<(i64, String, String, String)> = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            ids.iter()
                .filter_map(|id| {
                    let doc = corpus.docs.get(id)?;
                    let mut chunks: Vec<&Arc<Chunk>> = doc
                        .chunks
                        .iter()
                        .filter_map(|c| corpus.chunks.get(c))
                        .collect();
                    chunks.sort_by_key(|c| (c.position, c.chunk_id));
                    let title = chunks.first().map(|c| c.title.clone())?;
                    let mut sections: Vec<&str> = Vec::new();
                    let mut text = String::new();
                    for c in &chunks {
                        if !c.section.is_empty() && !sections.contains(&c.section.as_str()) {
                            sections.push(&c.section);
                        }
                        append_without_overlap(&mut text, &c.text);
                    }
                    Some((*id, title, sections.join("\n"), text))
                })
                .collect()
        };
        let remove: Vec<u64> = ids.iter().map(|id| *id as u64).collect();
        self.documents.replace(
            &remove,
            docs.iter().map(|(id, title, section, text)| Entry {
                id: *id as u64,
                title,
                section,
                text,
            }),
        )
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
        let ids: Vec<u64> = chunk_ids.iter().map(|id| *id as u64).collect();
        self.lexical.replace(&ids, std::iter::empty())?;
        let mut touched = Vec::new();
        {
            let mut corpus = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            for id in chunk_ids {
                if let Some(c) = corpus.chunks.remove(id)
                    && let Some(doc) = corpus.docs.get_mut(&c.document_id)
                {
                    touched.push(c.document_id);
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
        touched.sort_unstable();
        touched.dedup();
        self.reindex_documents(&touched)?;
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
            let (mut chunks, mut documents) = (Vec::new(), Vec::new());
            for (id, d) in &corpus.docs {
                if filter.matches(&d.metadata) {
                    documents.push(*id as usize);
                    chunks.extend(d.chunks.iter().map(|&c| c as usize));
                }
            }
            chunks.sort_unstable();
            documents.sort_unstable();
            Arc::new(AllowedSet {
                chunks: Arc::new(chunks),
                documents: Arc::new(documents),
            })
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

    /// Fixes the dense graph's search candidate list (`ef_search`) from
    /// now on, or (`None`) lets it follow the collection's size again:
    /// wider finds more of the true nearest at a higher cost (the vectors
    /// benchmark sweeps it on one built graph).
    pub fn set_ef_search(&self, ef: Option<usize>) {
        self.dense.set_ef_search(ef);
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

    /// BM25 over title, section and text among the allowed chunks.
    pub fn lexical_search(
        &self,
        query: &str,
        k: usize,
        allowed: &Allowed,
        cancel: &Cancel,
    ) -> Result<Vec<Hit>, IndexError> {
        self.touch();
        Ok(self
            .lexical
            .search(query, k, allowed.chunks(), Boosts::CHUNKS, cancel)?
            .into_iter()
            .map(|(id, score)| Hit {
                chunk_id: id as i64,
                score,
            })
            .collect())
    }

    /// BM25 over whole documents (title, section paths and text as
    /// fields, weighed by `boosts`) among the allowed documents, each with
    /// its best chunk and then those of its chunks that match the query's
    /// words, `per_document` at most: ranked by similarity to `vector` plus
    /// [`IN_DOCUMENT_LEXICAL`] times their own BM25 score (scaled to the
    /// best), or by BM25 alone without a vector.
    #[allow(clippy::too_many_arguments)]
    pub fn document_search(
        &self,
        query: &str,
        k: usize,
        allowed: &Allowed,
        boosts: Boosts,
        vector: Option<&[f32]>,
        per_document: usize,
        cancel: &Cancel,
    ) -> Result<Vec<DocHit>, IndexError> {
        self.touch();
        let mut hits: Vec<DocHit> = self
            .documents
            .search(query, k, allowed.documents(), boosts, cancel)?
            .into_iter()
            .map(|(id, score)| DocHit {
                document_id: id as i64,
                score,
                chunks: Vec::new(),
            })
            .collect();
        if per_document == 0 {
            return Ok(hits);
        }
        let mut chunks: Vec<Vec<Hit>> = hits
            .iter()
            .map(|h| self.document_chunks(h.document_id, vector))
            .collect();
        // The chunk index scores these documents' chunks (where a document
        // has more than one to choose from).
        let mut ids: Vec<usize> = chunks
            .iter()
            .filter(|c| c.len() > 1)
            .flatten()
            .map(|c| c.chunk_id as usize)
            .collect();
        let scores: HashMap<i64, f32> = if ids.is_empty() {
            HashMap::new()
        } else {
            ids.sort_unstable();
            let n = ids.len();
            self.lexical
                .search(query, n, Some(&Arc::new(ids)), Boosts::CHUNKS, cancel)?
                .into_iter()
                .map(|(id, s)| (id as i64, s))
                .collect()
        };
        let top = scores.values().copied().fold(0.0f32, f32::max);
        for (h, mut c) in hits.iter_mut().zip(chunks.drain(..)) {
            if c.len() > 1 {
                for x in &mut c {
                    let bm25 = scores.get(&x.chunk_id).copied().unwrap_or(0.0);
                    x.score = in_document_score(vector.map(|_| x.score), bm25, top);
                }
                // Stable: ties keep the order they had.
                c.sort_by(|a, b| b.score.total_cmp(&a.score));
                // The best, then those that match the query's words.
                let mut kept = 0;
                c.retain(|x| {
                    kept += 1;
                    kept == 1 || scores.get(&x.chunk_id).is_some_and(|s| *s > 0.0)
                });
            }
            c.truncate(per_document);
            h.chunks = c;
        }
        Ok(hits)
    }

    /// [`Self::document_search`] by chunks: BM25 over the chunks, a
    /// document ranking by its best chunk's score, answering with its
    /// chunks that match (by similarity to `vector` plus
    /// [`IN_DOCUMENT_LEXICAL`] times their scaled BM25 score, or by BM25).
    pub fn chunk_document_search(
        &self,
        query: &str,
        k: usize,
        allowed: &Allowed,
        vector: Option<&[f32]>,
        per_document: usize,
        cancel: &Cancel,
    ) -> Result<Vec<DocHit>, IndexError> {
        let hits = self.lexical_search(query, k, allowed, cancel)?;
        let top = hits.first().map_or(0.0, |h| h.score).max(f32::MIN_POSITIVE);
        let ids: Vec<i64> = hits.iter().map(|h| h.chunk_id).collect();
        let sims = match vector {
            Some(v) => self.dense.similarities(v, &ids),
            None => vec![None; ids.len()],
        };
        let mut docs: Vec<DocHit> = Vec::new();
        let mut at: HashMap<i64, usize> = HashMap::new();
        for (h, sim) in hits.iter().zip(sims) {
            let Some(c) = self.chunk(h.chunk_id) else {
                continue;
            };
            let score = in_document_score(vector.and(sim), h.score, top);
            let i = *at.entry(c.document_id).or_insert_with(|| {
                docs.push(DocHit {
                    document_id: c.document_id,
                    score: h.score,
                    chunks: Vec::new(),
                });
                docs.len() - 1
            });
            docs[i].chunks.push(Hit {
                chunk_id: h.chunk_id,
                score,
            });
        }
        for d in &mut docs {
            d.chunks.sort_by(|a, b| b.score.total_cmp(&a.score));
            d.chunks.truncate(per_document);
        }
        Ok(docs)
    }

    /// Writes the collection's indexes into `dir` (which exists and is
    /// empty) and flushes them to disk. No write may run meanwhile (the
    /// caller serialises writes); searches may.
    pub fn save(&self, dir: &Path) -> Result<Saved, IndexError> {
        let mut saved = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let mut ids: Vec<&i64> = corpus.docs.keys().collect();
            ids.sort_unstable();
            write_chunks(
                &dir.join(snapshot::CHUNKS_FILE),
                ids.into_iter().map(|id| {
                    let chunks = corpus.docs[id]
                        .chunks
                        .iter()
                        .filter_map(|c| corpus.chunks.get(c))
                        .collect();
                    (*id, chunks)
                }),
            )?
        };
        self.dense.save(dir)?;
        for (name, index) in [
            (snapshot::CHUNKS_BM25, &self.lexical),
            (snapshot::DOCUMENTS_BM25, &self.documents),
        ] {
            std::fs::create_dir(dir.join(name))?;
            index.save(&dir.join(name))?;
        }
        sync_tree(dir, dir, &mut saved.files)?;
        Ok(saved)
    }

    /// The collection [`CollectionIndex::save`] wrote into `dir`, its
    /// lexical indexes linked into `folder` and read there in place (read
    /// into memory when `None`).
    pub fn load(
        dir: &Path,
        dim: usize,
        params: DenseParams,
        folder: Option<WorkDir>,
    ) -> Result<Self, IndexError> {
        // Read one after the other. Side by side on two threads they were
        // ready 0.6 s sooner at 100k chunks (2.1-2.4 -> 1.5-2.0 s) but held
        // 40-50 MiB more anonymous memory (a second thread's malloc arena,
        // likely; not checked), against a memory goal further off than the
        // time one: measured, not taken.
        let started = std::time::Instant::now();
        let corpus = read_corpus(dir)?;
        let chunks_took = started.elapsed();
        let graph = Dense::read_graph(dir, dim)?;
        let graph_took = started.elapsed() - chunks_took;
        let dense = Dense::with_graph(dim, params, dir, graph, |id| {
            corpus.chunks.contains_key(&(id as i64))
        })?;
        let (chunks, documents) = lexical_folders(folder.as_ref());
        let lexical = Lexical::load(&dir.join(snapshot::CHUNKS_BM25), chunks)?;
        let documents = Lexical::load(&dir.join(snapshot::DOCUMENTS_BM25), documents)?;
        // Where a large collection's start goes (39 s at 1M chunks).
        tracing::info!(
            chunks = corpus.chunks.len(),
            chunks_ms = chunks_took.as_millis() as u64,
            graph_ms = graph_took.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "collection index read from its snapshot"
        );
        Ok(Self {
            corpus: RwLock::new(corpus),
            dense,
            lexical,
            documents,
            version: AtomicU64::new(0),
            filter_cache: Mutex::new(HashMap::new()),
            last_used: AtomicU64::new(crate::now_ms()),
            _folder: folder,
        })
    }

    /// A document's chunks, best first: by similarity to `query` when
    /// given, else in document order (score 0).
    pub fn document_chunks(&self, document_id: i64, query: Option<&[f32]>) -> Vec<Hit> {
        let mut chunks: Vec<(i32, i64)> = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let Some(doc) = corpus.docs.get(&document_id) else {
                return Vec::new();
            };
            doc.chunks
                .iter()
                .filter_map(|id| corpus.chunks.get(id).map(|c| (c.position, *id)))
                .collect()
        };
        chunks.sort_unstable();
        let ids: Vec<i64> = chunks.into_iter().map(|(_, id)| id).collect();
        let Some(q) = query else {
            return ids
                .into_iter()
                .map(|chunk_id| Hit {
                    chunk_id,
                    score: 0.0,
                })
                .collect();
        };
        let mut hits: Vec<Hit> = ids
            .iter()
            .zip(self.dense.similarities(q, &ids))
            .map(|(&chunk_id, s)| Hit {
                chunk_id,
                score: s.unwrap_or(f32::NEG_INFINITY),
            })
            .collect();
        // Stable: equal scores keep document order.
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits
    }
}

/// A chunk's rank within its document: its similarity to the query vector
/// plus [`IN_DOCUMENT_LEXICAL`] times its BM25 score scaled to `top` (the
/// query's best chunk score), or its BM25 score alone without a vector.
/// Every engine picks a document's passages by it.
pub fn in_document_score(similarity: Option<f32>, bm25: f32, top: f32) -> f32 {
    match similarity {
        Some(s) if top > 0.0 => s + IN_DOCUMENT_LEXICAL * bm25 / top,
        Some(s) => s,
        None => bm25,
    }
}

fn chunk_entry(c: &Chunk) -> Entry<'_> {
    Entry {
        id: c.chunk_id as u64,
        // Where the chunk stands: its title and section path.
        title: &c.title,
        section: &c.section,
        text: &c.text,
    }
}

/// Appends a chunk's text to its document's, leaving out the part that
/// overlaps the end of what is there (chunks share a few tokens with their
/// neighbours, which would count twice in the document's term
/// frequencies).
fn append_without_overlap(text: &mut String, next: &str) {
    if text.is_empty() {
        text.push_str(next);
        return;
    }
    // The overlap starts somewhere in the tail of `text`; find where the
    // tail equals the start of `next`, longest first.
    let probe_len = next.len().min(8);
    let probe_len = (0..=probe_len)
        .rev()
        .find(|&i| next.is_char_boundary(i))
        .unwrap_or(0);
    let mut overlap = 0;
    if probe_len > 0 {
        let probe = &next[..probe_len];
        let from = text.len().saturating_sub(4096);
        let from = (from..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        let mut at = from;
        while let Some(p) = text[at..].find(probe) {
            let start = at + p;
            let tail = &text[start..];
            if next.starts_with(tail) {
                overlap = tail.len();
                break;
            }
            at = start + text[start..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if overlap == 0 {
        text.push('\n');
    }
    text.push_str(&next[overlap..]);
}

/// The corpus [`CollectionIndex::save`] wrote into `dir`'s chunks file.
fn read_corpus(dir: &Path) -> Result<Corpus, IndexError> {
    let mut corpus = Corpus::default();
    read_chunks(&dir.join(snapshot::CHUNKS_FILE), |chunks| {
        let Some(first) = chunks.first() else {
            return;
        };
        corpus
            .by_external
            .insert(first.external_id.clone(), first.document_id);
        corpus.docs.insert(
            first.document_id,
            DocEntry {
                metadata: first.metadata.clone(),
                chunks: chunks.iter().map(|c| c.chunk_id).collect(),
            },
        );
        for c in chunks {
            corpus.chunks.insert(c.chunk_id, Arc::new(c));
        }
    })?;
    Ok(corpus)
}

#[cfg(test)]
mod tests {
    use super::append_without_overlap;

    #[test]
    fn overlapping_chunks_join_once() {
        let mut t = String::new();
        append_without_overlap(&mut t, "The cell divides. Then it grows");
        append_without_overlap(&mut t, "Then it grows again. Finally é");
        append_without_overlap(&mut t, "Unrelated start.");
        assert_eq!(
            t,
            "The cell divides. Then it grows again. Finally é\nUnrelated start."
        );
    }
}
