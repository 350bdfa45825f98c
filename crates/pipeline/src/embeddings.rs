//! The embeddings request (the OpenAI-compatible batch endpoint): one
//! `embed` stage that may use the request's whole budget, off the async
//! threads, cut at the deadline.

use crate::PipelineError;
use crate::budget::profile::BudgetProfile;
use crate::budget::{Done, Policy, RequestBudget, StagePlan};
use ragtime_core::{BudgetReport, Embedder, Outcome, Stage};

const PLAN: [StagePlan; 1] = [StagePlan::new(Stage::Embed, Policy::Required)];

/// Vectors for `texts`, in order, and the budget story.
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub report: BudgetReport,
}

/// The profile of a batch request: the `embed` stage gets the whole total.
pub fn profile(base: &BudgetProfile, requested_ms: Option<u64>) -> BudgetProfile {
    let mut p = base.tightened(requested_ms);
    p.embed_ms = p.total_ms;
    p
}

/// Embeds `texts` under `profile` (see [`profile`]), for a request that
/// `arrived` then.
pub async fn run(
    profile: &BudgetProfile,
    embedder: &dyn Embedder,
    texts: Vec<String>,
    arrived: tokio::time::Instant,
) -> Result<Embedded, PipelineError> {
    let budget = RequestBudget::start_at(profile, &PLAN, None, arrived);
    let n = texts.len();
    let run = budget
        .run(Stage::Embed, |ctx| async move {
            embedder
                .embed_texts(texts, ctx.cancel())
                .await
                .map(Done::Full)
        })
        .await;
    let report = budget.report();
    match (run.outcome, run.value) {
        (Outcome::Ok, Some(vectors)) => Ok(Embedded { vectors, report }),
        (Outcome::Timeout | Outcome::Skipped, _) => Err(PipelineError::BudgetExceeded {
            message: format!(
                "embedding {n} texts did not finish within {} ms",
                report.total_ms
            ),
            report: Box::new(report),
        }),
        _ => {
            let detail = report
                .stages
                .first()
                .and_then(|s| s.detail.clone())
                .unwrap_or_default();
            Err(PipelineError::Internal(format!(
                "embedding failed: {detail}"
            )))
        }
    }
}
