//! The search request: embed the query (falling back to lexical-only when
//! that overruns), then dense and lexical retrieval concurrently under the
//! `retrieve` budget, fused with reciprocal rank fusion, then (when asked
//! and a cross-encoder is configured) anytime reranking.

use crate::budget::{Done, Policy, RequestBudget, StageCtx, StagePlan};
use crate::rerank::{RerankParams, rerank};
use ragtime_core::{
    BudgetReport, Embedder, Filter, Hit, Passage, Reranker, Retriever, Stage, StageError,
    reciprocal_rank_fusion,
};
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

/// Candidates fetched from each retriever before fusion.
pub fn candidates(top_k: usize) -> usize {
    (top_k * 3).max(50)
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
    let k = candidates(top_k);
    let want_lexical = req.mode != Mode::Dense || vector.is_none();
    let run = budget
        .run(Stage::Retrieve, |ctx| async move {
            let cancel = ctx.cancel();
            // Created here, inside the stage's span, so they are its children.
            let dense = async {
                match vector {
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
                if want_lexical {
                    retriever
                        .lexical(&req.query, k, &req.filter, cancel.clone())
                        .await
                        .map(Some)
                } else {
                    Ok(None)
                }
            }
            .instrument(tracing::info_span!(
                "lexical",
                openinference.span.kind = "RETRIEVER"
            ));
            both(dense, lexical, &ctx).await
        })
        .await;
    let (dense, lexical) = run.value.unwrap_or((None, None));
    let (hits, sources) = fuse(dense, lexical);
    let hits = hits
        .into_iter()
        .filter_map(|h| {
            retriever.chunk(h.chunk_id).map(|chunk| Passage {
                chunk,
                score: h.score,
            })
        })
        .take(top_k)
        .collect();
    SearchOutcome {
        hits,
        report: budget.report(),
        sources,
    }
}

/// One ranking from what the retrievers returned, and which did.
fn fuse(dense: Option<Vec<Hit>>, lexical: Option<Vec<Hit>>) -> (Vec<Hit>, Vec<&'static str>) {
    match (dense, lexical) {
        (Some(d), Some(l)) => {
            let lists = [
                d.iter().map(|h| h.chunk_id).collect(),
                l.iter().map(|h| h.chunk_id).collect(),
            ];
            let fused = reciprocal_rank_fusion(&lists, ragtime_core::fusion::RRF_K)
                .into_iter()
                .map(|(chunk_id, score)| Hit { chunk_id, score })
                .collect();
            (fused, vec!["dense", "lexical"])
        }
        (Some(d), None) => (d, vec!["dense"]),
        (None, Some(l)) => (l, vec!["lexical"]),
        (None, None) => (Vec::new(), Vec::new()),
    }
}

type Side = Result<Option<Vec<Hit>>, StageError>;
type Pair = (Option<Vec<Hit>>, Option<Vec<Hit>>);

/// Waits for both retrievers. Once one answers, its results are kept, so
/// an overrun of the other side still leaves a partial result standing.
async fn both(
    dense: impl Future<Output = Side>,
    lexical: impl Future<Output = Side>,
    ctx: &StageCtx<Pair>,
) -> Result<Done<Pair>, StageError> {
    tokio::pin!(dense, lexical);
    let (mut d, mut l): (Option<Side>, Option<Side>) = (None, None);
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

    fn budget() -> RequestBudget {
        let mut p = BudgetProfile::gpu();
        p.retrieve_ms = 50;
        RequestBudget::start(&p, &SEARCH_PLAN, None)
    }

    async fn run(
        dense: impl Future<Output = Side>,
        lexical: impl Future<Output = Side>,
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
                Ok(Some(hits(&[2])))
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
                Ok(Some(hits(&[3])))
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
            async { Ok(Some(hits(&[3]))) },
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
