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
use utoipa::ToSchema;

const MAX_TOP_K: usize = 100;
const MAX_QUERY: usize = 4096;

fn default_top_k() -> usize {
    10
}

/// How a search retrieves (`hybrid` by default).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum SearchMode {
    Hybrid,
    Dense,
    Lexical,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchIn {
    /// What to search for (not only spaces; at most 4 KiB).
    #[schema(min_length = 1, max_length = 4096, pattern = "\\S")]
    query: String,
    /// Results to return, 1 to 100.
    #[serde(default = "default_top_k")]
    #[schema(default = 10, minimum = 1, maximum = 100)]
    top_k: usize,
    #[serde(default)]
    #[schema(value_type = Option<SearchMode>)]
    mode: Option<Mode>,
    /// A metadata filter (`{"year": {"$gte": 2020}}`), applied before the
    /// vector search.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    #[serde(default = "default_collection")]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    collection: String,
    /// Tightens the request's total budget (ms); never loosens it.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3600000)]
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

#[derive(Serialize, ToSchema)]
pub struct SearchOut<'a> {
    results: Vec<ResultOut<'a>>,
    /// The retrievers whose results are in the answer (`dense`, `lexical`).
    #[schema(value_type = Vec<String>)]
    sources: &'a [&'static str],
    /// Some stage degraded: fewer or lexical-only results.
    partial: bool,
    #[schema(value_type = BudgetReport)]
    budget: &'a BudgetReport,
}

#[derive(Serialize, ToSchema)]
pub struct ResultOut<'a> {
    document_id: &'a str,
    chunk_id: i64,
    score: f32,
    title: &'a str,
    section: &'a str,
    text: &'a str,
    #[schema(value_type = Object)]
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

/// Search a collection.
#[utoipa::path(post, path = "/v1/search", tag = "search", request_body = SearchIn,
    responses((status = 200, description = "The results, with the request's budget report", body = SearchOut)))]
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
