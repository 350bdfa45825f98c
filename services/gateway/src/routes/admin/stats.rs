//! `GET /admin/stats`: p50/p95/p99 per stage over the last five minutes,
//! next to each stage's budget, and overrun and partial-answer rates.

use crate::auth::Admin;
use crate::error::ApiError;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use ragtime_core::Stage;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Serialize)]
pub struct StatsOut {
    window_s: u64,
    total_ms: u64,
    stages: BTreeMap<&'static str, StageOut>,
    rates: Rates,
    llm: LlmOut,
    /// How chat answers are made (`[chat]`).
    answers: AnswersOut,
    /// Every tenant's collections together (per tenant and per collection:
    /// `GET /admin/collections`).
    collections: CollectionsOut,
}

#[derive(Serialize)]
struct CollectionsOut {
    count: i64,
    /// Collections whose indexes are in memory now.
    loaded: usize,
    documents: i64,
    chunks: i64,
    /// The memory the loaded indexes hold.
    index_bytes: usize,
    /// The bytes of the files they read in place (memory-mapped: the
    /// page cache holds what of them is read, not the process's heap).
    index_mapped_bytes: usize,
    /// Collections loaded from their saved snapshot since start (not
    /// rebuilt from the store).
    loaded_from_snapshots: usize,
}

#[derive(Serialize)]
struct AnswersOut {
    mode: &'static str,
    on_ungrounded: ragtime_pipeline::chat::OnUngrounded,
    temperature: f64,
    max_tokens: u32,
}

/// The LLM backends and the degradation they cause.
#[derive(Serialize)]
struct LlmOut {
    backends: Vec<ragtime_pipeline::backend::BackendStatus>,
    /// The level a request arriving now would run at, and the levels.
    load_level: usize,
    levels: ragtime_pipeline::backend::load::Levels,
    hedged: u64,
    requests: u64,
}

#[derive(Serialize)]
struct StageOut {
    budget_ms: u64,
    count: usize,
    p50_ms: Option<f64>,
    p95_ms: Option<f64>,
    p99_ms: Option<f64>,
}

#[derive(Serialize)]
struct Rates {
    /// Chat requests answered 200.
    requests: u64,
    partial_rate: Option<f64>,
    overrun_rate: BTreeMap<&'static str, f64>,
}

/// Stage latency against budget over the last five minutes, rates and the
/// LLM backends.
#[utoipa::path(get, path = "/admin/stats", tag = "admin",
    responses((status = 200, description = "The statistics", body = Object)))]
pub async fn stats(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<StatsOut>, ApiError> {
    let budgets = state.budgets.global();
    let m = &state.metrics;
    let live = m.window.stats();
    let stages = Stage::ALL
        .iter()
        .map(|s| {
            let l = live.get(s);
            let out = StageOut {
                budget_ms: budgets.stage_ms(*s),
                count: l.map_or(0, |l| l.count),
                p50_ms: l.map(|l| l.p50_ms),
                p95_ms: l.map(|l| l.p95_ms),
                p99_ms: l.map(|l| l.p99_ms),
            };
            (s.name(), out)
        })
        .collect();
    let t = m.totals();
    let overrun_rate = t
        .runs
        .iter()
        .map(|(s, runs)| {
            let over = t
                .overruns
                .iter()
                .find(|(o, _)| o == s)
                .map_or(0, |(_, n)| *n);
            (s.name(), over as f64 / (*runs).max(1) as f64)
        })
        .collect();
    let a = state.config.answers();
    let answers = AnswersOut {
        mode: a.mode.name(),
        on_ungrounded: a.on_ungrounded,
        temperature: a.temperature,
        max_tokens: a.max_tokens,
    };
    Ok(Json(StatsOut {
        llm: llm_out(&state),
        answers,
        collections: collections_out(&state).await?,
        window_s: m.window.window().as_secs(),
        total_ms: budgets.total_ms,
        stages,
        rates: Rates {
            requests: t.chat_ok,
            partial_rate: (t.chat_ok > 0).then(|| t.partial as f64 / t.chat_ok as f64),
            overrun_rate,
        },
    }))
}

/// The LLM backends, the load level and hedging.
fn llm_out(state: &AppState) -> LlmOut {
    let (requests, hedged) = state.backends.hedge_counts();
    let levels = state.config.load.levels.clone();
    LlmOut {
        backends: state.backends.status(),
        load_level: levels.shape(state.backends.load()).level,
        levels,
        hedged,
        requests,
    }
}

/// What every collection holds, and what of it is loaded.
async fn collections_out(state: &AppState) -> Result<CollectionsOut, ApiError> {
    let (usage, loaded, index_bytes) = match state.loaded() {
        Some(p) => p.collection_totals().await.map_err(ApiError::from)?,
        None => Default::default(),
    };
    let loaded_from_snapshots = state
        .loaded()
        .map_or(0, |p| p.status().engine.snapshot_loads);
    Ok(CollectionsOut {
        count: usage.collections,
        loaded,
        documents: usage.documents,
        chunks: usage.chunks,
        index_bytes: index_bytes.resident,
        index_mapped_bytes: index_bytes.mapped,
        loaded_from_snapshots,
    })
}
