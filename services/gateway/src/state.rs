//! What every request handler can reach.

use crate::auth::Limits;
use crate::config::Config;
use crate::error::{ApiError, ErrorCode};
use ragtime_llm::{LlmClient, LocalServer};
use ragtime_pipeline::Pipeline;
use ragtime_pipeline::backend::Backends;
use ragtime_pipeline::budget::runtime::Budgets;
use ragtime_store::Store;
use ragtime_telemetry::metrics::Metrics;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Loading state of the models and indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Failed(String),
}

pub struct AppState {
    pub config: Config,
    pub store: Store,
    /// The budgets new requests start with (followed from the store).
    pub budgets: Arc<Budgets>,
    pub metrics: Arc<Metrics>,
    /// The first LLM backend's client (its model list for `/readyz`).
    pub llm: LlmClient,
    /// Every LLM backend, with its gate and breaker.
    pub backends: Arc<Backends>,
    /// The supervised local llama-server, when no backend URL is configured.
    local_llm: Mutex<Option<LocalServer>>,
    pipeline: OnceLock<Arc<Pipeline>>,
    loading: Mutex<ModelState>,
    /// Per-tenant rate limits.
    pub limits: Limits,
}

impl AppState {
    pub fn new(
        config: Config,
        store: Store,
        llm: LlmClient,
        backends: Arc<Backends>,
        local: Option<LocalServer>,
    ) -> Self {
        let l = &config.limits;
        Self {
            limits: Limits::new(l.requests_per_s, l.burst, l.concurrent_streams),
            budgets: Arc::new(Budgets::new(store.clone(), config.budgets)),
            metrics: Arc::default(),
            store,
            llm,
            backends,
            local_llm: Mutex::new(local),
            pipeline: OnceLock::new(),
            loading: Mutex::new(ModelState::Loading),
            config,
        }
    }

    /// The pipeline, once the models are warm and the indexes loaded;
    /// 503 until then.
    pub fn pipeline(&self) -> Result<Arc<Pipeline>, ApiError> {
        self.pipeline
            .get()
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorCode::NotReady, "the models are still loading"))
    }

    /// The pipeline if it is loaded.
    pub fn loaded(&self) -> Option<&Arc<Pipeline>> {
        self.pipeline.get()
    }

    pub fn set_pipeline(&self, result: Result<Pipeline, String>) {
        match result {
            Ok(p) => {
                let _ = self.pipeline.set(Arc::new(p));
            }
            Err(e) => {
                *self.loading.lock().unwrap_or_else(PoisonError::into_inner) =
                    ModelState::Failed(e);
            }
        }
    }

    /// Why the pipeline is not available yet.
    pub fn loading(&self) -> ModelState {
        self.loading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn take_local_llm(&self) -> Option<LocalServer> {
        self.local_llm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}
