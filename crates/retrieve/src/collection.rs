//! One collection's chunks, dense and lexical indexes, and filter cache.
//!
//! The heap holds, per chunk, its document, position and where its words
//! are ([`Texts`]: a snapshot's mapped file, or a file of the work
//! folder), per document its ids, title and metadata's number, each
//! distinct metadata once as its key/value pairs' numbers and each value
//! of a key once ([`Metadata`]); a chunk's words are read, and its
//! metadata put together, when it is returned, or (the words) when its
//! document's entry in the document index is rewritten.

use crate::dense::{Dense, DenseParams, SearchPath};
use crate::lexical::{AUTO_MAX_CHUNKS, Boosts, Entry, Lexical, LexicalUnit};
use crate::snapshot::{self, ChunkLine, DocumentLine, Saved, read_chunks, sync_tree, write_chunks};
use crate::texts::{Saving, Span, Texts, Words};
use crate::workspace::WorkDir;
use crate::{Chunk, DocHit, Hit, IndexError};
use ragtime_core::{Cancel, Filter};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// What the heap holds of a chunk: its place, and where its words are
/// ([`Texts`]: read for the chunks a search returns).
struct ChunkEntry {
    document_id: i64,
    position: i32,
    words: Span,
}

struct DocEntry {
    external_id: Arc<str>,
    title: Arc<str>,
    /// Its metadata's number in [`Metadata`].
    metadata: u32,
    chunks: Vec<i64>,
}

#[derive(Default)]
struct Corpus {
    chunks: HashMap<i64, ChunkEntry>,
    docs: HashMap<i64, DocEntry>,
    /// A document's id by its external id.
    by_external: HashMap<Arc<str>, i64>,
    metadata: Metadata,
}

/// The documents' metadata, kept by field: each key once, each distinct
/// value of a key once ([`Fields`]), and each distinct metadata — the set
/// of a document's key/value pairs — once and numbered. A company's
/// documents mostly share a few values of a field (a source, a language,
/// a team) even where their whole metadata differ (a URL or a date each),
/// which would otherwise be one JSON tree per document; a filter is
/// decided once per distinct metadata, reading only the fields it names.
#[derive(Default)]
struct Metadata {
    /// Each distinct metadata, counted by the documents holding it.
    held: Numbered<Held>,
    /// The value last taken and its number: a document's chunks arrive
    /// together sharing one value, which is then hashed once, not per
    /// chunk (cleared when its number is freed).
    last: Option<(Arc<Value>, u32)>,
    fields: Fields,
}

/// One distinct metadata.
enum Held {
    /// An object: its `(field, value)` numbers in [`Fields`], in field
    /// order.
    Pairs(Box<[(u32, u32)]>),
    /// Anything but an object (the API never stores one): kept whole, so
    /// that it reads back as it was written.
    Whole(Arc<Value>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Pairs(Box::new([]))
    }
}

/// Values held once each, numbered, and counted by their holders: a value
/// whose last holder lets go is freed and its number goes to the next new
/// value. Found by the hash of the value's JSON text; on a collision the
/// later value is numbered on its own, never wrongly shared.
struct Numbered<T> {
    /// A value and how many hold it (none: a free number).
    values: Vec<(T, u32)>,
    free: Vec<u32>,
    by_hash: HashMap<u64, u32>,
}

impl<T> Default for Numbered<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            free: Vec::new(),
            by_hash: HashMap::new(),
        }
    }
}

impl<T: Default> Numbered<T> {
    /// The number of the value hashed `h` that `same` accepts, held by
    /// one more.
    fn find(&mut self, h: u64, same: impl Fn(&T) -> bool) -> Option<u32> {
        let n = *self.by_hash.get(&h)?;
        let entry = &mut self.values[n as usize];
        // A free number's placeholder is never a value found again.
        if entry.1 == 0 || !same(&entry.0) {
            return None;
        }
        entry.1 += 1;
        Some(n)
    }

    /// A number for new value `v` (hashed `h`), held by one.
    fn insert(&mut self, h: u64, v: T) -> u32 {
        let n = match self.free.pop() {
            Some(n) => {
                self.values[n as usize] = (v, 1);
                n
            }
            None => {
                self.values.push((v, 1));
                (self.values.len() - 1) as u32
            }
        };
        self.by_hash.entry(h).or_insert(n);
        n
    }

    /// One holder fewer of `n`; the value, when that was its last
    /// (`hash` gives its hash).
    fn release(&mut self, n: u32, hash: impl Fn(&T) -> u64) -> Option<T> {
        let entry = &mut self.values[n as usize];
        entry.1 -= 1;
        if entry.1 > 0 {
            return None;
        }
        let h = hash(&entry.0);
        let v = std::mem::take(&mut entry.0);
        if self.by_hash.get(&h) == Some(&n) {
            self.by_hash.remove(&h);
        }
        self.free.push(n);
        Some(v)
    }

    fn get(&self, n: u32) -> &T {
        &self.values[n as usize].0
    }

    /// Each number's value, when something holds it.
    fn live(&self) -> impl Iterator<Item = Option<&T>> {
        self.values
            .iter()
            .map(|(v, users)| (*users > 0).then_some(v))
    }
}

/// Every key metadata has used, and each distinct value of a key, held
/// once and counted by the distinct metadata holding it (a key is kept
/// once seen: a few bytes; its values are freed with their last holder).
#[derive(Default)]
struct Fields {
    by_key: HashMap<Arc<str>, u32>,
    fields: Vec<(Arc<str>, Numbered<Value>)>,
}

fn json_hash(v: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl Fields {
    /// The number of value `v` of `key`, held by one more metadata.
    fn take(&mut self, key: &str, v: &Value) -> (u32, u32) {
        let f = match self.by_key.get(key) {
            Some(&f) => f,
            None => {
                let key: Arc<str> = Arc::from(key);
                self.fields.push((key.clone(), Numbered::default()));
                let f = (self.fields.len() - 1) as u32;
                self.by_key.insert(key, f);
                f
            }
        };
        let values = &mut self.fields[f as usize].1;
        let h = json_hash(v);
        let n = match values.find(h, |x| x == v) {
            Some(n) => n,
            None => values.insert(h, v.clone()),
        };
        (f, n)
    }

    fn release(&mut self, (field, value): (u32, u32)) {
        self.fields[field as usize].1.release(value, json_hash);
    }

    fn value(&self, (field, value): (u32, u32)) -> &Value {
        self.fields[field as usize].1.get(value)
    }

    /// What `pairs` hold under `key`: the key itself, or a dotted path
    /// walked from its first part (as [`ragtime_core::Filter::matches`]
    /// reads one JSON tree).
    fn lookup<'a>(&'a self, pairs: &[(u32, u32)], key: &str) -> Option<&'a Value> {
        let top = |k: &str| {
            let f = *self.by_key.get(k)?;
            let i = pairs.binary_search_by_key(&f, |p| p.0).ok()?;
            Some(self.value(pairs[i]))
        };
        if let Some(v) = top(key) {
            return Some(v);
        }
        let mut parts = key.split('.');
        let mut cur = top(parts.next()?)?;
        for part in parts {
            cur = cur.get(part)?;
        }
        Some(cur)
    }

    /// Is `held` the same metadata as `v`?
    fn same(&self, held: &Held, v: &Value) -> bool {
        match (held, v) {
            (Held::Whole(w), v) => **w == *v,
            (Held::Pairs(pairs), Value::Object(m)) => {
                pairs.len() == m.len()
                    && m.iter().all(|(k, x)| {
                        self.by_key.get(k.as_str()).is_some_and(|&f| {
                            pairs
                                .binary_search_by_key(&f, |p| p.0)
                                .is_ok_and(|i| self.value(pairs[i]) == x)
                        })
                    })
            }
            (Held::Pairs(_), _) => false,
        }
    }

    /// `held` as one JSON value.
    fn value_of(&self, held: &Held) -> Value {
        match held {
            Held::Whole(v) => (**v).clone(),
            Held::Pairs(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|&p| {
                        (
                            self.fields[p.0 as usize].0.to_string(),
                            self.value(p).clone(),
                        )
                    })
                    .collect(),
            ),
        }
    }
}

impl Metadata {
    /// The number of `v`, taken by one more document.
    fn take(&mut self, v: Arc<Value>) -> u32 {
        if let Some((last, n)) = &self.last
            && Arc::ptr_eq(last, &v)
        {
            self.held.values[*n as usize].1 += 1;
            return *n;
        }
        let n = self.take_hashed(v.clone());
        self.last = Some((v, n));
        n
    }

    fn take_hashed(&mut self, v: Arc<Value>) -> u32 {
        let h = json_hash(&v);
        let fields = &self.fields;
        if let Some(n) = self.held.find(h, |held| fields.same(held, &v)) {
            return n;
        }
        let held = if let Value::Object(m) = &*v {
            let mut pairs: Vec<(u32, u32)> =
                m.iter().map(|(k, x)| self.fields.take(k, x)).collect();
            pairs.sort_unstable_by_key(|p| p.0);
            Held::Pairs(pairs.into_boxed_slice())
        } else {
            Held::Whole(v.clone())
        };
        self.held.insert(h, held)
    }

    /// One document fewer holds value `n`.
    fn release(&mut self, n: u32) {
        let fields = &self.fields;
        let Some(held) = self
            .held
            .release(n, |held| json_hash(&fields.value_of(held)))
        else {
            return;
        };
        if self.last.as_ref().is_some_and(|(_, last)| *last == n) {
            self.last = None;
        }
        if let Held::Pairs(pairs) = held {
            for &pair in pairs.iter() {
                self.fields.release(pair);
            }
        }
    }

    /// The metadata numbered `n`, as one JSON value (built for a returned
    /// chunk or a snapshot's line).
    fn get(&self, n: u32) -> Value {
        self.fields.value_of(self.held.get(n))
    }

    /// Which numbers `filter` allows.
    fn allowed(&self, filter: &Filter) -> Vec<bool> {
        self.held
            .live()
            .map(|held| match held {
                None => false,
                Some(Held::Whole(v)) => filter.matches(v),
                Some(Held::Pairs(pairs)) => {
                    filter.matches_by(&|key| self.fields.lookup(pairs, key))
                }
            })
            .collect()
    }

    /// Heap bytes, roughly.
    fn bytes(&self) -> usize {
        let held: usize = self
            .held
            .live()
            .map(|held| match held {
                None => 40,
                Some(Held::Whole(v)) => 56 + json_bytes(v),
                Some(Held::Pairs(pairs)) => 56 + pairs.len() * 8,
            })
            .sum();
        let fields: usize = self
            .fields
            .fields
            .iter()
            .map(|(key, values)| {
                64 + 2 * key.len()
                    + values
                        .live()
                        .map(|v| 40 + v.map_or(0, json_bytes))
                        .sum::<usize>()
                    + values.by_hash.capacity() * 13
            })
            .sum();
        held + fields + self.held.by_hash.capacity() * 13
    }
}

impl Corpus {
    /// The chunk `id`, its words read from `texts`.
    fn chunk(&self, texts: &Texts, id: i64) -> Result<Option<Chunk>, IndexError> {
        let Some(c) = self.chunks.get(&id) else {
            return Ok(None);
        };
        let Some(doc) = self.docs.get(&c.document_id) else {
            return Ok(None);
        };
        let Words { section, text } = texts.read(c.words)?;
        Ok(Some(Chunk {
            chunk_id: id,
            document_id: c.document_id,
            external_id: doc.external_id.to_string(),
            position: c.position,
            title: doc.title.to_string(),
            section,
            metadata: Arc::new(self.metadata.get(doc.metadata)),
            text,
        }))
    }

    /// The document's live chunks in document order.
    fn ordered(&self, doc: &DocEntry) -> Vec<(i64, &ChunkEntry)> {
        let mut chunks: Vec<(i64, &ChunkEntry)> = doc
            .chunks
            .iter()
            .filter_map(|id| self.chunks.get(id).map(|c| (*id, c)))
            .collect();
        chunks.sort_by_key(|(id, c)| (c.position, *id));
        chunks
    }
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
    /// The chunks' words.
    texts: Texts,
    dense: Dense,
    /// BM25 over chunks ...
    lexical: Lexical,
    /// ... and over whole documents (title, section paths, the chunks'
    /// text joined without their overlaps).
    documents: Lexical,
    /// Bumped on every change; keys the filter cache.
    version: AtomicU64,
    filter_cache: Mutex<FilterCache>,
    /// The most the filter cache holds, in bytes ([`FILTER_CACHE_BYTES`]).
    filter_cache_cap: AtomicUsize,
    last_used: AtomicU64,
    /// Held by each change from its first step to its last: a compaction
    /// of the chunks' words needs their spans to stay put while it copies
    /// them (the pipeline already sends one change at a time).
    writes: Mutex<()>,
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
/// The most a collection's filter cache holds by default, in bytes: its
/// keys and the chunk and document numbers of its sets (a broad filter on a
/// million chunks allows 8 MB of them).
pub const FILTER_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Filters' allowed sets, and the bytes they take.
#[derive(Default)]
struct FilterCache {
    entries: HashMap<String, FilterEntry>,
    bytes: usize,
}

fn entry_bytes(key: &str, set: &AllowedSet) -> usize {
    key.len() + (set.chunks.len() + set.documents.len()) * std::mem::size_of::<usize>()
}

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
            texts: Texts::new(folder.as_ref().map(|f| f.path()))?,
            dense: Dense::new(dim, params),
            lexical: Lexical::new_in(chunks)?,
            documents: Lexical::new_in(documents)?,
            version: AtomicU64::new(0),
            filter_cache: Mutex::new(FilterCache::default()),
            filter_cache_cap: AtomicUsize::new(FILTER_CACHE_BYTES),
            last_used: AtomicU64::new(crate::now_ms()),
            writes: Mutex::new(()),
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

    /// An estimate of the memory the collection's indexes hold: where
    /// each chunk is, the documents' titles and metadata, the vectors and
    /// graph, the chunks' words and BM25 segments held in memory (those
    /// of a collection without a work folder).
    pub fn memory_bytes(&self) -> usize {
        let corpus: usize = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            // A map entry: key, value and hashbrown's control byte, at its
            // load factor.
            corpus.chunks.capacity() * 41
                + corpus
                    .docs
                    .values()
                    .map(|d| {
                        d.title.len() + 2 * d.external_id.len() + 8 * d.chunks.capacity() + 120
                    })
                    .sum::<usize>()
                + corpus.metadata.bytes()
        };
        corpus
            + self.texts.memory_bytes()
            + self.dense.memory_bytes()
            + self.lexical.memory_bytes()
            + self.documents.memory_bytes()
    }

    /// Bytes of the files the indexes read in place (memory-mapped: what
    /// of them was read sits in the page cache, not in this process's
    /// heap; [`CollectionIndex::memory_bytes`] does not count them).
    pub fn mapped_bytes(&self) -> usize {
        self.texts.file_bytes()
            + self.dense.mapped_bytes()
            + self.lexical.mapped_bytes()
            + self.documents.mapped_bytes()
    }

    /// Bytes the chunks' words take, live and released, in files and in
    /// the heap.
    pub fn words_bytes(&self) -> usize {
        self.texts.file_bytes() + self.texts.memory_bytes()
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

    /// The chunk `id` (its words read from where they are kept; `None`,
    /// logged, where they cannot be read).
    pub fn chunk(&self, id: i64) -> Option<Arc<Chunk>> {
        let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
        corpus
            .chunk(&self.texts, id)
            .inspect_err(
                |e| tracing::error!(chunk = id, error = %e, "a chunk's words could not be read"),
            )
            .ok()
            .flatten()
            .map(Arc::new)
    }

    /// Whether the collection holds chunk `id`.
    pub fn contains(&self, id: i64) -> bool {
        self.corpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks
            .contains_key(&id)
    }

    /// The document chunk `id` belongs to.
    fn document_of(&self, id: i64) -> Option<i64> {
        self.corpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks
            .get(&id)
            .map(|c| c.document_id)
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
        let _writing = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        let words = self.texts.append(
            chunks
                .iter()
                .map(|(c, _)| (c.section.as_str(), c.text.as_str())),
        )?;
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
            let mut guard = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            let corpus = &mut *guard;
            for ((c, _), words) in chunks.into_iter().zip(words) {
                let metadata = corpus.metadata.take(c.metadata);
                let doc = corpus
                    .docs
                    .entry(c.document_id)
                    .or_insert_with(|| DocEntry {
                        external_id: Arc::from(c.external_id.as_str()),
                        title: Arc::from(c.title.as_str()),
                        metadata,
                        chunks: Vec::new(),
                    });
                if doc.metadata != metadata {
                    corpus
                        .metadata
                        .release(std::mem::replace(&mut doc.metadata, metadata));
                } else if !doc.chunks.is_empty() {
                    // An existing document's own value: held once.
                    corpus.metadata.release(metadata);
                }
                if *doc.title != *c.title {
                    doc.title = Arc::from(c.title.as_str());
                }
                let external_id = doc.external_id.clone();
                let entry = ChunkEntry {
                    document_id: c.document_id,
                    position: c.position,
                    words,
                };
                match corpus.chunks.insert(c.chunk_id, entry) {
                    Some(old) => self.texts.release(old.words),
                    None => {
                        if let Some(doc) = corpus.docs.get_mut(&c.document_id) {
                            doc.chunks.push(c.chunk_id);
                        }
                    }
                }
                corpus.by_external.insert(external_id, c.document_id);
            }
        }
        self.reindex_documents(&touched)?;
        self.version.fetch_add(1, Ordering::AcqRel);
        self.compact_texts_if_wasteful()
    }

    /// Copies the live chunks' words into a new file once the released
    /// ones outweigh them ([`Texts::wasteful`]); searches go on while it
    /// copies and wait only for the spans to be swapped. Called by a
    /// change, holding [`CollectionIndex::writes`].
    fn compact_texts_if_wasteful(&self) -> Result<(), IndexError> {
        if !self.texts.wasteful() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (ids, spans): (Vec<i64>, Vec<Span>) = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            corpus.chunks.iter().map(|(id, c)| (*id, c.words)).unzip()
        };
        let before = self.words_bytes();
        let (compacted, moved) = self.texts.compacted(&spans)?;
        {
            let mut corpus = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            self.texts.install(compacted)?;
            for (id, span) in ids.iter().zip(moved) {
                if let Some(c) = corpus.chunks.get_mut(id) {
                    c.words = span;
                }
            }
        }
        tracing::info!(
            chunks = ids.len(),
            bytes_before = before,
            bytes_after = self.words_bytes(),
            took_ms = started.elapsed().as_millis() as u64,
            "chunks' words compacted"
        );
        Ok(())
    }

    /// Puts the documents' current text in the document index (removing
    /// those with no chunks left).
    fn reindex_documents(&self, ids: &[i64]) -> Result<(), IndexError> {
        let docs: Vec<(i64, String, String, String)> = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let mut docs = Vec::new();
            for id in ids {
                let Some(doc) = corpus.docs.get(id) else {
                    continue;
                };
                let chunks = corpus.ordered(doc);
                if chunks.is_empty() {
                    continue;
                }
                let mut sections: Vec<String> = Vec::new();
                let mut text = String::new();
                for (_, c) in chunks {
                    let words = self.texts.read(c.words)?;
                    if !words.section.is_empty() && !sections.contains(&words.section) {
                        sections.push(words.section);
                    }
                    append_without_overlap(&mut text, &words.text);
                }
                docs.push((*id, doc.title.to_string(), sections.join("\n"), text));
            }
            docs
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
        let _writing = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        let ids: Vec<u64> = chunk_ids.iter().map(|id| *id as u64).collect();
        self.lexical.replace(&ids, std::iter::empty())?;
        let mut touched = Vec::new();
        {
            let mut corpus = self.corpus.write().unwrap_or_else(PoisonError::into_inner);
            for id in chunk_ids {
                let Some(c) = corpus.chunks.remove(id) else {
                    continue;
                };
                self.texts.release(c.words);
                if let Some(doc) = corpus.docs.get_mut(&c.document_id) {
                    touched.push(c.document_id);
                    doc.chunks.retain(|x| x != id);
                    if doc.chunks.is_empty() {
                        let external_id = doc.external_id.clone();
                        let metadata = doc.metadata;
                        corpus.docs.remove(&c.document_id);
                        corpus.metadata.release(metadata);
                        if corpus.by_external.get(&external_id) == Some(&c.document_id) {
                            corpus.by_external.remove(&external_id);
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
        self.compact_texts_if_wasteful()
    }

    /// The chunks `filter` allows (cached until the collection changes).
    pub fn allowed(&self, filter: &Filter) -> Allowed {
        self.allowed_within(filter, &Cancel::new())
            .expect("a filter never cancelled is always answered")
    }

    /// [`allowed`](Self::allowed), stopping (`None`, nothing cached) once
    /// `cancel` is set: a search past its deadline does not walk every
    /// document on, holding the collection's read lock while writes wait.
    pub fn allowed_within(&self, filter: &Filter, cancel: &Cancel) -> Option<Allowed> {
        if filter.is_all() {
            return Some(Allowed::All);
        }
        let key = format!("{filter:?}");
        let version = self.version.load(Ordering::Acquire);
        if let Some((v, set)) = self
            .filter_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .get(&key)
            && *v == version
        {
            return Some(Allowed::Only(set.clone()));
        }
        let set = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let (mut chunks, mut documents) = (Vec::new(), Vec::new());
            let allowed = corpus.metadata.allowed(filter);
            for (n, (id, d)) in corpus.docs.iter().enumerate() {
                if n % 4096 == 0 && cancel.is_cancelled() {
                    return None;
                }
                if allowed[d.metadata as usize] {
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
        let cap = self.filter_cache_cap.load(Ordering::Relaxed);
        let bytes = entry_bytes(&key, &set);
        // One set past a quarter of the bound is not kept: it would push
        // out every other.
        if bytes <= cap / 4 {
            let mut cache = self
                .filter_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((_, old)) = cache.entries.remove(&key) {
                cache.bytes -= entry_bytes(&key, &old);
            }
            if cache.entries.len() >= FILTER_CACHE_ENTRIES || cache.bytes + bytes > cap {
                cache.entries.clear();
                cache.bytes = 0;
            }
            cache.bytes += bytes;
            cache.entries.insert(key, (version, set.clone()));
        }
        Some(Allowed::Only(set))
    }

    /// The bytes the filter cache holds now.
    pub fn filter_cache_bytes(&self) -> usize {
        self.filter_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }

    /// Bounds the filter cache at `bytes` from now on (it is emptied when
    /// a new set would pass it).
    pub fn set_filter_cache_bytes(&self, bytes: usize) {
        self.filter_cache_cap.store(bytes, Ordering::Relaxed);
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
            let Some(document_id) = self.document_of(h.chunk_id) else {
                continue;
            };
            let score = in_document_score(vector.and(sim), h.score, top);
            let i = *at.entry(document_id).or_insert_with(|| {
                docs.push(DocHit {
                    document_id,
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
            let mut texts = Saving::create(&dir.join(snapshot::TEXTS_FILE))?;
            let mut record = Vec::new();
            let saved = write_chunks(
                &dir.join(snapshot::CHUNKS_FILE),
                ids.into_iter().map(|id| {
                    let doc = &corpus.docs[id];
                    let mut chunks = Vec::with_capacity(doc.chunks.len());
                    for (chunk_id, c) in corpus.ordered(doc) {
                        self.texts.copy(c.words, &mut record)?;
                        let (at, len) = texts.write(&record)?;
                        chunks.push(ChunkLine {
                            chunk_id,
                            position: c.position,
                            at,
                            len,
                        });
                    }
                    Ok(DocumentLine {
                        document_id: *id,
                        external_id: doc.external_id.to_string(),
                        title: doc.title.to_string(),
                        metadata: corpus.metadata.get(doc.metadata),
                        chunks,
                    })
                }),
            )?;
            texts.finish()?;
            saved
        };
        self.dense.save(dir)?;
        for (name, index) in [
            (snapshot::CHUNKS_BM25, &self.lexical),
            (snapshot::DOCUMENTS_BM25, &self.documents),
        ] {
            std::fs::create_dir(dir.join(name))?;
            index.save(&dir.join(name))?;
        }
        sync_tree(dir, dir, &mut saved)?;
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
        let texts = Texts::open(
            &dir.join(snapshot::TEXTS_FILE),
            folder.as_ref().map(|f| f.path()),
        )?;
        let corpus = read_corpus(dir, &texts)?;
        texts.check_sample(corpus.chunks.values().map(|c| c.words))?;
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
            texts,
            dense,
            lexical,
            documents,
            version: AtomicU64::new(0),
            filter_cache: Mutex::new(FilterCache::default()),
            filter_cache_cap: AtomicUsize::new(FILTER_CACHE_BYTES),
            last_used: AtomicU64::new(crate::now_ms()),
            writes: Mutex::new(()),
            _folder: folder,
        })
    }

    /// A document's chunks, best first: by similarity to `query` when
    /// given, else in document order (score 0).
    pub fn document_chunks(&self, document_id: i64, query: Option<&[f32]>) -> Vec<Hit> {
        let ids: Vec<i64> = {
            let corpus = self.corpus.read().unwrap_or_else(PoisonError::into_inner);
            let Some(doc) = corpus.docs.get(&document_id) else {
                return Vec::new();
            };
            corpus.ordered(doc).into_iter().map(|(id, _)| id).collect()
        };
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
    let overlap = ragtime_core::overlap_len(text, next);
    if overlap == 0 {
        text.push('\n');
    }
    text.push_str(&next[overlap..]);
}

/// The corpus [`CollectionIndex::save`] wrote into `dir`'s chunks file,
/// its words in `texts` (an error where a chunk's record is not in it).
fn read_corpus(dir: &Path, texts: &Texts) -> Result<Corpus, IndexError> {
    let mut corpus = Corpus::default();
    let path = dir.join(snapshot::CHUNKS_FILE);
    read_chunks(&path, |d| {
        if d.chunks.is_empty() {
            return Ok(());
        }
        let external_id: Arc<str> = Arc::from(d.external_id);
        corpus
            .by_external
            .insert(external_id.clone(), d.document_id);
        let mut ids = Vec::with_capacity(d.chunks.len());
        for c in d.chunks {
            let words = texts.saved_span(c.at, c.len).ok_or_else(|| {
                IndexError::Snapshot(format!(
                    "{}: chunk {}'s words are not in the texts file",
                    path.display(),
                    c.chunk_id
                ))
            })?;
            let entry = ChunkEntry {
                document_id: d.document_id,
                position: c.position,
                words,
            };
            if corpus.chunks.insert(c.chunk_id, entry).is_some() {
                return Err(IndexError::Snapshot(format!(
                    "{}: chunk {} is listed twice",
                    path.display(),
                    c.chunk_id
                )));
            }
            ids.push(c.chunk_id);
        }
        corpus.docs.insert(
            d.document_id,
            DocEntry {
                external_id,
                title: Arc::from(d.title),
                metadata: corpus.metadata.take(Arc::new(d.metadata)),
                chunks: ids,
            },
        );
        Ok(())
    })?;
    Ok(corpus)
}

/// The bytes a JSON value holds on the heap, roughly (a `serde_json`
/// map entry or array slot is its 32-byte value plus what it points to).
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(|x| 32 + json_bytes(x)).sum(),
        Value::Object(m) => m.iter().map(|(k, x)| 56 + k.len() + json_bytes(x)).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::{Metadata, append_without_overlap, json_hash};
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn equal_metadata_is_held_once_and_freed_with_its_last_document() {
        let mut m = Metadata::default();
        let a = m.take(Arc::new(json!({"team": "search", "lang": "en"})));
        // The same value, its keys written in another order.
        let b = m.take(Arc::new(json!({"lang": "en", "team": "search"})));
        let c = m.take(Arc::new(json!({"team": "llm"})));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let filter =
            ragtime_core::Filter::parse(&json!({"team": "search"}), "filter").expect("filter");
        assert_eq!(m.allowed(&filter), vec![true, false]);
        m.release(a);
        assert_eq!(m.allowed(&filter), vec![true, false], "one holder left");
        m.release(b);
        assert_eq!(m.allowed(&filter), vec![false, false], "freed");
        // A freed number is reused, for another value.
        let d = m.take(Arc::new(json!({"team": "ops"})));
        assert_eq!(d, a);
        assert_eq!(m.get(d), json!({"team": "ops"}));
        assert_eq!(m.take(Arc::new(json!({"team": "search"}))), 2);
    }

    #[test]
    fn one_shared_value_taken_again_is_counted_and_a_freed_one_is_not_reused_for_it() {
        let mut m = Metadata::default();
        let shared = Arc::new(json!({"team": "search"}));
        let n = m.take(shared.clone());
        assert_eq!(
            m.take(shared.clone()),
            n,
            "the same value, not hashed again"
        );
        m.release(n);
        let filter =
            ragtime_core::Filter::parse(&json!({"team": "search"}), "filter").expect("filter");
        assert_eq!(
            m.allowed(&filter),
            vec![true],
            "taken twice: one holder left"
        );
        m.release(n);
        assert_eq!(m.allowed(&filter), vec![false], "freed");
        // Taken again once freed (the same allocation), the value is
        // numbered anew: its old number is free and goes to the next new
        // value, never shared between the two.
        let again = m.take(shared.clone());
        let other = m.take(Arc::new(json!({"team": "ops"})));
        assert_ne!(again, other);
        assert_eq!(m.get(again), json!({"team": "search"}));
        assert_eq!(m.get(other), json!({"team": "ops"}));
    }

    #[test]
    fn a_fields_value_is_held_once_by_metadata_that_differ() {
        let mut m = Metadata::default();
        let long = "a value every document shares ".repeat(30);
        let ns: Vec<u32> = (0..100)
            .map(|i| m.take(Arc::new(json!({"url": format!("u{i}"), "team": long}))))
            .collect();
        let live = |m: &Metadata, key: &str| {
            let f = m.fields.by_key[key];
            m.fields.fields[f as usize].1.live().flatten().count()
        };
        assert_eq!(live(&m, "team"), 1, "one value of team for 100 documents");
        assert_eq!(live(&m, "url"), 100);
        assert!(
            m.bytes() < 2 * long.len() + 100 * 256,
            "{} bytes: the shared value counted once",
            m.bytes()
        );
        assert_eq!(m.get(ns[7]), json!({"url": "u7", "team": long}));
        let allowed = |m: &Metadata, f: serde_json::Value| {
            let f = ragtime_core::Filter::parse(&f, "filter").expect("filter");
            let a = m.allowed(&f);
            ns.iter().filter(|&&n| a[n as usize]).count()
        };
        assert_eq!(allowed(&m, json!({"team": long})), 100);
        assert_eq!(allowed(&m, json!({"url": "u7"})), 1);
        assert_eq!(allowed(&m, json!({"url": {"$ne": "u7"}, "team": long})), 99);
        for &n in &ns[..99] {
            m.release(n);
        }
        assert_eq!(
            (live(&m, "team"), live(&m, "url")),
            (1, 1),
            "one holder left"
        );
        m.release(ns[99]);
        assert_eq!((live(&m, "team"), live(&m, "url")), (0, 0), "freed");
        assert!(m.held.by_hash.is_empty(), "no freed metadata is found");
        assert!(
            m.fields.fields.iter().all(|(_, v)| v.by_hash.is_empty()),
            "no freed value is found"
        );
        // Freed numbers are reused, and the value is numbered anew.
        let again = m.take(Arc::new(json!({"team": "ops"})));
        assert_eq!(m.get(again), json!({"team": "ops"}));
        assert_eq!(live(&m, "team"), 1);
        assert_eq!(
            m.take(Arc::new(json!({"team": "ops"}))),
            again,
            "an equal value (another allocation) shares the number"
        );
    }

    #[test]
    fn metadata_whose_hashes_collide_are_numbered_apart() {
        let mut m = Metadata::default();
        let (a, b) = (json!({"team": "search"}), json!({"team": "llm"}));
        let na = m.take(Arc::new(a.clone()));
        // b's hash made to lead to a's number, as a collision would.
        m.held.by_hash.insert(json_hash(&b), na);
        let nb = m.take(Arc::new(b.clone()));
        assert_ne!(na, nb);
        assert_eq!((m.get(na), m.get(nb)), (a, b));
        // A field's values likewise ("search" is the team's value 0).
        let team = m.fields.by_key["team"];
        let ops = json!("ops");
        m.fields.fields[team as usize]
            .1
            .by_hash
            .insert(json_hash(&ops), 0);
        let (f, n) = m.fields.take("team", &ops);
        assert_eq!(f, team);
        assert_ne!(n, 0);
        assert_eq!(
            (m.fields.value((team, 0)), m.fields.value((team, n))),
            (&json!("search"), &ops)
        );
    }

    #[test]
    fn metadata_that_is_not_an_object_is_kept_whole() {
        let mut m = Metadata::default();
        let list = m.take(Arc::new(json!([1, "x"])));
        let null = m.take(Arc::new(json!(null)));
        assert_eq!(m.take(Arc::new(json!([1, "x"]))), list);
        assert_ne!(list, null);
        assert_eq!((m.get(list), m.get(null)), (json!([1, "x"]), json!(null)));
        let filter = |f: serde_json::Value| ragtime_core::Filter::parse(&f, "filter").expect("f");
        let missing = filter(json!({"x": {"$ne": 1}}));
        assert_eq!(m.allowed(&missing), vec![true, true]);
        assert_eq!(m.allowed(&filter(json!({"x": 1}))), vec![false, false]);
        m.release(list);
        m.release(list);
        assert_eq!(m.allowed(&missing), vec![false, true], "freed");
        assert!(m.fields.fields.is_empty(), "no field taken");
    }

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
