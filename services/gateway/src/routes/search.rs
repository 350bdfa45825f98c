//! `POST /v1/search`: hybrid, dense or lexical retrieval under the budget.

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::documents::check_collection;
use crate::routes::{engine, rag_error, with_timing};
use crate::state::AppState;
use crate::tenant::Tenant;
use axum::extract::State;
use axum::response::Response;
use ragtime_core::Filter;
use ragtime_pipeline::RequestBudget;
use ragtime_pipeline::rerank::{RerankParams, rerank};
use ragtime_pipeline::search::{Mode, RERANK_PLAN, SEARCH_PLAN, SearchRequest, search};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

const MAX_TOP_K: usize = 100;
const MAX_QUERY: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeIn {
    Hybrid,
    Dense,
    Lexical,
}

fn default_top_k() -> usize {
    10
}

fn default_collection() -> String {
    "default".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchIn {
    query: String,
    #[serde(default = "default_top_k")]
    top_k: usize,
    #[serde(default)]
    mode: Option<ModeIn>,
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

pub async fn search_route(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    ApiJson(req): ApiJson<SearchIn>,
) -> Result<Response, ApiError> {
    if req.query.trim().is_empty() {
        return Err(ApiError::invalid("query", "must not be empty"));
    }
    if req.query.len() > MAX_QUERY {
        return Err(ApiError::invalid(
            "query",
            format!("longer than {MAX_QUERY} bytes"),
        ));
    }
    if req.top_k == 0 || req.top_k > MAX_TOP_K {
        return Err(ApiError::invalid(
            "top_k",
            format!("must be between 1 and {MAX_TOP_K}"),
        ));
    }
    if req.budget_ms == Some(0) {
        return Err(ApiError::invalid("budget_ms", "must be at least 1"));
    }
    check_collection(&req.collection, "collection")?;
    let filter = match &req.filter {
        None => Filter::All,
        Some(v) => Filter::parse(v, "filter").map_err(|e| ApiError::invalid(e.path, e.message))?,
    };
    let rag = engine(&state)?;
    let index = rag
        .collection(&tenant.collection(&req.collection))
        .await
        .map_err(|e| rag_error(e, &req.collection))?;
    let mode = match req.mode {
        None | Some(ModeIn::Hybrid) => Mode::Hybrid,
        Some(ModeIn::Dense) => Mode::Dense,
        Some(ModeIn::Lexical) => Mode::Lexical,
    };
    let reranker = if req.rerank {
        Some(state.reranker.get().cloned().ok_or_else(|| {
            ApiError::invalid(
                "rerank",
                "no reranker is configured (set RAGTIME__RERANK__MODEL_DIR)",
            )
        })?)
    } else {
        None
    };
    let plan: &[_] = if reranker.is_some() {
        &RERANK_PLAN
    } else {
        &SEARCH_PLAN
    };
    let (profile, arm) = state.profile_for(tenant.name());
    let budget = RequestBudget::start(&profile, plan, req.budget_ms);
    let r = &state.config.rerank;
    let mut out = search(
        &budget,
        &rag.embedder,
        &index,
        &SearchRequest {
            query: req.query.clone(),
            top_k: if reranker.is_some() {
                req.top_k.max(r.depth)
            } else {
                req.top_k
            },
            mode,
            filter,
        },
    )
    .await;
    if let Some(model) = reranker {
        let params = RerankParams {
            depth: r.depth,
            batch: r.batch,
            weight: r.weight,
        };
        let (hits, _) = rerank(
            &budget,
            &model,
            &req.query,
            std::mem::take(&mut out.hits),
            params,
        )
        .await;
        out.hits = hits.into_iter().take(req.top_k).collect();
        out.report = budget.report();
    }
    let results: Vec<Value> = out
        .hits
        .iter()
        .map(|h| {
            json!({
                "document_id": h.chunk.external_id,
                "chunk_id": h.chunk.chunk_id,
                "score": h.score,
                "title": h.chunk.title,
                "text": h.chunk.text,
                "metadata": *h.chunk.metadata,
            })
        })
        .collect();
    let report = out.report;
    let partial = report.first_degraded().is_some();
    crate::observe::record_report(&state.metrics, &report);
    if let Some((e, a)) = &arm {
        e.record(*a, &report, partial);
    }
    crate::observe::record_partial(partial, report.first_degraded().map(|s| s.stage.name()));
    Ok(with_timing(
        &report,
        json!({
            "results": results,
            "sources": out.sources,
            "partial": partial,
            "budget": report,
        }),
    ))
}
