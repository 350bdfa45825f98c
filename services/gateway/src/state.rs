//! What every request handler can reach.

use crate::config::Config;
use ragtime_embed::OnnxEmbedder;
use ragtime_llm::{LlmClient, LocalServer};
use ragtime_pipeline::BudgetProfile;
use ragtime_store::Store;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

/// Loading state of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Failed(String),
}

pub struct AppState {
    pub config: Config,
    budgets: RwLock<BudgetProfile>,
    pub store: Store,
    pub llm: LlmClient,
    /// The supervised local llama-server, when no backend URL is configured.
    pub local_llm: Mutex<Option<LocalServer>>,
    embedder: OnceLock<Arc<OnnxEmbedder>>,
    embed_state: Mutex<ModelState>,
}

impl AppState {
    pub fn new(
        config: Config,
        store: Store,
        llm: LlmClient,
        local_llm: Option<LocalServer>,
    ) -> Self {
        Self {
            budgets: RwLock::new(config.budgets),
            config,
            store,
            llm,
            local_llm: Mutex::new(local_llm),
            embedder: OnceLock::new(),
            embed_state: Mutex::new(ModelState::Loading),
        }
    }

    /// The budget profile new requests start with.
    pub fn budgets(&self) -> BudgetProfile {
        *self.budgets.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn embedder(&self) -> Option<Arc<OnnxEmbedder>> {
        self.embedder.get().cloned()
    }

    pub fn set_embedder(&self, result: Result<OnnxEmbedder, String>) {
        match result {
            Ok(e) => {
                let _ = self.embedder.set(Arc::new(e));
            }
            Err(e) => {
                *self
                    .embed_state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = ModelState::Failed(e)
            }
        }
    }

    /// Why the embedder is not available yet.
    pub fn embed_state(&self) -> ModelState {
        self.embed_state
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
