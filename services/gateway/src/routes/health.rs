//! `GET /healthz`: the process is alive. `GET /readyz`: models loaded and
//! warmed, store open, LLM reachable — 200 only when all three hold.

use crate::state::{AppState, ModelState};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

#[derive(Serialize, utoipa::ToSchema)]
pub struct Alive {
    status: &'static str,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Alive)))]
pub async fn healthz() -> impl IntoResponse {
    Json(Alive { status: "alive" })
}

/// One check: `ok`, and its details or its error.
#[derive(Serialize)]
struct Check<T> {
    ok: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    detail: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl<T> From<Result<T, String>> for Check<T> {
    fn from(r: Result<T, String>) -> Self {
        match r {
            Ok(d) => Self {
                ok: true,
                detail: Some(d),
                error: None,
            },
            Err(e) => Self {
                ok: false,
                detail: None,
                error: Some(e),
            },
        }
    }
}

#[derive(Serialize)]
struct EmbedCheck {
    model: &'static str,
    dim: usize,
    chunks_indexed: usize,
    reranker: bool,
}

#[derive(Serialize)]
struct StoreCheck {
    backend: String,
    /// The hot standbys searches may read (`database.read_urls`), in order:
    /// none down or behind makes the replica unready (searches read the
    /// primary meanwhile).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    standbys: Vec<StandbyCheck>,
}

#[derive(Serialize)]
struct StandbyCheck {
    usable: bool,
    up: bool,
    lag_ms: u64,
}

#[derive(Serialize)]
struct LlmCheck {
    /// Shown to the admin only: where the backend is.
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    models: Vec<String>,
    /// Every backend's breaker and queue.
    backends: Vec<ragtime_pipeline::backend::BackendStatus>,
}

/// How far the indexes are behind the store's change log.
#[derive(Serialize)]
struct IndexCheck {
    /// The log entry the indexes reflect.
    applied: i64,
    behind: i64,
    lag_s: f64,
    /// Seconds since the follower last finished a pass.
    pass_age_s: f64,
}

/// A replica whose indexes are further behind the store than this is not
/// ready: it would serve answers older than other replicas'.
const MAX_LAG_S: f64 = 30.0;

#[derive(Serialize)]
struct Checks {
    embed: Check<EmbedCheck>,
    index: Check<IndexCheck>,
    store: Check<StoreCheck>,
    llm: Check<LlmCheck>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ready` or `not_ready`.
    status: &'static str,
    /// `embed`, `index`, `store` and `llm`, each with `ok` and its details
    /// or error.
    #[schema(value_type = Object)]
    checks: Checks,
}

/// Ready: models loaded and warm, store open, LLM reachable.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, description = "Ready", body = Ready),
        (status = 503, description = "Not ready: the failing check is named", body = Ready)))]
pub async fn readyz(
    State(state): State<Arc<AppState>>,
    probe: crate::auth::Probe,
) -> impl IntoResponse {
    let (store, llm) = tokio::join!(store_check(&state), llm_check(&state, probe.admin));
    // Where the backend is, only for the admin: an error naming its URL
    // names the setting instead.
    let llm = llm.map_err(|e| match probe.admin {
        true => e,
        false => e.replace(state.llm.base_url(), "llm.base_url"),
    });
    let checks = Checks {
        embed: embed_check(&state).into(),
        index: index_check(&state).into(),
        store: store.into(),
        llm: llm.into(),
    };
    let ready = checks.embed.ok && checks.index.ok && checks.store.ok && checks.llm.ok;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Ready {
        status: if ready { "ready" } else { "not_ready" },
        checks,
    };
    (status, Json(body))
}

/// The models: loaded (and warm) or why not.
fn embed_check(state: &AppState) -> Result<EmbedCheck, String> {
    match state.loaded() {
        Some(p) => {
            let status = p.status();
            Ok(EmbedCheck {
                model: "all-minilm-l6-v2",
                dim: status.dim,
                chunks_indexed: status.engine.chunks,
                reranker: status.reranker,
            })
        }
        None => match state.loading() {
            ModelState::Loading => Err("loading".to_owned()),
            ModelState::Failed(e) => Err(e),
        },
    }
}

/// The store answers within a second.
async fn store_check(state: &AppState) -> Result<StoreCheck, String> {
    tokio::time::timeout(Duration::from_secs(1), state.store.ping())
        .await
        .map_err(|_| "ping timed out".to_owned())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map(|()| StoreCheck {
            backend: format!("{:?}", state.store.backend()).to_lowercase(),
            standbys: state
                .store
                .standbys()
                .into_iter()
                .map(|s| StandbyCheck {
                    usable: s.usable,
                    up: s.up,
                    lag_ms: s.lag_ms,
                })
                .collect(),
        })
}

/// Ready when the first backend answers, or any backend's breaker is
/// closed (the others may be down: requests avoid them).
async fn llm_check(state: &AppState, admin: bool) -> Result<LlmCheck, String> {
    let checked = state.llm.check(Duration::from_secs(1)).await;
    if checked.is_ok() {
        // As good as a probe: a breaker the probes opened while the
        // server was starting closes now, not at the next probe.
        state.backends.reachable(state.llm.base_url());
    }
    let mut backends = state.backends.status();
    if !admin {
        // A backend named by its URL: where it is, for the admin only.
        for (i, b) in backends.iter_mut().enumerate() {
            if b.name.contains("://") {
                b.name = format!("backend {}", i + 1);
            }
        }
    }
    let models = match checked {
        Ok(m) => m,
        Err(e) if backends.len() < 2 => return Err(e),
        Err(e) => {
            let closed = backends.iter().any(|b| b.breaker.name() == "closed");
            if !closed {
                return Err(e);
            }
            Vec::new()
        }
    };
    Ok(LlmCheck {
        base_url: admin.then(|| state.llm.base_url().to_owned()),
        models,
        backends,
    })
}

/// The indexes follow the store: not more than [`MAX_LAG_S`] behind, and
/// a follower that finishes its passes.
fn index_check(state: &AppState) -> Result<IndexCheck, String> {
    let Some(p) = state.loaded() else {
        return Err("loading".to_owned());
    };
    let engine = p.status().engine;
    let lag = engine.lag;
    let pass_age_s = lag.since_pass.as_secs_f64();
    if lag.seconds > MAX_LAG_S {
        return Err(format!(
            "{} changes behind the store, the oldest {:.0} s old",
            lag.entries, lag.seconds
        ));
    }
    if engine.following && pass_age_s > MAX_LAG_S {
        return Err(format!(
            "the follower of the store's changes has not finished a pass for {pass_age_s:.0} s"
        ));
    }
    Ok(IndexCheck {
        applied: lag.applied,
        behind: lag.entries,
        lag_s: lag.seconds,
        pass_age_s,
    })
}
