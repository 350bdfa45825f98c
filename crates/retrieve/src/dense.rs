//! HNSW over unit vectors (dot product = cosine similarity), filtered by
//! metadata, holding each vector once at full precision.
//!
//! The graph walks int8 copies of the vectors (a quarter of the memory,
//! and a cheaper distance) and the candidates it returns are rescored
//! exactly from the full-precision vectors, as Qdrant does with scalar
//! quantization: the walk only has to bring the true neighbours into its
//! candidate list, not order them. Exact scans (small collections, narrow
//! filters) read the full-precision vectors directly. A wider filter (or a
//! graph with tombstones) widens the walk by the share of points that may
//! be returned and drops the rest after it. The list grows with the
//! collection ([`DenseParams::ef_for`]): a walk of the same length reaches
//! a smaller share of a larger graph.
//!
//! The full-precision vectors sit in one flat allocation (a slot per
//! point) rather than a vector per point in a map: the graph's walk never
//! reads them, so they are kept where a later step can move them out of
//! the heap as one block.

use crate::collection::Allowed;
use crate::{Hit, IndexError};
use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::api::AnnT;
use hnsw_rs::hnswio::HnswIo;
use hnsw_rs::prelude::{Hnsw, Neighbour};
use ragtime_core::Cancel;
use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use tantivy::directory::{Advice, Directory, MmapDirectory, OwnedBytes};

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
            ef_construction: 128,
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
/// 160 candidates find 0.998 of the ten nearest; at 1M the same graph
/// needs about 2,500 for 0.95 (0.946 at 2,560, 0.955 at 3,840: the walk's
/// gains flatten there), so 160 · 10^1.2 ≈ 2,500 at 1M, and `ef_max` from
/// about 2.6M on.
pub const EF_GROWTH: f32 = 1.2;

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

/// The graph's distance between two int8 vectors: `1 − a·b / (127²·dim)`,
/// in [0, 2]. Every quantized vector shares one scale, so this is an
/// increasing function of the approximate cosine distance: it orders
/// neighbours as the cosine does, which is all the walk needs (the hits'
/// scores come from the full-precision vectors).
#[derive(Debug, Clone, Copy, Default)]
pub struct DotI8;

impl Distance<i8> for DotI8 {
    fn eval(&self, a: &[i8], b: &[i8]) -> f32 {
        let full = (127 * 127) as f32 * a.len().max(1) as f32;
        1.0 - dot_i8(a, b) as f32 / full
    }
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

pub(crate) type Graph = Hnsw<'static, i8, DotI8>;

/// The base name of the graph's dump files.
const DUMP: &str = "dense";
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
    /// keeping the points `keep` accepts; an error for another dimension
    /// or a file of the wrong length. The file must not change while
    /// mapped: a saved index's files are written once and never rewritten
    /// (a folder that is replaced is removed, and a removed file stays
    /// readable while mapped).
    fn open(path: &Path, dim: usize, keep: impl Fn(usize) -> bool) -> Result<Self, IndexError> {
        let bad = |what: &str| IndexError::Snapshot(format!("{}: {what}", path.display()));
        let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(bad("not a file"));
        };
        // tantivy's memory-mapped directory: the map without unsafe code
        // here (the workspace forbids it).
        let folder = MmapDirectory::open_with_madvice(folder, Advice::Random)
            .map_err(|e| bad(&e.to_string()))?;
        let map = folder
            .open_read(Path::new(name))
            .map_err(|e| bad(&e.to_string()))?
            .read_bytes()?;
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
        for i in 0..count {
            let id = word(HEADER + 8 * i) as usize;
            if keep(id) && me.slots.insert(id, i as u32 | MAPPED).is_some() {
                return Err(bad(&format!("point {id} is in the file twice")));
            }
        }
        me.mapped = Some((map, HEADER + 8 * count));
        Ok(me)
    }
}

pub struct Dense {
    dim: usize,
    params: DenseParams,
    /// Made at the first insert: an empty collection holds no graph.
    graph: RwLock<Option<Arc<Graph>>>,
    vectors: RwLock<Vectors>,
    /// Points still in the graph whose chunks are gone.
    deleted: RwLock<HashSet<usize>>,
    /// A fixed candidate list for graph searches, set by
    /// [`Dense::set_ef_search`]; 0 follows [`DenseParams::ef_for`].
    ef_fixed: std::sync::atomic::AtomicUsize,
}

fn new_graph(params: &DenseParams, capacity: usize) -> Graph {
    // `capacity` only sizes the first allocations (the graph grows past
    // it); a small collection gets a small graph.
    Hnsw::new(
        params.m,
        capacity.max(16),
        16,
        params.ef_construction,
        DotI8,
    )
}

/// Inserts points into the graph: in parallel for a batch worth it.
fn insert_all(graph: &Graph, items: &[(Vec<i8>, usize)]) {
    if items.len() > 64 {
        let refs: Vec<(&[i8], usize)> = items.iter().map(|(v, id)| (v.as_slice(), *id)).collect();
        graph.parallel_insert_slice(&refs);
    } else {
        for (v, id) in items {
            graph.insert_slice((v.as_slice(), *id));
        }
    }
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
            deleted: RwLock::new(HashSet::new()),
            ef_fixed: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The candidate list of a graph search over `points` points.
    fn ef_search(&self, points: usize) -> usize {
        match self.ef_fixed.load(std::sync::atomic::Ordering::Relaxed) {
            0 => self.params.ef_for(points),
            fixed => fixed,
        }
    }

    /// Fixes the candidate list of graph searches from now on, whatever
    /// the collection's size (a search already running keeps its own);
    /// `None` goes back to [`DenseParams::ef_for`].
    pub fn set_ef_search(&self, ef: Option<usize>) {
        self.ef_fixed.store(
            ef.map_or(0, |e| e.max(1)),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// An estimate of the memory the graph and the vectors hold: the
    /// full-precision slots and their map, and per graph point (tombstones
    /// included) its int8 copy, its layer-0 links (2·M of 16 bytes) and
    /// allocation overhead.
    pub fn memory_bytes(&self) -> usize {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        let points = vectors.len()
            + self
                .deleted
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .len();
        vectors.bytes() + points * (self.dim + 2 * self.params.m * 16 + 96)
    }

    /// Bytes of the files the index reads in place.
    pub fn mapped_bytes(&self) -> usize {
        self.vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .mapped_bytes()
    }

    fn live(&self) -> usize {
        self.vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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

    pub fn add<'a>(&self, items: impl Iterator<Item = (i64, &'a [f32])>) {
        let items: Vec<(i64, &[f32])> = items.collect();
        let quantized: Vec<(Vec<i8>, usize)> = items
            .iter()
            .map(|(id, v)| (quantize(v), *id as usize))
            .collect();
        let graph = {
            let mut g = self.graph.write().unwrap_or_else(PoisonError::into_inner);
            g.get_or_insert_with(|| Arc::new(new_graph(&self.params, items.len())))
                .clone()
        };
        insert_all(&graph, &quantized);
        let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
        let mut deleted = self.deleted.write().unwrap_or_else(PoisonError::into_inner);
        for (id, v) in items {
            deleted.remove(&(id as usize));
            vectors.insert(id as usize, v);
        }
    }

    pub fn remove(&self, ids: &[i64]) {
        let (live, dead) = {
            let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
            let mut deleted = self.deleted.write().unwrap_or_else(PoisonError::into_inner);
            for id in ids {
                if vectors.remove(*id as usize) {
                    deleted.insert(*id as usize);
                }
            }
            (vectors.len(), deleted.len())
        };
        // Too many tombstones slow searches and hurt recall: rebuild.
        if dead > 1000 && dead * 4 > live {
            self.rebuild();
        }
    }

    /// Rebuilds the graph from the live vectors (drops tombstones).
    pub fn rebuild(&self) {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        let graph = new_graph(&self.params, vectors.len());
        let quantized: Vec<(Vec<i8>, usize)> =
            vectors.iter().map(|(id, v)| (quantize(v), id)).collect();
        insert_all(&graph, &quantized);
        *self.graph.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(graph));
        self.deleted
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The graph as it is now (none before the first insert).
    fn current_graph(&self) -> Option<Arc<Graph>> {
        self.graph
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes the graph (with its int8 points) into `dir` as hnsw_rs's
    /// dump, `dense.hnsw.graph` and `dense.hnsw.data`, and the
    /// full-precision vectors as `dense.vectors`; nothing for an empty
    /// index.
    pub fn save(&self, dir: &Path) -> Result<(), IndexError> {
        let Some(graph) = self.current_graph() else {
            return Ok(());
        };
        let name = graph
            .file_dump(dir, DUMP)
            .map_err(|e| IndexError::Snapshot(format!("dumping the graph: {e:#}")))?;
        if name != DUMP {
            return Err(IndexError::Snapshot(format!(
                "the graph was dumped as {name}, not {DUMP}"
            )));
        }
        self.vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .save(&dir.join(VECTORS_FILE))
    }

    /// The graph saved in `dir` (`None` when none was: an empty index),
    /// checked to be of `dim` dimensions.
    pub(crate) fn read_graph(dir: &Path, dim: usize) -> Result<Option<Graph>, IndexError> {
        if !dir.join(format!("{DUMP}.hnsw.graph")).is_file() {
            return Ok(None);
        }
        // The loaded graph borrows its loader for its whole life (hnsw_rs
        // ties them with a lifetime, for the memory-mapped case); the
        // loader holds two paths and options, not the data, so it is
        // leaked: a few hundred bytes per load.
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, DUMP)));
        let graph: Graph = io
            .load_hnsw::<i8, DotI8>()
            .map_err(|e| IndexError::Snapshot(format!("loading the graph: {e:#}")))?;
        if graph.get_point_indexation().get_data_dimension() != dim {
            return Err(IndexError::Snapshot(format!(
                "the saved graph has {} dimensions, the index {dim}",
                graph.get_point_indexation().get_data_dimension()
            )));
        }
        Ok(Some(graph))
    }

    /// The index [`Dense::save`] wrote into `dir`, its graph read by
    /// [`Dense::read_graph`]; `live` says which of its points still hold a
    /// chunk (the rest are kept in the graph as tombstones, as they were).
    /// An empty index when `dir` holds no graph; an error when the vectors
    /// are damaged, of another dimension or of another form than the
    /// graph's points, or a live chunk has no vector.
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
        let vectors = Vectors::open(&dir.join(VECTORS_FILE), dim, &live)?;
        {
            let mut deleted = me.deleted.write().unwrap_or_else(PoisonError::into_inner);
            let mut in_graph = 0usize;
            for p in graph.get_point_indexation() {
                let id = p.get_origin_id();
                if let Some(v) = vectors.get(id) {
                    in_graph += 1;
                    // The same ids and dimension are not enough: the
                    // vectors must be the ones the graph's int8 points were
                    // made from (checked on a sample; a copy from another
                    // snapshot fails it).
                    if in_graph <= 64 && quantize(v) != p.get_v() {
                        return Err(IndexError::Snapshot(format!(
                            "the vector of chunk {id} is not the one its graph point was made from"
                        )));
                    }
                } else if live(id) {
                    return Err(IndexError::Snapshot(format!(
                        "chunk {id} is in the graph but has no vector"
                    )));
                } else {
                    deleted.insert(id);
                }
            }
            if in_graph != vectors.len() {
                return Err(IndexError::Snapshot(format!(
                    "{} vectors, {in_graph} of them in the graph",
                    vectors.len()
                )));
            }
        }
        *me.vectors.write().unwrap_or_else(PoisonError::into_inner) = vectors;
        *me.graph.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(graph));
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
    fn rescore(&self, query: &[f32], candidates: Vec<Neighbour>, k: usize) -> Vec<Hit> {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        let hits = candidates
            .into_iter()
            .filter_map(|n| {
                vectors.get(n.d_id).map(|v| Hit {
                    chunk_id: n.d_id as i64,
                    score: dot(query, v),
                })
            })
            .collect();
        top_k(hits, k)
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
        let Some(graph) = self.current_graph() else {
            return (Vec::new(), SearchPath::Exact);
        };
        match allowed {
            // A small collection is scanned exactly: as fast as the graph at
            // this size, and a point the graph cannot reach (near-duplicate
            // neighbours prune its in-links) is still found.
            Allowed::All if self.live() <= self.params.exact_below => {
                let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
                let hits = vectors
                    .iter()
                    .map(|(id, v)| Hit {
                        chunk_id: id as i64,
                        score: dot(query, v),
                    })
                    .collect();
                (top_k(hits, k), SearchPath::Exact)
            }
            Allowed::All => {
                let q = quantize(query);
                let ef = self.walk(k, total, total);
                let found = graph.search(&q, ef, ef);
                (
                    self.rescore(query, self.without_tombstones(found), k),
                    SearchPath::Graph,
                )
            }
            Allowed::Only(only) => {
                let set = &only.chunks;
                let exact_limit = self
                    .params
                    .exact_below
                    .max((self.params.exact_fraction * total as f32) as usize);
                if set.len() <= exact_limit {
                    let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
                    let mut hits = Vec::with_capacity(set.len());
                    for (i, id) in set.iter().enumerate() {
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
                } else {
                    let q = quantize(query);
                    let ef = self.walk(k, total, set.len());
                    let found = graph
                        .search(&q, ef, ef)
                        .into_iter()
                        .filter(|n| set.binary_search(&n.d_id).is_ok())
                        .collect();
                    (self.rescore(query, found, k), SearchPath::FilteredGraph)
                }
            }
        }
    }

    /// The candidate list of a walk that should bring back `ef_for(live)`
    /// candidates of which `allowed` of the graph's points are eligible:
    /// widened by the share of its points they are (tombstones included),
    /// at most `ef_max`.
    ///
    /// The walk is unfiltered and its candidates filtered after: hnsw_rs's
    /// own filtered walk goes on until its candidate queue is empty and
    /// re-filters its whole result list at each step past the stopping
    /// point, so its cost grows with the square of the list (a 50 % filter
    /// took 1 s at a list of 1,600 over a million points, against 17 ms
    /// for the unfiltered walk). Narrow filters never get here (an exact
    /// scan serves them), so the widening stays within a few times.
    fn walk(&self, k: usize, live: usize, allowed: usize) -> usize {
        let tombstones = self
            .deleted
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        let least = self.ef_search(live).max(k);
        let share = allowed.max(1) as f64 / (live + tombstones).max(1) as f64;
        ((least as f64 / share.min(1.0)).ceil() as usize)
            .clamp(least, self.params.ef_max.max(least))
    }

    /// A walk's candidates without the points whose chunks are gone.
    fn without_tombstones(&self, found: Vec<Neighbour>) -> Vec<Neighbour> {
        let deleted = self.deleted.read().unwrap_or_else(PoisonError::into_inner);
        if deleted.is_empty() {
            return found;
        }
        found
            .into_iter()
            .filter(|n| !deleted.contains(&n.d_id))
            .collect()
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
        // The distance orders points as the cosine does, but for ties
        // closer than the quantization's error.
        let q = quantize(&vs[0]);
        for a in &vs[1..] {
            for b in &vs[1..] {
                if dot(&vs[0], a) > dot(&vs[0], b) + 0.01 {
                    assert!(DotI8.eval(&q, &quantize(a)) < DotI8.eval(&q, &quantize(b)));
                }
            }
        }
        assert!(DotI8.eval(&q, &q) >= 0.0);
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
