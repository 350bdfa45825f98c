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
    /// API keys looked up lately, by id (`None`: no such key), kept for
    /// [`KEY_CACHE_TTL`]: a request with a key needs no store connection,
    /// and a key revoked on another replica stops working within that.
    pub keys: moka::sync::Cache<String, Option<ragtime_store::ApiKeyRecord>>,
}

/// How long an API key lookup is reused (a revocation made elsewhere
/// holds after at most this; one made here, at once).
pub const KEY_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(2);

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
            keys: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(KEY_CACHE_TTL)
                .build(),
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
