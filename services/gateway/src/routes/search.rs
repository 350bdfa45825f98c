//! `POST /v1/search`: hybrid, dense or lexical retrieval under the budget.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::observe::Arrived;
use crate::routes::{Timed, check_budget_ms, check_collection, default_collection, parse_filter};
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use ragtime_core::BudgetReport;
use ragtime_pipeline::SearchQuery;
use ragtime_pipeline::search::{Mode, SearchOutcome};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

const MAX_TOP_K: usize = 100;
const MAX_QUERY: usize = 4096;

fn default_top_k() -> usize {
    10
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchIn {
    query: String,
    #[serde(default = "default_top_k")]
    top_k: usize,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default = "default_collection")]
    collection: String,
    #[serde(default)]
    budget_ms: Option<u64>,
    /// Rerank the candidates with the cross-encoder (anytime, under the
    /// `rerank` budget).
    #[serde(default)]
    rerank: bool,
}

impl SearchIn {
    fn check(self) -> Result<SearchQuery, ApiError> {
        if self.query.trim().is_empty() {
            return Err(ApiError::invalid("query", "must not be empty"));
        }
        if self.query.len() > MAX_QUERY {
            return Err(ApiError::invalid(
                "query",
                format!("longer than {MAX_QUERY} bytes"),
            ));
        }
        if !(1..=MAX_TOP_K).contains(&self.top_k) {
            let msg = format!("must be between 1 and {MAX_TOP_K}");
            return Err(ApiError::invalid("top_k", msg));
        }
        check_budget_ms(self.budget_ms)?;
        check_collection(&self.collection, "collection")?;
        let (filter, _) = parse_filter(self.filter.as_ref())?;
        Ok(SearchQuery {
            collection: self.collection,
            query: self.query,
            top_k: self.top_k,
            mode: self.mode.unwrap_or_default(),
            filter,
            rerank: self.rerank,
            budget_ms: self.budget_ms,
        })
    }
}

#[derive(Serialize)]
struct SearchOut<'a> {
    results: Vec<ResultOut<'a>>,
    sources: &'a [&'static str],
    partial: bool,
    budget: &'a BudgetReport,
}

#[derive(Serialize)]
struct ResultOut<'a> {
    document_id: &'a str,
    chunk_id: i64,
    score: f32,
    title: &'a str,
    section: &'a str,
    text: &'a str,
    metadata: &'a Value,
}

impl<'a> From<&'a SearchOutcome> for SearchOut<'a> {
    fn from(o: &'a SearchOutcome) -> Self {
        let results = o
            .hits
            .iter()
            .map(|h| ResultOut {
                document_id: &h.chunk.external_id,
                chunk_id: h.chunk.chunk_id,
                score: h.score,
                title: &h.chunk.title,
                section: &h.chunk.section,
                text: &h.chunk.text,
                metadata: &h.chunk.metadata,
            })
            .collect();
        Self {
            results,
            sources: &o.sources,
            partial: o.partial(),
            budget: &o.report,
        }
    }
}

pub async fn search(
    State(state): State<Arc<AppState>>,
    Arrived(at): Arrived,
    Caller(tenant): Caller,
    ApiJson(req): ApiJson<SearchIn>,
) -> Result<Response, ApiError> {
    let query = req.check()?;
    let out = state.pipeline()?.search(&tenant, query, at).await?;
    Ok(Timed(&out.report, SearchOut::from(&out)).into_response())
}
