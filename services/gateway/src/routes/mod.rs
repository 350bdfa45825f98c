//! One file per route resource.

mod embeddings;
mod health;

use crate::state::AppState;
use axum::Router;
use axum::routing::{get, post};
use std::sync::Arc;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/v1/embeddings", post(embeddings::create))
        .with_state(state)
}
