//! The search request: embed the query (falling back to lexical-only when
//! that overruns), then dense and lexical retrieval concurrently under the
//! `retrieve` budget, fused with reciprocal rank fusion.

use crate::engine::{Done, Policy, RequestBudget, StageCtx, StagePlan};
use crate::run_blocking;
use ragtime_core::{BudgetReport, Filter, Stage, StageError, reciprocal_rank_fusion};
use ragtime_embed::EmbedService;
use ragtime_retrieve::{ChunkEntry, CollectionIndex, Hit};
use std::future::Future;
use std::sync::Arc;
use tracing::Instrument;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
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

#[derive(Debug, Clone)]
pub struct SearchHit {
    pub chunk: Arc<ChunkEntry>,
    pub score: f32,
}

#[derive(Debug)]
pub struct SearchOutcome {
    pub hits: Vec<SearchHit>,
    pub report: BudgetReport,
    /// Which retrievers answered (`dense`, `lexical`).
    pub sources: Vec<&'static str>,
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

/// Runs a search under `budget` (planned with [`SEARCH_PLAN`] or a longer
/// plan that starts with it).
pub async fn search(
    budget: &RequestBudget,
    embedder: &Arc<EmbedService>,
    index: &Arc<CollectionIndex>,
    req: &SearchRequest,
) -> SearchOutcome {
    let vector = embed_query(budget, embedder, &req.query, req.mode).await;
    retrieve(budget, index, req, vector).await
}

/// The `embed` stage: the query vector, or `None` when lexical-only was
/// asked for or the embedding overran (outcome `fallback`: the search goes
/// on lexical-only).
pub async fn embed_query(
    budget: &RequestBudget,
    embedder: &Arc<EmbedService>,
    query: &str,
    mode: Mode,
) -> Option<Arc<Vec<f32>>> {
    if mode == Mode::Lexical {
        budget.skip(Stage::Embed, "lexical mode");
        return None;
    }
    let q = query.to_owned();
    let svc = embedder.clone();
    budget
        .run_with_fallback(
            Stage::Embed,
            |ctx| async move {
                svc.embed_query(&q, ctx.cancel())
                    .await
                    .map(|(v, _)| Done::Full(Some(v)))
            },
            |_ctx| async { Ok(Done::Full(None)) },
        )
        .await
        .value
        .flatten()
}

/// The `retrieve` stage: dense (when there is a query vector) and lexical
/// retrieval side by side, fused.
pub async fn retrieve(
    budget: &RequestBudget,
    index: &Arc<CollectionIndex>,
    req: &SearchRequest,
    vector: Option<Arc<Vec<f32>>>,
) -> SearchOutcome {
    let allowed = index.allowed(&req.filter);
    let k = candidates(req.top_k);

    // 2. Dense and lexical side by side; whichever finishes is kept.
    let want_lexical = req.mode != Mode::Dense || vector.is_none();
    let query = req.query.clone();
    let run = budget
        .run(Stage::Retrieve, |ctx| {
            let cancel = ctx.cancel();
            let dense = {
                let (index, allowed, cancel) = (index.clone(), allowed.clone(), cancel.clone());
                async move {
                    match vector {
                        Some(v) => {
                            run_blocking(cancel, move |c| {
                                Ok(Some(index.dense_search(&v, k, &allowed, c).0))
                            })
                            .await
                        }
                        None => Ok(None),
                    }
                }
            };
            let lexical = {
                let (index, allowed) = (index.clone(), allowed.clone());
                async move {
                    if want_lexical {
                        run_blocking(cancel, move |_| {
                            index
                                .lexical_search(&query, k, &allowed)
                                .map(Some)
                                .map_err(|e| StageError::Backend(e.to_string()))
                        })
                        .await
                    } else {
                        Ok(None)
                    }
                }
            };
            async move {
                // Created here, inside the stage's span, so they are its children.
                let dense = dense.instrument(tracing::info_span!("dense"));
                let lexical = lexical.instrument(tracing::info_span!("lexical"));
                both(dense, lexical, &ctx).await
            }
        })
        .await;

    let (dense, lexical) = run.value.unwrap_or((None, None));
    let mut sources = Vec::new();
    let hits: Vec<Hit> = match (dense, lexical) {
        (Some(d), Some(l)) => {
            sources = vec!["dense", "lexical"];
            let lists = [
                d.iter().map(|h| h.chunk_id).collect(),
                l.iter().map(|h| h.chunk_id).collect(),
            ];
            reciprocal_rank_fusion(&lists, ragtime_core::fusion::RRF_K)
                .into_iter()
                .map(|(chunk_id, score)| Hit { chunk_id, score })
                .collect()
        }
        (Some(d), None) => {
            sources.push("dense");
            d
        }
        (None, Some(l)) => {
            sources.push("lexical");
            l
        }
        (None, None) => Vec::new(),
    };
    let hits = hits
        .into_iter()
        .filter_map(|h| {
            index.chunk(h.chunk_id).map(|chunk| SearchHit {
                chunk,
                score: h.score,
            })
        })
        .take(req.top_k)
        .collect();
    SearchOutcome {
        hits,
        report: budget.report(),
        sources,
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
