//! What every request handler can reach.

use crate::config::Config;
use ragtime_llm::{BackendStats, LlmClient, LocalServer};
use ragtime_pipeline::BudgetProfile;
use ragtime_pipeline::chat::AnswerCache;
use ragtime_pipeline::rag::Rag;
use ragtime_store::Store;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

/// Loading state of the models and indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Failed(String),
}

pub struct AppState {
    pub config: Config,
    /// The budgets new requests start with, and their version (0: the
    /// configured ones, never changed at runtime).
    budgets: RwLock<(BudgetProfile, i64)>,
    pub store: Store,
    pub llm: LlmClient,
    /// The supervised local llama-server, when no backend URL is configured.
    pub local_llm: Mutex<Option<LocalServer>>,
    rag: OnceLock<Arc<Rag>>,
    rag_state: Mutex<ModelState>,
    /// The cross-encoder, when `rerank.model_dir` is configured.
    pub reranker: OnceLock<Arc<ragtime_rerank::CrossEncoder>>,
    /// What the LLM backend has shown of its speed (prefill, per token).
    pub llm_stats: BackendStats,
    /// The semantic response cache, unless turned off.
    pub answers: Option<AnswerCache>,
    /// Prometheus metrics and live stage percentiles.
    pub metrics: Arc<ragtime_telemetry::metrics::Metrics>,
    /// Per-tenant rate limits.
    pub limits: crate::tenant::Limits,
    /// Tenants' own budget profiles, overriding the global one.
    tenant_budgets: RwLock<std::collections::HashMap<String, BudgetProfile>>,
    /// The budget experiment running, if any.
    pub experiment: RwLock<Option<Arc<crate::experiment::Experiment>>>,
}

impl AppState {
    pub fn new(
        config: Config,
        store: Store,
        llm: LlmClient,
        local_llm: Option<LocalServer>,
    ) -> Self {
        Self {
            budgets: RwLock::new((config.budgets, 0)),
            store,
            llm,
            local_llm: Mutex::new(local_llm),
            rag: OnceLock::new(),
            rag_state: Mutex::new(ModelState::Loading),
            reranker: OnceLock::new(),
            llm_stats: BackendStats::default(),
            metrics: Arc::default(),
            tenant_budgets: RwLock::default(),
            experiment: RwLock::default(),
            limits: crate::tenant::Limits::new(
                config.limits.requests_per_s,
                config.limits.burst,
                config.limits.concurrent_streams,
            ),
            answers: config.cache.enabled.then(|| {
                let c = &config.cache;
                AnswerCache::new(ragtime_cache::CacheOptions {
                    max_entries: c.max_entries,
                    ttl: std::time::Duration::from_secs(c.ttl_s),
                    min_cosine: c.min_cosine,
                })
            }),
            config,
        }
    }

    /// The budget profile new requests start with.
    pub fn budgets(&self) -> BudgetProfile {
        self.budgets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// The budgets a tenant's new requests start with: its own profile, or
    /// the global one.
    pub fn budgets_for(&self, tenant: &str) -> BudgetProfile {
        self.tenant_budgets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tenant)
            .copied()
            .unwrap_or_else(|| self.budgets())
    }

    /// The profile a tenant's new request runs under, and its experiment
    /// arm when an experiment is running (also recorded on the request span).
    pub fn profile_for(
        &self,
        tenant: &str,
    ) -> (
        BudgetProfile,
        Option<(Arc<crate::experiment::Experiment>, crate::experiment::Arm)>,
    ) {
        let base = self.budgets_for(tenant);
        let exp = self
            .experiment
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match exp {
            Some(e) => {
                let (arm, p) = e.assign(base);
                tracing::Span::current().record("ragtime.experiment_arm", arm.name());
                (p, Some((e, arm)))
            }
            None => (base, None),
        }
    }

    /// The tenants' own profiles.
    pub fn tenant_overrides(&self) -> std::collections::HashMap<String, BudgetProfile> {
        self.tenant_budgets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the in-memory overrides with what the store holds.
    pub async fn sync_tenant_budgets(&self) -> Result<(), String> {
        let rows = self
            .store
            .tenant_budgets()
            .await
            .map_err(|e| e.to_string())?;
        let mut map = std::collections::HashMap::new();
        for (tenant, json) in rows {
            let p: BudgetProfile = serde_json::from_str(&json)
                .map_err(|e| format!("budgets of tenant {tenant}: {e}"))?;
            map.insert(tenant, p);
        }
        *self
            .tenant_budgets
            .write()
            .unwrap_or_else(PoisonError::into_inner) = map;
        Ok(())
    }

    /// The budgets in force and their version.
    pub fn budgets_versioned(&self) -> (BudgetProfile, i64) {
        *self.budgets.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a stored version in force unless a newer one already is.
    /// Returns whether it changed anything.
    pub fn apply_budgets(&self, profile: BudgetProfile, version: i64) -> bool {
        let mut g = self.budgets.write().unwrap_or_else(PoisonError::into_inner);
        if version > g.1 {
            *g = (profile, version);
            true
        } else {
            false
        }
    }

    /// Reads the newest stored budget version and puts it in force (at
    /// start, and every second after, so every replica follows a change).
    pub async fn sync_budgets(&self) -> Result<bool, String> {
        let Some(v) = self
            .store
            .latest_budget_version()
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(false);
        };
        if v.version <= self.budgets_versioned().1 {
            return Ok(false);
        }
        let profile: BudgetProfile = serde_json::from_str(&v.profile)
            .map_err(|e| format!("budget version {}: {e}", v.version))?;
        let changed = self.apply_budgets(profile, v.version);
        if changed {
            tracing::info!(version = v.version, changed_by = %v.changed_by, "budgets changed");
        }
        Ok(changed)
    }

    /// The engine, once the embedding model is warm and the indexes are
    /// rebuilt from the store.
    pub fn rag(&self) -> Option<Arc<Rag>> {
        self.rag.get().cloned()
    }

    pub fn set_rag(&self, result: Result<Rag, String>) {
        match result {
            Ok(r) => {
                let _ = self.rag.set(Arc::new(r));
            }
            Err(e) => {
                *self
                    .rag_state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = ModelState::Failed(e)
            }
        }
    }

    /// Why the engine is not available yet.
    pub fn rag_state(&self) -> ModelState {
        self.rag_state
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
