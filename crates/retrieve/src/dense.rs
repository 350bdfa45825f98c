//! Filtered HNSW over unit vectors (dot product = cosine similarity).

use crate::collection::Allowed;
use crate::{Hit, IndexError};
use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::api::AnnT;
use hnsw_rs::hnswio::HnswIo;
use hnsw_rs::prelude::Hnsw;
use ragtime_core::Cancel;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

/// HNSW and filtered-search settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseParams {
    /// Links per node (M).
    pub m: usize,
    pub ef_construction: usize,
    /// Candidate list size for unfiltered searches.
    pub ef_search: usize,
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
            exact_below: 4096,
            exact_fraction: 0.2,
        }
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

/// Cosine distance for unit vectors: `1 − a·b`, clamped at 0 against
/// rounding (hnsw_rs's own `DistDot` asserts on it).
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitCosine;

impl Distance<f32> for UnitCosine {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

type Graph = Hnsw<'static, f32, UnitCosine>;

/// The base name of the graph's dump files.
const DUMP: &str = "dense";

pub struct Dense {
    dim: usize,
    params: DenseParams,
    /// Made at the first insert: an empty collection holds no graph.
    graph: RwLock<Option<Arc<Graph>>>,
    vectors: RwLock<HashMap<usize, Vec<f32>>>,
    /// Points still in the graph whose chunks are gone.
    deleted: RwLock<HashSet<usize>>,
}

fn new_graph(params: &DenseParams, capacity: usize) -> Graph {
    // `capacity` only sizes the first allocations (the graph grows past
    // it); a small collection gets a small graph.
    Hnsw::new(
        params.m,
        capacity.max(16),
        16,
        params.ef_construction,
        UnitCosine,
    )
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
            vectors: RwLock::new(HashMap::new()),
            deleted: RwLock::new(HashSet::new()),
        }
    }

    /// An estimate of the memory the graph and the vectors hold: each
    /// point's vector twice (the graph keeps its own copy), its layer-0
    /// links (2·M of 16 bytes) and map and allocation overhead.
    pub fn memory_bytes(&self) -> usize {
        let points = self
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            + self
                .deleted
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .len();
        points * (2 * self.dim * 4 + 2 * self.params.m * 16 + 96)
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
        let items: Vec<(Vec<f32>, usize)> =
            items.map(|(id, v)| (v.to_vec(), id as usize)).collect();
        let graph = {
            let mut g = self.graph.write().unwrap_or_else(PoisonError::into_inner);
            g.get_or_insert_with(|| Arc::new(new_graph(&self.params, items.len())))
                .clone()
        };
        let refs: Vec<(&Vec<f32>, usize)> = items.iter().map(|(v, id)| (v, *id)).collect();
        if refs.len() > 64 {
            graph.parallel_insert(&refs);
        } else {
            for (v, id) in &refs {
                graph.insert((v.as_slice(), *id));
            }
        }
        let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
        let mut deleted = self.deleted.write().unwrap_or_else(PoisonError::into_inner);
        for (v, id) in items {
            deleted.remove(&id);
            vectors.insert(id, v);
        }
    }

    pub fn remove(&self, ids: &[i64]) {
        let (live, dead) = {
            let mut vectors = self.vectors.write().unwrap_or_else(PoisonError::into_inner);
            let mut deleted = self.deleted.write().unwrap_or_else(PoisonError::into_inner);
            for id in ids {
                if vectors.remove(&(*id as usize)).is_some() {
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
        let refs: Vec<(&Vec<f32>, usize)> = vectors.iter().map(|(id, v)| (v, *id)).collect();
        graph.parallel_insert(&refs);
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

    /// Writes the graph (with its vectors) into `dir` as hnsw_rs's dump,
    /// `dense.hnsw.graph` and `dense.hnsw.data`; nothing for an empty one.
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
        Ok(())
    }

    /// The graph [`Dense::save`] wrote into `dir`; `live` says which of its
    /// points still hold a chunk (the rest are kept as tombstones, as they
    /// were). An empty index when `dir` holds no graph.
    pub fn load(
        dim: usize,
        params: DenseParams,
        dir: &Path,
        live: impl Fn(usize) -> bool,
    ) -> Result<Self, IndexError> {
        let me = Self::new(dim, params);
        if !dir.join(format!("{DUMP}.hnsw.graph")).is_file() {
            return Ok(me);
        }
        // The loaded graph borrows its loader for its whole life (hnsw_rs
        // ties them with a lifetime, for the memory-mapped case); the
        // loader holds two paths and options, not the data, so it is
        // leaked: a few hundred bytes per load.
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, DUMP)));
        let graph: Graph = io
            .load_hnsw::<f32, UnitCosine>()
            .map_err(|e| IndexError::Snapshot(format!("loading the graph: {e:#}")))?;
        if graph.get_point_indexation().get_data_dimension() != dim {
            return Err(IndexError::Snapshot(format!(
                "the saved graph has {} dimensions, the index {dim}",
                graph.get_point_indexation().get_data_dimension()
            )));
        }
        {
            let mut vectors = me.vectors.write().unwrap_or_else(PoisonError::into_inner);
            let mut deleted = me.deleted.write().unwrap_or_else(PoisonError::into_inner);
            for p in graph.get_point_indexation() {
                let id = p.get_origin_id();
                if live(id) {
                    vectors.insert(id, p.get_v().to_vec());
                } else {
                    deleted.insert(id);
                }
            }
        }
        *me.graph.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(graph));
        Ok(me)
    }

    /// The similarity of `query` to each point (`None` for one not held).
    pub fn similarities(&self, query: &[f32], ids: &[i64]) -> Vec<Option<f32>> {
        let vectors = self.vectors.read().unwrap_or_else(PoisonError::into_inner);
        ids.iter()
            .map(|id| {
                vectors
                    .get(&(*id as usize))
                    .filter(|v| v.len() == query.len())
                    .map(|v| dot(query, v))
            })
            .collect()
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
        let to_hits = |ns: Vec<hnsw_rs::prelude::Neighbour>| -> Vec<Hit> {
            ns.into_iter()
                .map(|n| Hit {
                    chunk_id: n.d_id as i64,
                    score: 1.0 - n.distance,
                })
                .collect()
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
                        chunk_id: *id as i64,
                        score: dot(query, v),
                    })
                    .collect();
                (top_k(hits, k), SearchPath::Exact)
            }
            Allowed::All => {
                let deleted = self.deleted.read().unwrap_or_else(PoisonError::into_inner);
                let ef = self.params.ef_search.max(k);
                let ns = if deleted.is_empty() {
                    drop(deleted);
                    graph.search(query, k, ef)
                } else {
                    let keep = |id: &usize| !deleted.contains(id);
                    graph.search_filter(query, k, ef, Some(&keep))
                };
                (to_hits(ns), SearchPath::Graph)
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
                        if let Some(v) = vectors.get(id) {
                            hits.push(Hit {
                                chunk_id: *id as i64,
                                score: dot(query, v),
                            });
                        }
                    }
                    (top_k(hits, k), SearchPath::Exact)
                } else {
                    let selectivity = set.len() as f32 / total.max(1) as f32;
                    let ef = ((k as f32 / selectivity) as usize)
                        .clamp(self.params.ef_search.max(k), 1024);
                    let keep = |id: &usize| set.binary_search(id).is_ok();
                    (
                        to_hits(graph.search_filter(query, k, ef, Some(&keep))),
                        SearchPath::FilteredGraph,
                    )
                }
            }
        }
    }
}
