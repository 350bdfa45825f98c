//! HNSW over unit vectors (dot product = cosine similarity), filtered by
//! metadata, holding each vector once at full precision. The graph is
//! usearch's ([`Graph`] says why not hnsw_rs's).
//!
//! The graph walks int8 copies of the vectors (a quarter of the memory,
//! and a cheaper distance) and the candidates it returns are rescored
//! exactly from the full-precision vectors, as Qdrant does with scalar
//! quantization: the walk only has to bring the true neighbours into its
//! candidate list, not order them. Exact scans (small collections, narrow
//! filters) read the full-precision vectors directly. A wider filter is
//! applied inside the walk, which goes on until its list holds enough
//! points the filter allows. The list grows with the
//! collection ([`DenseParams::ef_for`]): a walk of the same length reaches
//! a smaller share of a larger graph.
//!
//! The full-precision vectors sit in one flat allocation (a slot per
//! point) rather than a vector per point in a map: the graph's walk never
//! reads them, so they are kept where a later step can move them out of
//! the heap as one block.

use crate::collection::Allowed;
use crate::{Hit, IndexError};
use ragtime_core::Cancel;
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError, RwLock};
use tantivy::directory::OwnedBytes;
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

/// HNSW and filtered-search settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseParams {
    /// Links per node (M).
    pub m: usize,
    pub ef_construction: usize,
    /// Candidate list size for graph searches of a collection up to
    /// `ef_reference` points; every candidate is rescored at full
    /// precision.
    pub ef_search: usize,
    /// Past `ef_reference` points the candidate list grows as
    /// `(points / ef_reference)^ef_growth` (see [`DenseParams::ef_for`]):
    /// a walk of the same length reaches a smaller share of a larger graph.
    pub ef_reference: usize,
    pub ef_growth: f32,
    /// ... up to this many candidates.
    pub ef_max: usize,
    /// Allowed sets up to this size are scanned exactly ...
    pub exact_below: usize,
    /// ... and so are allowed sets below this share of the collection.
    pub exact_fraction: f32,
}

impl Default for DenseParams {
    fn default() -> Self {
        Self {
            m: 24,
            // 256, not 128: on the `vectors` bench's million SciFact-like
            // points a graph built at 256 finds 0.95 of the ten nearest
            // with half the walk (0.966 at 1,280 candidates, against
            // 0.946 at 2,560 built at 128; `docs/scaling.md`), and its
            // build stays within minutes.
            ef_construction: 256,
            ef_search: 160,
            ef_reference: 100_000,
            ef_growth: EF_GROWTH,
            ef_max: 4096,
            exact_below: 4096,
            exact_fraction: 0.2,
        }
    }
}

/// How fast the candidate list grows with the collection: chosen on the
/// `vectors` bench's first 200 queries (SciFact's embeddings and perturbed
/// copies), checked on the next 200 (`docs/scaling.md`). At 100k points
/// 160 candidates find 0.998 of the ten nearest; at 1M, on a graph built
/// at `ef_construction` 256, 1,280 find 0.966 (0.973 on the unseen
/// queries; 640 find 0.935), so 160 · 10^0.9 ≈ 1,270 at 1M, and `ef_max`
/// from about 3.7M on.
pub const EF_GROWTH: f32 = 0.9;

impl DenseParams {
    /// The candidate list of a graph search over `points` points:
    /// `ef_search` up to `ef_reference` points, then growing as a power of
    /// the collection's size, at most `ef_max` (and never under
    /// `ef_search`).
    pub fn ef_for(&self, points: usize) -> usize {
        let ratio = points as f64 / self.ef_reference.max(1) as f64;
        if ratio <= 1.0 {
            return self.ef_search;
        }
        let grown = self.ef_search as f64 * ratio.powf(f64::from(self.ef_growth));
        (grown.round() as usize).clamp(self.ef_search, self.ef_max.max(self.ef_search))
    }
}

/// How a dense search found its hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchPath {
    Graph,
    FilteredGraph,
    Exact,
    Cancelled,
}

/// A unit vector's components are quantized to int8 over
/// `[-clip, clip]`, `clip = CLIP_SIGMAS / sqrt(dim)`: a unit vector's
/// components have a standard deviation near `1/sqrt(dim)`, so the range
/// spans that many of them and the rare larger component saturates. One
/// scale for every vector of every collection (not one fitted to a
/// collection's first batch, which a later batch may not resemble), so
/// int8 dot products compare across points.
pub const CLIP_SIGMAS: f32 = 6.0;

fn clip_at(dim: usize, sigmas: f32) -> f32 {
    (sigmas / (dim.max(1) as f32).sqrt()).min(1.0)
}

/// The int8 form of `v` the graph walks.
pub fn quantize(v: &[f32]) -> Vec<i8> {
    quantize_at(v, CLIP_SIGMAS)
}

/// `v` quantized over `[-c, c]`, `c = sigmas / sqrt(dim)` (how
/// [`CLIP_SIGMAS`] was chosen: `ragtime-bench vectors`).
pub fn quantize_at(v: &[f32], sigmas: f32) -> Vec<i8> {
    let scale = 127.0 / clip_at(v.len(), sigmas);
    v.iter()
        .map(|x| (x * scale).round().clamp(-127.0, 127.0) as i8)
        .collect()
}

/// Integer dot product in sixteen independent lanes so it vectorises.
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: i32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += i32::from(x[i]) * i32::from(y[i]);
        }
    }
    acc.iter().sum::<i32>() + tail
}

/// The graph's file in a saved index (usearch's own format: its header,
/// every point's int8 vector and links, its keys).
const GRAPH_FILE: &str = "dense.usearch";
/// The full-precision vectors' file beside the graph's dump.
const VECTORS_FILE: &str = "dense.vectors";
/// Its first bytes. Then the dimension and the count (u64 each), every
/// point's id (u64), and every point's floats in the same order, all
/// little-endian: the floats start 4-byte aligned, so a mapped file is read
/// in place.
const VECTORS_MAGIC: &[u8; 8] = b"RTVEC\x002\n";
const HEADER: usize = 24;

/// A slot number with this bit set is a point's place in the mapped file.
const MAPPED: u32 = 1 << 31;

/// The full-precision vectors: those of an opened index read in place from
/// its memory-mapped file (the page cache holds them, not the heap), and
/// those written since in one heap allocation of `dim`-float slots. A
/// removed heap point's slot is reused by the next insert; a rewritten or
/// removed mapped point just stops being referenced.
struct Vectors {
    dim: usize,
    /// The mapped file, and where in it the floats begin.
    mapped: Option<(OwnedBytes, usize)>,
    data: Vec<f32>,
    slots: HashMap<usize, u32>,
    free: Vec<u32>,
}

impl Vectors {
    fn new(dim: usize) -> Self {
        Self {
            dim,
            mapped: None,
            data: Vec::new(),
            slots: HashMap::new(),
            free: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, slot: u32) -> &[f32] {
        if slot & MAPPED != 0 {
            let (map, floats) = self.mapped.as_ref().expect("a mapped slot has its map");
            let at = floats + (slot & !MAPPED) as usize * 4 * self.dim;
            // Aligned: the map starts on a page, the floats at a multiple of
            // 8 bytes (checked when opened).
            bytemuck::cast_slice(&map.as_slice()[at..at + 4 * self.dim])
        } else {
            let at = slot as usize * self.dim;
            &self.data[at..at + self.dim]
        }
    }

    fn get(&self, id: usize) -> Option<&[f32]> {
        self.slots.get(&id).map(|s| self.slot(*s))
    }

    fn insert(&mut self, id: usize, v: &[f32]) {
        let slot = match self.slots.get(&id) {
            Some(s) if s & MAPPED == 0 => *s,
            _ => {
                let s = self.free.pop().unwrap_or_else(|| {
                    let s = (self.data.len() / self.dim) as u32;
                    self.data.resize(self.data.len() + self.dim, 0.0);
                    s
                });
                self.slots.insert(id, s);
                s
            }
        };
        let at = slot as usize * self.dim;
        self.data[at..at + self.dim].copy_from_slice(v);
    }

    fn remove(&mut self, id: usize) -> bool {
        match self.slots.remove(&id) {
            Some(s) => {
                if s & MAPPED == 0 {
                    self.free.push(s);
                }
                true
            }
            None => false,
        }
    }

    fn iter(&self) -> impl Iterator<Item = (usize, &[f32])> {
        self.slots.iter().map(|(id, s)| (*id, self.slot(*s)))
    }

    /// Heap bytes held: the slots (free ones included) and the map.
    fn bytes(&self) -> usize {
        self.data.capacity() * 4 + self.slots.capacity() * 24 + self.free.capacity() * 4
    }

    /// Bytes of the file read in place (the page cache holds what of it
    /// was read; the kernel gives it back under pressure).
    fn mapped_bytes(&self) -> usize {
        self.mapped.as_ref().map_or(0, |(map, _)| map.len())
    }

    /// Writes the file [`Vectors::open`] reads (the snapshot's save syncs
    /// every file it wrote, this one with them).
    fn save(&self, path: &Path) -> Result<(), IndexError> {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        out.write_all(VECTORS_MAGIC)?;
        out.write_all(&(self.dim as u64).to_le_bytes())?;
        out.write_all(&(self.len() as u64).to_le_bytes())?;
        let mut ids: Vec<(usize, u32)> = self.slots.iter().map(|(id, s)| (*id, *s)).collect();
        ids.sort_unstable();
        for (id, _) in &ids {
            out.write_all(&(*id as u64).to_le_bytes())?;
        }
        for (_, slot) in &ids {
            for x in self.slot(*slot) {
                out.write_all(&x.to_le_bytes())?;
            }
        }
        out.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    }

    /// The vectors [`Vectors::save`] wrote, mapped and read in place,
    /// keeping the points `keep` accepts (and naming those it did not);
    /// an error for another dimension
    /// or a file of the wrong length. The file must not change while
    /// mapped: a saved index's files are written once and never rewritten
    /// (a folder that is replaced is removed, and a removed file stays
    /// readable while mapped).
    fn open(
        path: &Path,
        dim: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Result<(Self, Vec<usize>), IndexError> {
        let bad = |what: &str| IndexError::Snapshot(format!("{}: {what}", path.display()));
        let map = crate::map_file(path)?;
        if map.len() < HEADER || &map.as_slice()[..8] != VECTORS_MAGIC {
            return Err(bad("not a vectors file"));
        }
        let word =
            |at: usize| u64::from_le_bytes(map.as_slice()[at..at + 8].try_into().expect("8 bytes"));
        if word(8) != dim as u64 {
            return Err(bad(&format!(
                "vectors of {} dimensions, the index has {dim}",
                word(8)
            )));
        }
        let count = word(16) as usize;
        if count >= MAPPED as usize
            || Some(map.len()) != count.checked_mul(8 + 4 * dim).map(|b| b + HEADER)
        {
            return Err(bad(&format!(
                "{} bytes do not hold {count} vectors",
                map.len()
            )));
        }
        if cfg!(target_endian = "big")
            || bytemuck::try_cast_slice::<u8, f32>(&map.as_slice()[HEADER + 8 * count..]).is_err()
        {
            return Err(bad("the floats cannot be read in place on this machine"));
        }
        let mut me = Self::new(dim);
        let mut dropped = Vec::new();
        for i in 0..count {
            let id = word(HEADER + 8 * i) as usize;
            if !keep(id) {
                dropped.push(id);
            } else if me.slots.insert(id, i as u32 | MAPPED).is_some() {
                return Err(bad(&format!("point {id} is in the file twice")));
            }
        }
        me.mapped = Some((map, HEADER + 8 * count));
        Ok((me, dropped))
    }
}

/// How many calls may be inside one graph at once, at most. usearch gives
/// each running search or insert one of a fixed set of thread contexts
/// (its candidate lists and visited set) and fails a call that finds none
/// free, so a call past the graph's count waits at [`Gate`] for one.
const CONTEXTS: usize = 64;

/// Points from which a graph has [`CONTEXTS`] contexts. usearch sizes a
/// graph's striped node locks by its contexts (4 × contexts × M stripes
/// of a cache line each: 1 MiB at 64 and M = 24, made and touched when
/// the graph is), so a small graph — most collections of a tenant-heavy
/// service are — takes [`small_graph_contexts`], and its searches, which
/// take microseconds, queue for one of them.
const FULL_CONTEXTS_FROM: usize = 4096;

/// The contexts of a graph under [`FULL_CONTEXTS_FROM`] points: twice the
/// cores, at least 4.
fn small_graph_contexts() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cores).clamp(4, CONTEXTS)
}

/// The contexts a graph of `capacity` points is given.
fn contexts_for(capacity: usize) -> usize {
    if capacity >= FULL_CONTEXTS_FROM {
        CONTEXTS
    } else {
        small_graph_contexts()
    }
}

/// A counting gate in front of a graph's contexts.
struct Gate {
    free: Mutex<usize>,
    freed: Condvar,
}

struct Pass<'a>(&'a Gate);

impl Gate {
    fn new(contexts: usize) -> Self {
        Self {
            free: Mutex::new(contexts),
            freed: Condvar::new(),
        }
    }

    /// `more` contexts added (the graph was given them).
    fn widen(&self, more: usize) {
        *self.free.lock().unwrap_or_else(PoisonError::into_inner) += more;
        self.freed.notify_all();
    }

    fn enter(&self) -> Pass<'_> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Pass(self)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

/// The HNSW graph over the int8 vectors: usearch's, not hnsw_rs's.
/// Measured (`docs/scaling.md`): hnsw_rs holds every link as its own
/// reference-counted allocation and every point a vector per possible
/// layer, about 2.3 KiB a point at M = 24 (3.5 GiB of `RssAnon` for a
/// graph of 1M points, past the 1.5 GiB a replica of 1M chunks should
/// hold in all), and reads its dump point by point (most of a 39 s start
/// at 1M). usearch keeps each point's links as 32-bit slots in one
/// block beside its int8 vector, saves and loads the graph as one file,
/// takes inserts and searches from many threads, and reuses a removed
/// point's slot for the next insert.
pub(crate) struct Graph {
    index: Index,
    /// The calls inside it, at most its contexts.
    gate: Gate,
    /// Its contexts ([`contexts_for`]).
    contexts: usize,
}

impl Graph {
    fn new(dim: usize, params: &DenseParams) -> Result<Self, IndexError> {
        let options = IndexOptions {
            dimensions: dim,
            // 1 − the int8 dot product: every quantized vector shares one
            // scale, so this orders neighbours as the cosine does, which
            // is all the walk needs (hits are scored from the
            // full-precision vectors).
            metric: MetricKind::IP,
            quantization: ScalarKind::I8,
            connectivity: params.m,
            expansion_add: params.ef_construction,
            expansion_search: params.ef_search,
            multi: false,
        };
        let index = Index::new(&options).map_err(graph_error("making the graph"))?;
        Self::sized(index, 16)
    }

    /// `index` with room for `capacity` points and the contexts that
    /// many take.
    fn sized(index: Index, capacity: usize) -> Result<Self, IndexError> {
        let contexts = contexts_for(capacity);
        index
            .reserve_capacity_and_threads(capacity, contexts)
            .map_err(graph_error("sizing the graph"))?;
        Ok(Self {
            index,
            gate: Gate::new(contexts),
            contexts,
        })
    }

    /// Room for `capacity` points, with the contexts that many take. Only
    /// with no call inside (the caller holds the graph alone).
    fn grow(&mut self, capacity: usize) -> Result<(), IndexError> {
        let contexts = contexts_for(capacity).max(self.contexts);
        self.index
            .reserve_capacity_and_threads(capacity, contexts)
            .map_err(graph_error("growing the graph"))?;
        self.gate.widen(contexts - self.contexts);
        self.contexts = contexts;
        Ok(())
    }

    /// The graph saved at `path`, checked to be one of `dim` int8
    /// dimensions.
    fn load(path: &Path, dim: usize) -> Result<Self, IndexError> {
        let name = path
            .to_str()
            .ok_or_else(|| IndexError::Snapshot(format!("{}: not a UTF-8 path", path.display())))?;
        let meta = Index::metadata(name).map_err(graph_error("reading the graph's header"))?;
        if meta.dimensions != dim as u64
            || meta.quantization != ScalarKind::I8
            || meta.metric != MetricKind::IP
            || meta.multi
        {
            return Err(IndexError::Snapshot(format!(
                "the saved graph has {} dimensions of {:?} by {:?}, the index {dim} of I8 by IP",
                meta.dimensions, meta.quantization, meta.metric
            )));
        }
        let index = Index::new(&IndexOptions::from(meta))
            .map_err(graph_error("making the graph to load"))?;
        index.load(name).map_err(graph_error("loading the graph"))?;
        let capacity = index.size() + 16;
        Self::sized(index, capacity)
    }

    /// Inserts (or replaces) one point; an error is logged, not returned:
    /// the vector is still held at full precision, where exact scans find
    /// it, and the next rebuild adds it.
    fn insert(&self, id: u64, q: &[i8]) {
        let _pass = self.gate.enter();
        if self.index.contains(id) {
            let _ = self.index.remove(id);
        }
        if let Err(e) = self.index.add(id, q) {
            tracing::error!(error = %e, chunk_id = id, "inserting into the HNSW graph failed");
        }
    }

    /// Inserts points, on every core for a batch worth it.
    fn insert_all(&self, items: &[(u64, Vec<i8>)]) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if items.len() > 64 && threads > 1 {
            std::thread::scope(|s| {
                for part in items.chunks(items.len().div_ceil(threads)) {
                    s.spawn(move || {
                        for (id, q) in part {
                            self.insert(*id, q);
                        }
                    });
                }
            });
        } else {
            for (id, q) in items {
                self.insert(*id, q);
            }
        }
    }

    /// The `count` points nearest `q` that `allow` accepts (every point
    /// when `None`), nearest first.
    fn search(&self, q: &[i8], count: usize, allow: Option<&dyn Fn(u64) -> bool>) -> Vec<u64> {
        let _pass = self.gate.enter();
        let found = match allow {
            None => self.index.search(q, count),
            Some(allow) => self.index.filtered_search(q, count, allow),
        };
        match found {
            Ok(m) => m.keys,
            Err(e) => {
                tracing::error!(error = %e, "searching the HNSW graph failed");
                Vec::new()
            }
        }
    }
}

fn graph_error<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> IndexError {
    move |e| IndexError::Snapshot(format!("{what}: {e}"))
}

pub struct Dense {
    dim: usize,
    params: DenseParams,
    /// Made at the first insert: an empty collection holds no graph.
    /// Searches and inserts hold it shared (the graph takes concurrent
    /// calls); growing its capacity or replacing it holds it alone.
    graph: RwLock<Option<Graph>>,
    vectors: RwLock<Vectors>,
    /// How many points `vectors` holds, set under its write lock, so that
    /// a search reads it without taking the lock a second time (behind a
    /// waiting writer, a second read would wait for the write).
    live: AtomicUsize,
    /// Points removed since the graph was built: their slots stay in the
    /// graph (reused by the next inserts) and are walked through.
    removed: AtomicUsize,
    /// A fixed candidate list for graph searches, set by
    /// [`Dense::set_ef_search`]; 0 follows [`DenseParams::ef_for`].
    ef_fixed: AtomicUsize,
}

/// Dot product in eight independent lanes so it vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn top_k(mut hits: Vec<Hit>, k: usize) -> Vec<Hit> {
    let by_score = |a: &Hit, b: &Hit| {
        b.score
            .total_cmp(&a.score)
            .then(a.chunk_id.cmp(&b.chunk_id))
    };
    if hits.len() > k {
        hits.select_nth_unstable_by(k, by_score);
        hits.truncate(k);
    }
    hits.sort_by(by_score);
    hits
}

impl Dense {
    pub fn new(dim: usize, params: DenseParams) -> Self {
        Self {
            dim,
            params,
            graph: RwLock::new(None),
            vectors: RwLock::new(Vectors::new(dim)),
            live: AtomicUsize::new(0),
            removed: AtomicUsize::new(0),
            ef_fixed: AtomicUsize::new(0),
        }
    }

    /// The candidate list of a graph search over `points` points.
    fn ef_search(&self, points: usize) -> usize {
        match self.ef_fixed.load(Ordering::Relaxed) {
            0 => self.params.ef_for(points),
            fixed => fixed,
        }
    }

    /// Fixes the candidate list of graph searches from now on, whatever
    /// the collection's size (a search already running keeps its own);
    /// `None` goes back to [`DenseParams::ef_for`].
    pub fn set_ef_search(&self, ef: Option<usize>) {
        self.ef_fixed
            .store(ef.map_or(0, |e| e.max(1)), Ordering::Relaxed);
    }

    /// The memory the graph and the vectors hold: the full-precision
    /// slots and their map, and the graph's own count of its allocations
    /// (int8 vectors, links, keys).
    pub fn memory_bytes(&self) -> usize {
        let vectors = self
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes();
        let graph = self
            .graph
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |g| g.index.memory_usage());
        vectors + graph
    }

    /// Bytes of the files the index reads in place.
    pub fn mapped_bytes(&self) -> usize {
        self.vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .mapped_bytes()
    }

    fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub fn check_dim(&self, v: &[f32]) -> Result<(), IndexError> {
        if v.len() == self.dim {
            Ok(())
        } else {
            Err(IndexError::Dim {
                got: v.len(),
                want: self.dim,
            })
        }
    }

    /// Makes the graph if there is none and grows its capacity to take
    /// `more` points (by half again at least, so a stream of small
    /// batches does not resize at each).
    fn reserve(&self, more: usize) -> Result<(), IndexError> {
        {
            let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(g) = graph.as_ref()
                && g.index.size() + more <= g.index.capacity()
            {
                return Ok(());
            }
        }
        let mut graph = self.graph.write().unwrap_or_else(PoisonError::into_inner);
        let g = match graph.as_mut() {
            Some(g) => g,
            None => graph.insert(Graph::new(self.dim, &self.params)?),
        };
        let (size, capacity) = (g.index.size(), g.index.capacity());
        if size + more > capacity {
            g.grow((size + more).max(capacity + capacity / 2))?;
        }
        Ok(())
    }

    pub fn add<'a>(&self, items: impl Iterator<Item = (i64, &'a [f32])>) {
        let items: Vec<(i64, &[f32])> = items.collect();
        if items.is_empty() {
            return;
        }
        let quantized: Vec<(u64, Vec<i8>)> = items
            .iter()
            .map(|(id, v)| (*id as u64, quantize(v)))
            .collect();
        match self.reserve(quantized.len()) {
            Ok(()) => {
                let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
                if let Some(g) = graph.as_ref() {
                    g.insert_all(&quantized);
                }
            }
            // The vectors are still held (exact scans find them); the
            // next rebuild inserts them.
            Err(e) => tracing::error!(error = %e, "the HNSW graph could not take more points"),
        }
        let _ = self
            .removed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(items.len()))
            });
        let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
        for (id, v) in items {
            vectors.insert(id as usize, v);
        }
        self.live.store(vectors.len(), Ordering::Release);
    }

    pub fn remove(&self, ids: &[i64]) {
        let (live, removed) = {
            let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
            let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
            let mut gone = 0;
            for id in ids {
                if vectors.remove(*id as usize) {
                    gone += 1;
                    if let Some(g) = graph.as_ref() {
                        let _pass = g.gate.enter();
                        let _ = g.index.remove(*id as u64);
                    }
                }
            }
            self.live.store(vectors.len(), Ordering::Release);
            (
                vectors.len(),
                self.removed.fetch_add(gone, Ordering::Relaxed) + gone,
            )
        };
        // Removed points are walked through until inserts reuse their
        // slots; a collection that shrank by much is rebuilt instead.
        if removed > 1000 && removed * 4 > live {
            self.rebuild();
        }
    }

    /// Rebuilds the graph from the live vectors (drops removed points).
    pub fn rebuild(&self) {
        let quantized: Vec<(u64, Vec<i8>)> = self
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, v)| (id as u64, quantize(v)))
            .collect();
        let graph = match Graph::new(self.dim, &self.params).and_then(|mut g| {
            g.grow(quantized.len() + 16)?;
            Ok(g)
        }) {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "rebuilding the HNSW graph failed");
                return;
            }
        };
        graph.insert_all(&quantized);
        *self.graph.write().unwrap_or_else(PoisonError::into_inner) = Some(graph);
        self.removed.store(0, Ordering::Relaxed);
    }

    /// Writes the graph (with its int8 points) into `dir` as
    /// `dense.usearch` and the full-precision vectors as `dense.vectors`;
    /// nothing for an empty index.
    pub fn save(&self, dir: &Path) -> Result<(), IndexError> {
        let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
        let Some(g) = graph.as_ref() else {
            return Ok(());
        };
        let path = dir.join(GRAPH_FILE);
        let name = path
            .to_str()
            .ok_or_else(|| IndexError::Snapshot(format!("{}: not a UTF-8 path", path.display())))?;
        g.index
            .save(name)
            .map_err(graph_error("saving the graph"))?;
        self.vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .save(&dir.join(VECTORS_FILE))
    }

    /// The graph saved in `dir` (`None` when none was: an empty index),
    /// checked to be of `dim` dimensions.
    pub(crate) fn read_graph(dir: &Path, dim: usize) -> Result<Option<Graph>, IndexError> {
        let path = dir.join(GRAPH_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        Graph::load(&path, dim).map(Some)
    }

    /// The index [`Dense::save`] wrote into `dir`, its graph read by
    /// [`Dense::read_graph`]; `live` says which of its points still hold a
    /// chunk (the others are removed from the graph). An empty index when
    /// `dir` holds no graph; an error when the vectors are damaged, of
    /// another dimension or not the ones the graph's points were made
    /// from, or the graph and the vectors hold different points.
    pub(crate) fn with_graph(
        dim: usize,
        params: DenseParams,
        dir: &Path,
        graph: Option<Graph>,
        live: impl Fn(usize) -> bool,
    ) -> Result<Self, IndexError> {
        let me = Self::new(dim, params);
        let Some(graph) = graph else {
            return Ok(me);
        };
        let (vectors, dropped) = Vectors::open(&dir.join(VECTORS_FILE), dim, &live)?;
        let mismatch = |what: String| Err(IndexError::Snapshot(what));
        if graph.index.size() != vectors.len() + dropped.len() {
            return mismatch(format!(
                "{} vectors, {} points in the graph",
                vectors.len() + dropped.len(),
                graph.index.size()
            ));
        }
        let mut point = vec![0i8; dim];
        for (i, (id, v)) in vectors.iter().enumerate() {
            if !graph.index.contains(id as u64) {
                return mismatch(format!("chunk {id} has a vector but no graph point"));
            }
            // The same ids and dimension are not enough: the vectors must
            // be the ones the graph's int8 points were made from (checked
            // on a sample; a copy from another snapshot fails it).
            if i < 64
                && (graph.index.get(id as u64, &mut point).ok() != Some(1) || quantize(v) != point)
            {
                return mismatch(format!(
                    "the vector of chunk {id} is not the one its graph point was made from"
                ));
            }
        }
        for id in &dropped {
            let _ = graph.index.remove(*id as u64);
        }
        me.removed.store(dropped.len(), Ordering::Relaxed);
        me.live.store(vectors.len(), Ordering::Release);
        *me.vectors.write().unwrap_or_else(PoisonError::into_inner) = vectors;
        *me.graph.write().unwrap_or_else(PoisonError::into_inner) = Some(graph);
        Ok(me)
    }

    /// The similarity of `query` to each point (`None` for one not held).
    pub fn similarities(&self, query: &[f32], ids: &[i64]) -> Vec<Option<f32>> {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        ids.iter()
            .map(|id| {
                vectors
                    .get(*id as usize)
                    .filter(|v| v.len() == query.len())
                    .map(|v| dot(query, v))
            })
            .collect()
    }

    /// The `k` best of the graph's candidates, rescored at full precision.
    fn rescore(&self, query: &[f32], candidates: Vec<u64>, k: usize) -> Vec<Hit> {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        let hits = candidates
            .into_iter()
            .filter_map(|id| {
                vectors.get(id as usize).map(|v| Hit {
                    chunk_id: id as i64,
                    score: dot(query, v),
                })
            })
            .collect();
        top_k(hits, k)
    }

    /// The exact `k` best of `ids` (all points when `None`).
    fn scan(
        &self,
        query: &[f32],
        k: usize,
        ids: Option<&[usize]>,
        cancel: &Cancel,
    ) -> (Vec<Hit>, SearchPath) {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        let Some(ids) = ids else {
            let hits = vectors
                .iter()
                .map(|(id, v)| Hit {
                    chunk_id: id as i64,
                    score: dot(query, v),
                })
                .collect();
            return (top_k(hits, k), SearchPath::Exact);
        };
        let mut hits = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if i % 1024 == 1023 && cancel.is_cancelled() {
                return (top_k(hits, k), SearchPath::Cancelled);
            }
            if let Some(v) = vectors.get(*id) {
                hits.push(Hit {
                    chunk_id: *id as i64,
                    score: dot(query, v),
                });
            }
        }
        (top_k(hits, k), SearchPath::Exact)
    }

    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        allowed: &Allowed,
        total: usize,
        cancel: &Cancel,
    ) -> (Vec<Hit>, SearchPath) {
        if k == 0 || query.len() != self.dim {
            return (Vec::new(), SearchPath::Exact);
        }
        let live = self.live();
        if live == 0 {
            return (Vec::new(), SearchPath::Exact);
        }
        // The candidate list: every one is rescored at full precision.
        let ef = self.ef_search(total).max(k);
        match allowed {
            // A small collection is scanned exactly: as fast as the graph at
            // this size, and a point the graph cannot reach (near-duplicate
            // neighbours prune its in-links) is still found.
            Allowed::All if live <= self.params.exact_below => self.scan(query, k, None, cancel),
            Allowed::All => {
                let found = {
                    let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
                    let Some(g) = graph.as_ref() else {
                        return self.scan(query, k, None, cancel);
                    };
                    g.search(&quantize(query), ef, None)
                };
                (self.rescore(query, found, k), SearchPath::Graph)
            }
            Allowed::Only(only) => {
                let set = &only.chunks;
                let exact_limit = self
                    .params
                    .exact_below
                    .max((self.params.exact_fraction * total as f32) as usize);
                if set.len() <= exact_limit {
                    return self.scan(query, k, Some(set.as_slice()), cancel);
                }
                // The walk goes through every point but keeps only those
                // the filter allows, until it holds `ef` of them: a wider
                // filter walks a little further, never a list the filter
                // then empties.
                let found = {
                    let graph = self.graph.read().unwrap_or_else(PoisonError::into_inner);
                    let Some(g) = graph.as_ref() else {
                        return self.scan(query, k, Some(set.as_slice()), cancel);
                    };
                    let allow = |id: u64| set.binary_search(&(id as usize)).is_ok();
                    g.search(&quantize(query), ef, Some(&allow))
                };
                (self.rescore(query, found, k), SearchPath::FilteredGraph)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit vector with one large component among small ones, as
    /// sentence embeddings have.
    fn unit(dim: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut v: Vec<f32> = (0..dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        v[(seed as usize) % dim] += 1.0;
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn the_int8_distance_tracks_the_cosine() {
        let dim = 384;
        let c = clip_at(dim, CLIP_SIGMAS) / 127.0;
        let vs: Vec<Vec<f32>> = (0..50).map(|i| unit(dim, i)).collect();
        let mut worst = 0f32;
        for a in &vs {
            for b in &vs {
                let exact = dot(a, b);
                let approx = dot_i8(&quantize(a), &quantize(b)) as f32 * c * c;
                // A saturated component (the large one) loses its excess,
                // so compare only where neither saturates.
                if a.iter()
                    .chain(b)
                    .all(|x| x.abs() < clip_at(dim, CLIP_SIGMAS))
                {
                    worst = worst.max((exact - approx).abs());
                }
            }
        }
        assert!(worst < 0.01, "int8 dot off by {worst}");
        // The int8 dot product orders points as the cosine does, but for
        // ties closer than the quantization's error.
        let q = quantize(&vs[0]);
        for a in &vs[1..] {
            for b in &vs[1..] {
                if dot(&vs[0], a) > dot(&vs[0], b) + 0.01 {
                    assert!(dot_i8(&q, &quantize(a)) > dot_i8(&q, &quantize(b)));
                }
            }
        }
    }

    #[test]
    fn slots_are_reused_and_each_vector_is_held_once() {
        let mut v = Vectors::new(4);
        v.insert(7, &[1.0, 0.0, 0.0, 0.0]);
        v.insert(9, &[0.0, 1.0, 0.0, 0.0]);
        assert!(v.remove(7));
        assert!(!v.remove(7));
        v.insert(11, &[0.0, 0.0, 1.0, 0.0]);
        assert_eq!(v.data.len(), 8, "the freed slot was reused");
        assert_eq!(v.get(11), Some(&[0.0, 0.0, 1.0, 0.0][..]));
        assert_eq!(v.get(9), Some(&[0.0, 1.0, 0.0, 0.0][..]));
        assert_eq!(v.get(7), None);
        v.insert(9, &[0.5, 0.5, 0.5, 0.5]);
        assert_eq!(v.len(), 2);
        assert_eq!(v.get(9), Some(&[0.5, 0.5, 0.5, 0.5][..]));
    }
}
