//! The search request: embed the query (falling back to lexical-only when
//! that overruns), then dense retrieval over chunks and BM25 over whole
//! documents concurrently under the `retrieve` budget, fused at the
//! document level, each document answering with its best chunks; then
//! (when asked and a cross-encoder is configured) anytime reranking of the
//! documents.

use crate::budget::{Done, Policy, RequestBudget, StageCtx, StagePlan};
use crate::rerank::{RerankParams, rerank};
use ragtime_core::{
    BudgetReport, Cancel, DocHit, Embedder, Filter, Fusion, FusionParams, Hit, Passage, Reranker,
    Retriever, Stage, StageError, fuse,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use tracing::Instrument;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Hybrid,
    Dense,
    Lexical,
}

#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub query: String,
    pub top_k: usize,
    pub mode: Mode,
    pub filter: Filter,
}

#[derive(Debug)]
pub struct SearchOutcome {
    pub hits: Vec<Passage>,
    pub report: BudgetReport,
    /// Which retrievers answered (`dense`, `lexical`).
    pub sources: Vec<&'static str>,
}

impl SearchOutcome {
    /// Whether any stage did less than all of its work.
    pub fn partial(&self) -> bool {
        self.report.first_degraded().is_some()
    }
}

/// The stages a search runs with.
pub struct SearchDeps<'a> {
    pub embedder: &'a dyn Embedder,
    pub retriever: &'a dyn Retriever,
    /// Rerank the candidates, when asked for.
    pub reranker: Option<(&'a dyn Reranker, RerankParams)>,
}

/// How the dense and lexical rankings of documents become one: chosen on
/// the SciFact train queries (`ragtime-bench fusion`, table in
/// docs/benchmarks.md). A retriever whose scores have another scale says
/// its own ([`Retriever::fusion`]).
pub const FUSION: FusionParams = FusionParams {
    method: Fusion::Convex,
    dense_weight: 0.55,
    lexical_weight: 0.45,
    depth: 100,
};

/// Passages a document contributes at most: its best chunk, and further
/// ones only where they hold the query's words or were retrieved
/// themselves.
pub const PASSAGES_PER_DOCUMENT: usize = 3;

/// Candidates fetched from each retriever before fusion (chunks from the
/// dense side, documents from the lexical).
pub fn candidates(top_k: usize, fusion: &FusionParams) -> usize {
    (top_k * 3).max(fusion.depth)
}

pub const SEARCH_PLAN: [StagePlan; 2] = [
    StagePlan::new(Stage::Embed, Policy::Fallback),
    StagePlan::new(Stage::Retrieve, Policy::Required),
];

/// A search followed by reranking.
pub const RERANK_PLAN: [StagePlan; 3] = [
    StagePlan::new(Stage::Embed, Policy::Fallback),
    StagePlan::new(Stage::Retrieve, Policy::Required),
    StagePlan::new(Stage::Rerank, Policy::Optional),
];

/// The plan of a search with or without reranking.
pub fn plan(rerank: bool) -> &'static [StagePlan] {
    if rerank { &RERANK_PLAN } else { &SEARCH_PLAN }
}

/// Runs a search under `budget` (planned with [`plan`]).
pub async fn run(
    budget: &RequestBudget,
    deps: &SearchDeps<'_>,
    req: &SearchRequest,
) -> SearchOutcome {
    let vector = embed_query(budget, deps.embedder, &req.query, req.mode).await;
    let depth = deps.reranker.map_or(0, |(_, p)| p.depth);
    let mut out = retrieve(budget, deps.retriever, req, vector, req.top_k.max(depth)).await;
    if let Some((model, params)) = deps.reranker {
        out.hits = rerank(
            budget,
            model,
            &req.query,
            std::mem::take(&mut out.hits),
            params,
        )
        .await
        .0;
    }
    out.hits.truncate(req.top_k);
    out.report = budget.report();
    out
}

/// The `embed` stage: the query vector, or `None` when lexical-only was
/// asked for or the embedding overran (outcome `fallback`: the search goes
/// on lexical-only).
pub async fn embed_query(
    budget: &RequestBudget,
    embedder: &dyn Embedder,
    query: &str,
    mode: Mode,
) -> Option<Arc<Vec<f32>>> {
    if mode == Mode::Lexical {
        budget.skip(Stage::Embed, "lexical mode");
        return None;
    }
    budget
        .run_with_fallback(
            Stage::Embed,
            |ctx| async move {
                embedder
                    .embed_query(query, ctx.cancel())
                    .await
                    .map(|v| Done::Full(Some(v)))
            },
            |_ctx| async { Ok(Done::Full(None)) },
        )
        .await
        .value
        .flatten()
}

/// The `retrieve` stage: dense (when there is a query vector) and lexical
/// retrieval side by side, fused; `top_k` passages at most.
pub async fn retrieve(
    budget: &RequestBudget,
    retriever: &dyn Retriever,
    req: &SearchRequest,
    vector: Option<Arc<Vec<f32>>>,
    top_k: usize,
) -> SearchOutcome {
    let fusion = retriever.fusion().unwrap_or(FUSION);
    retrieve_with(budget, retriever, req, vector, top_k, &fusion).await
}

/// [`retrieve`] with another fusion (benchmarks compare them).
pub async fn retrieve_with(
    budget: &RequestBudget,
    retriever: &dyn Retriever,
    req: &SearchRequest,
    vector: Option<Arc<Vec<f32>>>,
    top_k: usize,
    fusion: &FusionParams,
) -> SearchOutcome {
    let k = candidates(top_k, fusion);
    let want_lexical = req.mode != Mode::Dense || vector.is_none();
    // Beside the dense side the lexical side may rank fewer (never fewer
    // than are shown); alone it ranks them all.
    let lexical_k = if vector.is_some() {
        retriever.hybrid_lexical_depth(k).max(top_k).min(k)
    } else {
        k
    };
    let apart = retriever.passages_apart();
    let per_document = if apart { 0 } else { PASSAGES_PER_DOCUMENT };
    let passages = &Passages {
        retriever,
        query: &req.query,
        vector: vector.clone(),
        top_k,
    };
    let run = budget
        .run(Stage::Retrieve, |ctx| async move {
            let cancel = ctx.cancel();
            // Created here, inside the stage's span, so they are its children.
            let dense = async {
                match vector.clone() {
                    Some(v) => retriever
                        .dense(v, k, &req.filter, cancel.clone())
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            }
            .instrument(tracing::info_span!(
                "dense",
                openinference.span.kind = "RETRIEVER"
            ));
            let lexical = async {
                if !want_lexical {
                    return Ok(None);
                }
                let mut docs = retriever
                    .lexical_documents(
                        &req.query,
                        lexical_k,
                        &req.filter,
                        vector.clone(),
                        per_document,
                        cancel.clone(),
                    )
                    .await?;
                if apart {
                    // Its own top documents' passages, while the dense
                    // side runs: they stand should the dense side overrun.
                    // Should the read fail, the ranking stands: the fused
                    // top's passages are read again after fusion.
                    let top: Vec<i64> = docs.iter().take(top_k).map(|d| d.document_id).collect();
                    match passages.read(&top, cancel.clone()).await {
                        Ok(found) => with_passages(&mut docs, found),
                        Err(StageError::Cancelled) => return Err(StageError::Cancelled),
                        Err(e) => tracing::debug!(error = %e, "the lexical side's passages"),
                    }
                }
                Ok(Some(docs))
            }
            .instrument(tracing::info_span!(
                "lexical",
                openinference.span.kind = "RETRIEVER"
            ));
            let found = both(dense, lexical, &ctx).await?;
            if !apart {
                return Ok(found);
            }
            passages
                .fill(found, fusion, &ctx)
                .instrument(tracing::info_span!(
                    "passages",
                    openinference.span.kind = "RETRIEVER"
                ))
                .await
        })
        .await;
    let (dense, lexical) = run.value.unwrap_or((None, None));
    let (mut hits, sources) = fuse_documents(retriever, dense, lexical, fusion);
    hits.truncate(top_k);
    SearchOutcome {
        hits,
        report: budget.report(),
        sources,
    }
}

/// One ranking of documents from what the retrievers returned (a
/// document ranks on the dense side by its best chunk), each document
/// answering with its best chunks — the lexical side's (its best chunk and
/// those holding the query's words), then those the dense side found
/// themselves — all with the document's fused score; and which retrievers
/// answered.
pub fn fuse_documents(
    retriever: &dyn Retriever,
    dense: Option<Vec<Hit>>,
    lexical: Option<Vec<DocHit>>,
    fusion: &FusionParams,
) -> (Vec<Passage>, Vec<&'static str>) {
    let Fused {
        order,
        mut dense_chunks,
        lexical_chunks,
        sources,
    } = Fused::new(retriever, dense.as_deref(), lexical.as_deref(), fusion);
    let mut out = Vec::new();
    for (doc, score) in order {
        // The lexical side's choice of the document's chunks (by the query
        // vector and their own BM25), then what the dense side found of it.
        let chunks: Vec<Arc<ragtime_core::Chunk>> = match lexical_chunks.get(&doc) {
            Some(hits) if !hits.is_empty() => {
                let mut ids: Vec<i64> = hits.iter().map(|h| h.chunk_id).collect();
                for c in dense_chunks.get(&doc).into_iter().flatten() {
                    if !ids.contains(&c.chunk_id) {
                        ids.push(c.chunk_id);
                    }
                }
                ids.into_iter()
                    .filter_map(|id| retriever.chunk(id))
                    .collect()
            }
            _ => dense_chunks.remove(&doc).unwrap_or_default(),
        };
        out.extend(
            chunks
                .into_iter()
                .take(PASSAGES_PER_DOCUMENT)
                .map(|chunk| Passage { chunk, score }),
        );
    }
    (without_copies(out), sources)
}

/// The documents in their fused order (a document ranks on the dense side
/// by its best chunk), what each side found of them, and which sides
/// answered.
struct Fused<'a> {
    order: Vec<(i64, f32)>,
    dense_chunks: HashMap<i64, Vec<Arc<ragtime_core::Chunk>>>,
    lexical_chunks: HashMap<i64, &'a [Hit]>,
    sources: Vec<&'static str>,
}

impl<'a> Fused<'a> {
    fn new(
        retriever: &dyn Retriever,
        dense: Option<&[Hit]>,
        lexical: Option<&'a [DocHit]>,
        fusion: &FusionParams,
    ) -> Self {
        let mut sources = Vec::new();
        let mut dense_docs: Vec<(i64, f32)> = Vec::new();
        let mut dense_chunks: HashMap<i64, Vec<Arc<ragtime_core::Chunk>>> = HashMap::new();
        if let Some(hits) = dense {
            sources.push("dense");
            for h in hits {
                let Some(c) = retriever.chunk(h.chunk_id) else {
                    continue;
                };
                let of = dense_chunks.entry(c.document_id).or_default();
                if of.is_empty() {
                    dense_docs.push((c.document_id, h.score));
                }
                of.push(c);
            }
        }
        let mut lexical_docs: Vec<(i64, f32)> = Vec::new();
        let mut lexical_chunks: HashMap<i64, &[Hit]> = HashMap::new();
        if let Some(docs) = lexical {
            sources.push("lexical");
            for d in docs {
                lexical_docs.push((d.document_id, d.score));
                lexical_chunks.insert(d.document_id, &d.chunks);
            }
        }
        let order = match (dense.is_some(), lexical.is_some()) {
            (true, true) => fuse(&dense_docs, &lexical_docs, fusion),
            (true, false) => dense_docs,
            (false, _) => lexical_docs,
        };
        Self {
            order,
            dense_chunks,
            lexical_chunks,
            sources,
        }
    }
}

/// Passages of a retriever that picks them apart from ranking documents
/// ([`Retriever::passages_apart`]), read in two steps under the stage's
/// budget: the lexical side reads its own top `top_k` documents' as soon
/// as it has ranked them (beside the dense side, and standing should that
/// side overrun); once both sides are fused, the documents of the fused
/// top `top_k` that are still without any are read ([`Passages::fill`]).
/// Each document of the top gives one passage at least, so no document
/// further down is shown, unless one of the top has gone since or gives
/// only copies of passages shown above it.
struct Passages<'a> {
    retriever: &'a dyn Retriever,
    query: &'a str,
    vector: Option<Arc<Vec<f32>>>,
    top_k: usize,
}

impl Passages<'_> {
    async fn read(&self, documents: &[i64], cancel: Cancel) -> Result<Vec<DocHit>, StageError> {
        if documents.is_empty() {
            return Ok(Vec::new());
        }
        self.retriever
            .passages(
                self.query,
                documents,
                self.vector.clone(),
                PASSAGES_PER_DOCUMENT,
                cancel,
            )
            .await
    }

    /// `found` with the passages of its fused top documents that the
    /// lexical side found but has none of yet. Should they overrun the
    /// stage's time or fail, the documents go on without them: a document
    /// the dense side found too answers with the chunks that side found;
    /// one found only by the lexical side has none to show.
    async fn fill(
        &self,
        found: Done<Pair>,
        fusion: &FusionParams,
        ctx: &StageCtx<Pair>,
    ) -> Result<Done<Pair>, StageError> {
        let (mut pair, note) = match found {
            Done::Full(p) => (p, None),
            Done::Partial(p, n) => (p, Some(n)),
        };
        let wanted: Vec<i64> = {
            let f = Fused::new(self.retriever, pair.0.as_deref(), pair.1.as_deref(), fusion);
            f.order
                .iter()
                .take(self.top_k)
                .map(|&(doc, _)| doc)
                .filter(|doc| f.lexical_chunks.get(doc).is_some_and(|c| c.is_empty()))
                .collect()
        };
        let done = |pair, more: Option<String>| {
            let notes: Vec<String> = note.clone().into_iter().chain(more).collect();
            if notes.is_empty() {
                Done::Full(pair)
            } else {
                Done::Partial(pair, notes.join("; "))
            }
        };
        if wanted.is_empty() {
            return Ok(done(pair, None));
        }
        const WITHOUT: &str = "some of the lexical side's documents shown without their passages";
        let kept = done(pair.clone(), Some(format!("passages overran: {WITHOUT}")));
        if let Done::Partial(p, n) = kept {
            ctx.keep(p, n);
        }
        match self.read(&wanted, ctx.cancel()).await {
            Ok(docs) => {
                if let Some(lexical) = &mut pair.1 {
                    with_passages(lexical, docs);
                }
                Ok(done(pair, None))
            }
            Err(e) => Ok(done(
                pair,
                Some(format!("passages failed ({e}): {WITHOUT}")),
            )),
        }
    }
}

/// Gives the documents of `docs` the chunks `found` holds for them.
fn with_passages(docs: &mut [DocHit], found: Vec<DocHit>) {
    let mut of: HashMap<i64, Vec<Hit>> = found
        .into_iter()
        .map(|d| (d.document_id, d.chunks))
        .collect();
    for d in docs {
        if let Some(chunks) = of.remove(&d.document_id) {
            d.chunks = chunks;
        }
    }
}

/// `passages` less those that one above them already is — the same text
/// under the same title and section: a page published twice, `index.html`
/// beside the chapter it copies. Two copies would take two of the few
/// places a reader looks at.
fn without_copies(mut passages: Vec<Passage>) -> Vec<Passage> {
    let mut seen = std::collections::HashSet::new();
    let first: Vec<bool> = passages
        .iter()
        .map(|p| {
            let c = &p.chunk;
            seen.insert((c.title.as_str(), c.section.as_str(), c.text.as_str()))
        })
        .collect();
    let mut keep = first.into_iter();
    passages.retain(|_| keep.next().unwrap_or(true));
    passages
}

type Side<T> = Result<Option<Vec<T>>, StageError>;
type Pair = (Option<Vec<Hit>>, Option<Vec<DocHit>>);

/// Waits for both retrievers. Once one answers, its results are kept, so
/// an overrun of the other side still leaves a partial result standing.
async fn both(
    dense: impl Future<Output = Side<Hit>>,
    lexical: impl Future<Output = Side<DocHit>>,
    ctx: &StageCtx<Pair>,
) -> Result<Done<Pair>, StageError> {
    tokio::pin!(dense, lexical);
    let (mut d, mut l): (Option<Side<Hit>>, Option<Side<DocHit>>) = (None, None);
    while d.is_none() || l.is_none() {
        tokio::select! {
            r = &mut dense, if d.is_none() => {
                if let Ok(Some(hits)) = &r {
                    ctx.keep((Some(hits.clone()), None), "dense results only (lexical overran)");
                }
                d = Some(r);
            }
            r = &mut lexical, if l.is_none() => {
                if let Ok(Some(hits)) = &r {
                    ctx.keep((None, Some(hits.clone())), "lexical results only (dense overran)");
                }
                l = Some(r);
            }
        }
    }
    match (d, l) {
        (Some(Ok(d)), Some(Ok(l))) => Ok(Done::Full((d, l))),
        (Some(Ok(Some(d))), Some(Err(e))) => Ok(Done::Partial(
            (Some(d), None),
            format!("lexical failed: {e}"),
        )),
        (Some(Err(e)), Some(Ok(Some(l)))) => {
            Ok(Done::Partial((None, Some(l)), format!("dense failed: {e}")))
        }
        (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e),
        _ => Err(StageError::Backend(
            "retrieval ended without results".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BudgetProfile;
    use ragtime_core::Outcome;
    use std::time::Duration;
    use tokio::time::sleep;

    fn hits(ids: &[i64]) -> Vec<Hit> {
        ids.iter()
            .map(|&chunk_id| Hit {
                chunk_id,
                score: 1.0,
            })
            .collect()
    }

    fn docs(ids: &[i64]) -> Vec<DocHit> {
        ids.iter()
            .map(|&document_id| DocHit {
                document_id,
                score: 1.0,
                chunks: Vec::new(),
            })
            .collect()
    }

    /// Documents 10 (chunks 1, 2, 3) and 20 (chunk 4) and 30 (chunk 5).
    fn retriever() -> ragtime_testkit::MemoryRetriever {
        let chunk = |id: i64, doc: i64, pos: i32| {
            let text = format!("the text of chunk {id}");
            let mut c =
                ragtime_testkit::chunk(id, &format!("d{doc}"), "", &text, serde_json::json!({}));
            c.document_id = doc;
            c.position = pos;
            c
        };
        ragtime_testkit::MemoryRetriever::new(
            &ragtime_testkit::HashEmbedder::new(8),
            vec![
                chunk(1, 10, 0),
                chunk(2, 10, 1),
                chunk(3, 10, 2),
                chunk(4, 20, 0),
                chunk(5, 30, 0),
            ],
        )
    }

    fn doc(document_id: i64, score: f32, chunks: &[(i64, f32)]) -> DocHit {
        DocHit {
            document_id,
            score,
            chunks: chunks
                .iter()
                .map(|&(chunk_id, score)| Hit { chunk_id, score })
                .collect(),
        }
    }

    fn passages(p: &[Passage]) -> Vec<(i64, i64)> {
        p.iter()
            .map(|p| (p.chunk.document_id, p.chunk.chunk_id))
            .collect()
    }

    #[test]
    fn documents_are_fused_and_answer_with_their_best_chunks() {
        let r = retriever();
        // Dense: chunk 3 of document 10 first, then document 20, then 10's chunk 1.
        let dense = vec![
            Hit {
                chunk_id: 3,
                score: 0.9,
            },
            Hit {
                chunk_id: 4,
                score: 0.8,
            },
            Hit {
                chunk_id: 1,
                score: 0.7,
            },
        ];
        // Lexical: document 30 first (dense never saw it), then 10, whose
        // chunks it chose: 3, then 2 (which holds the query's words).
        let lexical = vec![
            doc(30, 9.0, &[(5, 0.1)]),
            doc(10, 5.0, &[(3, 0.9), (2, 0.8)]),
        ];
        let (out, sources) = fuse_documents(
            &r,
            Some(dense.clone()),
            Some(lexical.clone()),
            &FusionParams::RRF,
        );
        assert_eq!(sources, ["dense", "lexical"]);
        // 10 is in both lists; 30 and 20 each in one, 30 ranked higher.
        // 10 answers with the lexical side's chunks, then the dense side's
        // other find of it.
        assert_eq!(
            passages(&out),
            [(10, 3), (10, 2), (10, 1), (30, 5), (20, 4)]
        );
        assert!(out.windows(2).all(|w| w[0].score >= w[1].score));

        // Dense alone: documents by their best chunk, each with the chunks
        // the dense side found, best first.
        let (out, sources) = fuse_documents(&r, Some(dense), None, &FusionParams::RRF);
        assert_eq!(sources, ["dense"]);
        assert_eq!(passages(&out), [(10, 3), (10, 1), (20, 4)]);

        // Lexical alone (no query vector): its chunks, in its order.
        let lexical = vec![
            doc(10, 5.0, &[(2, 3.0), (1, 1.0)]),
            doc(20, 4.0, &[(4, 0.0)]),
        ];
        let (out, _) = fuse_documents(&r, None, Some(lexical), &FusionParams::RRF);
        assert_eq!(passages(&out), [(10, 2), (10, 1), (20, 4)]);
        // At most PASSAGES_PER_DOCUMENT of one document.
        let many = [(1, 4.0), (2, 3.0), (3, 2.0), (1, 1.0)];
        let lexical = vec![doc(10, 5.0, &many)];
        let (out, _) = fuse_documents(&r, None, Some(lexical), &FusionParams::RRF);
        assert_eq!(out.len(), PASSAGES_PER_DOCUMENT);
    }

    #[test]
    fn a_passage_another_document_already_gave_is_left_out() {
        let chunk = |id: i64, doc: i64, title: &str, text: &str| {
            let mut c =
                ragtime_testkit::chunk(id, &format!("d{doc}"), title, text, serde_json::json!({}));
            c.document_id = doc;
            c
        };
        // Document 20 is a copy of 10 (an index page that repeats a
        // chapter); 40 says the same words under a title of its own.
        let r = ragtime_testkit::MemoryRetriever::new(
            &ragtime_testkit::HashEmbedder::new(8),
            vec![
                chunk(1, 10, "What is rustdoc?", "Rustdoc documents crates."),
                chunk(2, 20, "What is rustdoc?", "Rustdoc documents crates."),
                chunk(3, 30, "Arguments", "Command-line arguments"),
                chunk(4, 40, "A summary", "Rustdoc documents crates."),
            ],
        );
        let lexical = vec![
            doc(10, 5.0, &[(1, 1.0)]),
            doc(20, 5.0, &[(2, 1.0)]),
            doc(30, 4.0, &[(3, 1.0)]),
            doc(40, 3.0, &[(4, 1.0)]),
        ];
        let (out, _) = fuse_documents(&r, None, Some(lexical), &FusionParams::RRF);
        assert_eq!(passages(&out), [(10, 1), (30, 3), (40, 4)]);
    }

    /// Six documents of two chunks each (document `d`: chunks `2d - 1`
    /// and `2d`), the query's words more often the lower `d` is; and
    /// document 7, one chunk of the query's words alone: the dense side's
    /// best, the lexical side's fourth (tied with the third), and the
    /// fused third.
    fn seven_documents() -> ragtime_testkit::MemoryRetriever {
        let mut chunks = Vec::new();
        let mut add = |id: i64, d: i64, title: String, text: String| {
            let mut c =
                ragtime_testkit::chunk(id, &format!("d{d}"), &title, &text, serde_json::json!({}));
            c.document_id = d;
            c.position = i32::from(id % 2 == 0);
            chunks.push(c);
        };
        for d in 1..=6i64 {
            for (id, words) in [(2 * d - 1, 7 - d), (2 * d, (7 - d) / 2)] {
                let text = format!("{} filler {d} {id}", "alpha beta ".repeat(words as usize));
                add(id, d, format!("document {d}"), text);
            }
        }
        add(13, 7, String::new(), "alpha beta ".repeat(6));
        ragtime_testkit::MemoryRetriever::new(&ragtime_testkit::HashEmbedder::new(8), chunks)
    }

    fn request() -> SearchRequest {
        SearchRequest {
            query: "alpha beta".into(),
            top_k: 3,
            mode: Mode::Hybrid,
            filter: Filter::All,
        }
    }

    fn query_vector() -> Option<Arc<Vec<f32>>> {
        Some(Arc::new(
            ragtime_testkit::HashEmbedder::new(8).vector("alpha beta"),
        ))
    }

    /// A side that takes a minute: past any stage budget here.
    fn overrunning() -> ragtime_testkit::Side {
        ragtime_testkit::Side {
            delay: Duration::from_secs(60),
            fail: false,
        }
    }

    /// A side that fails at once.
    fn failing() -> ragtime_testkit::Side {
        ragtime_testkit::Side {
            delay: Duration::ZERO,
            fail: true,
        }
    }

    fn apart(side: ragtime_testkit::Side) -> ragtime_testkit::MemoryRetriever {
        let mut r = seven_documents();
        r.apart = Some(side);
        r
    }

    #[tokio::test(start_paused = true)]
    async fn passages_picked_apart_are_those_the_ranking_picks_for_the_documents_shown_only() {
        let together = seven_documents();
        let whole = retrieve(&budget(), &together, &request(), query_vector(), 3).await;
        assert!(!whole.partial(), "{:?}", whole.report);
        assert_eq!(whole.hits.len(), 3);
        assert_eq!(together.lexical_asked(), [(100, PASSAGES_PER_DOCUMENT)]);

        let r = apart(ragtime_testkit::Side::default());
        let out = retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        assert!(!out.partial(), "{:?}", out.report);
        assert_eq!(passages(&out.hits), passages(&whole.hits));
        assert!(
            out.hits
                .iter()
                .zip(&whole.hits)
                .all(|(a, b)| a.score == b.score)
        );
        // The ranking without passages; then the lexical side's top 3
        // (of the seven it ranked), best first; then document 7, in the
        // fused top 3 but the lexical side's last.
        assert_eq!(r.lexical_asked(), [(100, 0)]);
        assert_eq!(r.passages_asked(), [vec![1, 2, 3], vec![7]]);

        // Lexical alone: what is shown is what was read apart.
        let lexical = SearchRequest {
            mode: Mode::Lexical,
            ..request()
        };
        let whole = retrieve(&budget(), &together, &lexical, None, 3).await;
        let out = retrieve(&budget(), &r, &lexical, None, 3).await;
        assert_eq!(whole.hits.len(), 3);
        assert_eq!(passages(&out.hits), passages(&whole.hits));
        assert_eq!(r.passages_asked().len(), 3);

        // Dense alone asks for none.
        let dense = SearchRequest {
            mode: Mode::Dense,
            ..request()
        };
        retrieve(&budget(), &r, &dense, query_vector(), 3).await;
        assert_eq!(r.passages_asked().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn passages_that_overrun_or_fail_leave_the_documents_with_what_is_at_hand() {
        let whole = retrieve(&budget(), &seven_documents(), &request(), query_vector(), 3).await;
        // The lexical side's own passages overrun: the dense side's
        // results stand, each document with the chunks that side found.
        let r = apart(overrunning());
        let out = retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        let (detail, elapsed_ms) = partial_retrieve(&out);
        assert!(detail.contains("lexical overran"), "{detail}");
        assert_eq!(elapsed_ms, 50);
        assert_eq!(out.sources, ["dense"]);
        let dense_only = SearchRequest {
            mode: Mode::Dense,
            ..request()
        };
        let dense = retrieve(
            &budget(),
            &seven_documents(),
            &dense_only,
            query_vector(),
            3,
        )
        .await;
        assert_eq!(passages(&out.hits), passages(&dense.hits));

        // Every passage read fails: the fused ranking stands (both
        // sides'), each document with what the dense side found of it —
        // here every chunk, so what is shown is what a whole read shows.
        let r = apart(failing());
        let out = retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        let (detail, _) = partial_retrieve(&out);
        assert!(detail.contains("passages failed"), "{detail}");
        assert_eq!(out.sources, ["dense", "lexical"]);
        assert_eq!(passages(&out.hits), passages(&whole.hits));
        // Both reads were tried: the lexical side's top, then the fused
        // top's (all without passages).
        assert_eq!(r.passages_asked(), [vec![1, 2, 3], vec![1, 2, 7]]);

        // The dense side overruns: the lexical side's documents stand
        // with their passages.
        let mut r = apart(ragtime_testkit::Side::default());
        r.dense = overrunning();
        let out = retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        assert!(out.partial());
        assert_eq!(out.sources, ["lexical"]);
        let shown: Vec<i64> = passages(&out.hits).iter().map(|p| p.0).collect();
        assert_eq!(shown, [1, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn filling_gives_the_fused_top_documents_without_passages_theirs() {
        let r = apart(ragtime_testkit::Side::default());
        let passages = Passages {
            retriever: &r,
            query: "alpha beta",
            vector: None,
            top_k: 2,
        };
        // Documents 1 and 2 without passages, 3 with one: 1 and 2 are read.
        let lexical = vec![doc(1, 3.0, &[]), doc(2, 2.0, &[]), doc(3, 1.0, &[(5, 1.0)])];
        let b = budget();
        let run = b
            .run(Stage::Retrieve, |ctx| async move {
                passages
                    .fill(Done::Full((None, Some(lexical))), &FUSION, &ctx)
                    .await
            })
            .await;
        assert_eq!(run.outcome, Outcome::Ok);
        assert_eq!(r.passages_asked(), [vec![1, 2]]);
        let (_, docs) = run.value.expect("filled");
        let chunks: Vec<Vec<i64>> = docs
            .expect("lexical")
            .iter()
            .map(|d| d.chunks.iter().map(|h| h.chunk_id).collect())
            .collect();
        assert_eq!(chunks, [vec![1, 2], vec![3, 4], vec![5]]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hybrid_lexical_side_ranks_its_depth_and_a_lexical_search_all() {
        let mut r = apart(ragtime_testkit::Side::default());
        r.hybrid_lexical = Some(30);
        retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        // Never fewer than are shown.
        retrieve(&budget(), &r, &request(), query_vector(), 40).await;
        let lexical = SearchRequest {
            mode: Mode::Lexical,
            ..request()
        };
        retrieve(&budget(), &r, &lexical, None, 3).await;
        assert_eq!(r.lexical_asked(), [(30, 0), (40, 0), (100, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn fused_top_passages_that_overrun_leave_the_documents_standing() {
        // Only the second read (document 7's, in the fused top but not in
        // the lexical side's) overruns: the fused documents stand, 7 with
        // the chunk the dense side found.
        let whole = retrieve(&budget(), &seven_documents(), &request(), query_vector(), 3).await;
        let mut r = apart(ragtime_testkit::Side::default());
        r.apart_later = Some(overrunning());
        let out = retrieve(&budget(), &r, &request(), query_vector(), 3).await;
        let (detail, elapsed_ms) = partial_retrieve(&out);
        assert_eq!(elapsed_ms, 50);
        assert!(detail.contains("passages overran"), "{detail}");
        assert_eq!(out.sources, ["dense", "lexical"]);
        assert_eq!(passages(&out.hits), passages(&whole.hits));
        assert_eq!(r.passages_asked(), [vec![1, 2, 3], vec![7]]);
    }

    /// The retrieve stage's report of a search that must be partial: what
    /// it says, and how long it took.
    fn partial_retrieve(out: &SearchOutcome) -> (String, u64) {
        let stage = out.report.stage(Stage::Retrieve).expect("retrieve ran");
        assert_eq!(stage.outcome, Outcome::Partial);
        (stage.detail.clone().unwrap_or_default(), stage.elapsed_ms)
    }

    fn budget() -> RequestBudget {
        let mut p = BudgetProfile::gpu();
        p.retrieve_ms = 50;
        RequestBudget::start(&p, &SEARCH_PLAN, None)
    }

    async fn run(
        dense: impl Future<Output = Side<Hit>>,
        lexical: impl Future<Output = Side<DocHit>>,
    ) -> crate::StageRun<Pair> {
        let b = budget();
        b.run(Stage::Retrieve, |ctx| async move {
            both(dense, lexical, &ctx).await
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn both_sides_in_time_is_ok() {
        let r = run(
            async {
                sleep(Duration::from_millis(5)).await;
                Ok(Some(hits(&[1])))
            },
            async {
                sleep(Duration::from_millis(20)).await;
                Ok(Some(docs(&[2])))
            },
        )
        .await;
        assert_eq!(r.outcome, Outcome::Ok);
        let (d, l) = r.value.unwrap_or_default();
        assert_eq!((d.map(|h| h.len()), l.map(|h| h.len())), (Some(1), Some(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn one_side_overrunning_leaves_the_other_standing() {
        let r = run(
            async {
                sleep(Duration::from_millis(5)).await;
                Ok(Some(hits(&[1, 2])))
            },
            async {
                sleep(Duration::from_secs(60)).await;
                Ok(Some(docs(&[3])))
            },
        )
        .await;
        assert_eq!(r.outcome, Outcome::Partial);
        assert_eq!(r.elapsed, Duration::from_millis(50));
        let (d, l) = r.value.unwrap_or_default();
        assert_eq!(d.map(|h| h.len()), Some(2));
        assert!(l.is_none());

        let r = run(
            async {
                sleep(Duration::from_secs(60)).await;
                Ok(Some(hits(&[1])))
            },
            async { Ok(Some(docs(&[3]))) },
        )
        .await;
        assert_eq!(r.outcome, Outcome::Partial);
        assert!(
            r.value
                .as_ref()
                .is_some_and(|(d, l)| d.is_none() && l.is_some())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_side_failing_is_partial_both_failing_is_an_error() {
        let r = run(async { Ok(Some(hits(&[1]))) }, async {
            Err(StageError::Backend("tantivy".into()))
        })
        .await;
        assert_eq!(r.outcome, Outcome::Partial);
        let r = run(async { Err(StageError::Backend("hnsw".into())) }, async {
            Err(StageError::Backend("tantivy".into()))
        })
        .await;
        assert_eq!(r.outcome, Outcome::Error);
        let r = run(
            async {
                sleep(Duration::from_secs(60)).await;
                Ok(None)
            },
            async {
                sleep(Duration::from_secs(60)).await;
                Ok(None)
            },
        )
        .await;
        assert_eq!(r.outcome, Outcome::Timeout);
    }
}
