//! `GET /healthz`: the process is alive. `GET /readyz`: models loaded and
//! warmed, store open, LLM reachable — 200 only when all three hold.

use crate::state::{AppState, ModelState};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "alive"}))
}

fn check(result: Result<Value, String>) -> (bool, Value) {
    match result {
        Ok(mut detail) => {
            detail["ok"] = Value::Bool(true);
            (true, detail)
        }
        Err(e) => (false, json!({"ok": false, "error": e})),
    }
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let embed = match state.rag() {
        Some(r) => Ok(json!({
            "model": "all-minilm-l6-v2",
            "dim": r.embedder.dim(),
            "chunks_indexed": r.indexes.len(),
            "reranker": state.reranker.get().is_some(),
        })),
        None => match state.rag_state() {
            ModelState::Loading => Err("loading".to_owned()),
            ModelState::Failed(e) => Err(e),
        },
    };
    let (store, llm) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(1), state.store.ping())
                .await
                .map_err(|_| "ping timed out".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map(|()| json!({"backend": format!("{:?}", state.store.backend()).to_lowercase()}))
        },
        async {
            state
                .llm
                .check(Duration::from_secs(1))
                .await
                .map(|models| json!({"base_url": state.llm.base_url(), "models": models}))
        }
    );
    let checks = [
        ("embed", check(embed)),
        ("store", check(store)),
        ("llm", check(llm)),
    ];
    let ready = checks.iter().all(|(_, (ok, _))| *ok);
    let body = json!({
        "status": if ready { "ready" } else { "not_ready" },
        "checks": checks.into_iter().map(|(k, (_, v))| (k.to_owned(), v)).collect::<serde_json::Map<_, _>>(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}
