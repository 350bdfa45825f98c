//! The budgets new requests start with, at runtime: the global profile in
//! force (versioned in the store, so it survives restarts and every replica
//! follows it), tenants' own profiles over it, and the budget experiment
//! that sends a share of requests to a candidate profile. Also the typed
//! documents the admin API shows and takes.

use crate::budget::experiment::{Arm, Experiment};
use crate::budget::profile::BudgetProfile;
use ragtime_core::Stage;
use ragtime_store::Store;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// Every stage's budget by name, as the admin API shows them (and takes
/// them in a `PUT`, where each is required).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageMs {
    pub cache: u64,
    pub embed: u64,
    pub retrieve: u64,
    pub rerank: u64,
    pub llm_ttft: u64,
    pub llm_generate: u64,
    /// Absent from a `PUT` written before the stage existed: the GPU
    /// profile's (it fits both profiles' totals).
    #[serde(default = "default_quote_ms")]
    pub quote: u64,
    pub verify: u64,
}

fn default_quote_ms() -> u64 {
    BudgetProfile::gpu().quote_ms
}

impl From<&BudgetProfile> for StageMs {
    fn from(p: &BudgetProfile) -> Self {
        Self {
            cache: p.cache_ms,
            embed: p.embed_ms,
            retrieve: p.retrieve_ms,
            rerank: p.rerank_ms,
            llm_ttft: p.llm_ttft_ms,
            llm_generate: p.llm_generate_ms,
            quote: p.quote_ms,
            verify: p.verify_ms,
        }
    }
}

/// `{"total_ms", "stages", "version"?}`.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetsDoc {
    pub total_ms: u64,
    pub stages: StageMs,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

impl BudgetsDoc {
    pub fn new(p: &BudgetProfile, version: Option<i64>) -> Self {
        Self {
            total_ms: p.total_ms,
            stages: p.into(),
            version,
        }
    }
}

/// Some stage budgets (a `PATCH`): those named change.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagesPatch {
    pub cache: Option<u64>,
    pub embed: Option<u64>,
    pub retrieve: Option<u64>,
    pub rerank: Option<u64>,
    pub llm_ttft: Option<u64>,
    pub llm_generate: Option<u64>,
    pub quote: Option<u64>,
    pub verify: Option<u64>,
}

/// A change to a profile: `{"total_ms"?, "stages"?: {…}}`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetPatch {
    pub total_ms: Option<u64>,
    pub stages: Option<StagesPatch>,
}

/// A whole profile (a `PUT`): every field required.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetPut {
    pub total_ms: u64,
    pub stages: StageMs,
}

impl From<BudgetPut> for BudgetPatch {
    fn from(p: BudgetPut) -> Self {
        let s = p.stages;
        Self {
            total_ms: Some(p.total_ms),
            stages: Some(StagesPatch {
                cache: Some(s.cache),
                embed: Some(s.embed),
                retrieve: Some(s.retrieve),
                rerank: Some(s.rerank),
                llm_ttft: Some(s.llm_ttft),
                llm_generate: Some(s.llm_generate),
                quote: Some(s.quote),
                verify: Some(s.verify),
            }),
        }
    }
}

/// A refused budget change: the field it is about (`total_ms`,
/// `stages.rerank`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct BudgetError {
    pub field: String,
    pub message: String,
}

impl BudgetPatch {
    fn stages(&self) -> Vec<(Stage, u64)> {
        let s = self.stages.unwrap_or_default();
        [
            (Stage::Cache, s.cache),
            (Stage::Embed, s.embed),
            (Stage::Retrieve, s.retrieve),
            (Stage::Rerank, s.rerank),
            (Stage::LlmTtft, s.llm_ttft),
            (Stage::LlmGenerate, s.llm_generate),
            (Stage::Quote, s.quote),
            (Stage::Verify, s.verify),
        ]
        .into_iter()
        .filter_map(|(stage, ms)| ms.map(|ms| (stage, ms)))
        .collect()
    }

    /// `base` with this change, validated. The error names what the
    /// request changed: a stage it did not touch that no longer fits is
    /// the new total's fault.
    pub fn apply(&self, base: BudgetProfile) -> Result<BudgetProfile, BudgetError> {
        let mut p = base;
        if let Some(t) = self.total_ms {
            p.total_ms = t;
        }
        let touched = self.stages();
        for (stage, ms) in &touched {
            p.set_stage_ms(*stage, *ms);
        }
        p.validate().map_err(|e| {
            let stage = e.field.trim_end_matches("_ms");
            let named = touched.iter().any(|(s, _)| s.name() == stage);
            let field = if e.field == "total_ms" || (!named && self.total_ms.is_some()) {
                "total_ms".to_owned()
            } else {
                format!("stages.{stage}")
            };
            BudgetError {
                field,
                message: e.message,
            }
        })?;
        Ok(p)
    }
}

/// The profile a request runs under, and its experiment arm if any.
pub type Assigned = (BudgetProfile, Option<(Arc<Experiment>, Arm)>);

/// The budgets in force at runtime.
pub struct Budgets {
    store: Store,
    /// The global profile and its stored version (0: as configured).
    global: RwLock<(BudgetProfile, i64)>,
    tenants: RwLock<HashMap<String, BudgetProfile>>,
    priorities: RwLock<HashMap<String, u8>>,
    experiment: RwLock<Option<Arc<Experiment>>>,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(PoisonError::into_inner).clone()
}

impl Budgets {
    /// `configured`: the profile from the config, in force until a stored
    /// version replaces it.
    pub fn new(store: Store, configured: BudgetProfile) -> Self {
        Self {
            store,
            global: RwLock::new((configured, 0)),
            tenants: RwLock::default(),
            priorities: RwLock::default(),
            experiment: RwLock::default(),
        }
    }

    /// The global profile.
    pub fn global(&self) -> BudgetProfile {
        read(&self.global).0
    }

    /// The global profile and its version.
    pub fn versioned(&self) -> (BudgetProfile, i64) {
        read(&self.global)
    }

    /// What a tenant's requests start with: its own profile or the global.
    pub fn for_tenant(&self, tenant: &str) -> BudgetProfile {
        read(&self.tenants)
            .get(tenant)
            .copied()
            .unwrap_or_else(|| self.global())
    }

    /// A tenant's priority in the LLM queues (0 unless the admin set one).
    pub fn priority(&self, tenant: &str) -> u8 {
        read(&self.priorities).get(tenant).copied().unwrap_or(0)
    }

    /// Sets (`Some`) or removes (`None`) a tenant's priority; `false` when
    /// there was none to remove.
    pub async fn set_priority(&self, tenant: &str, p: Option<u8>) -> Result<bool, String> {
        let done = self
            .store
            .set_tenant_priority(tenant, p)
            .await
            .map_err(|e| e.to_string())?;
        self.sync_tenants().await?;
        Ok(done)
    }

    pub fn has_own(&self, tenant: &str) -> bool {
        read(&self.tenants).contains_key(tenant)
    }

    /// The profile a tenant's new request runs under, and its arm when an
    /// experiment is running (also recorded on the request's span).
    pub fn assign(&self, tenant: &str) -> Assigned {
        let base = self.for_tenant(tenant);
        match read(&self.experiment) {
            Some(e) => {
                let (arm, p) = e.assign(base);
                tracing::Span::current().record("ragtime.experiment_arm", arm.name());
                (p, Some((e, arm)))
            }
            None => (base, None),
        }
    }

    /// Stores `p` as a new global version and puts it in force.
    pub async fn save(&self, p: BudgetProfile, note: &str) -> Result<i64, String> {
        let text = serde_json::to_string(&p).map_err(|e| e.to_string())?;
        let v = self
            .store
            .add_budget_version(&text, "admin", note)
            .await
            .map_err(|e| e.to_string())?;
        self.apply(p, v.version);
        tracing::info!(
            version = v.version,
            note,
            "budgets changed through the admin api"
        );
        Ok(v.version)
    }

    /// A stored version's profile.
    pub async fn version(&self, version: i64) -> Result<Option<BudgetProfile>, String> {
        match self.store.budget_version(version).await {
            Ok(Some(v)) => serde_json::from_str(&v.profile)
                .map(Some)
                .map_err(|e| e.to_string()),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Puts a stored version in force unless a newer one already is.
    fn apply(&self, profile: BudgetProfile, version: i64) -> bool {
        let mut g = self.global.write().unwrap_or_else(PoisonError::into_inner);
        if version > g.1 {
            *g = (profile, version);
            true
        } else {
            false
        }
    }

    /// Sets (`Some`) or removes (`None`) a tenant's own profile; `false`
    /// when there was none to remove.
    pub async fn set_tenant(&self, tenant: &str, p: Option<BudgetProfile>) -> Result<bool, String> {
        let done = match p {
            Some(p) => {
                let text = serde_json::to_string(&p).map_err(|e| e.to_string())?;
                self.store
                    .set_tenant_budgets(tenant, &text)
                    .await
                    .map(|()| true)
            }
            None => self.store.delete_tenant_budgets(tenant).await,
        }
        .map_err(|e| e.to_string())?;
        self.sync_tenants().await?;
        Ok(done)
    }

    /// Reads the newest stored global version and puts it in force.
    pub async fn sync(&self) -> Result<bool, String> {
        let Some(v) = self
            .store
            .latest_budget_version()
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(false);
        };
        if v.version <= self.versioned().1 {
            return Ok(false);
        }
        let profile: BudgetProfile = serde_json::from_str(&v.profile)
            .map_err(|e| format!("budget version {}: {e}", v.version))?;
        let changed = self.apply(profile, v.version);
        if changed {
            tracing::info!(version = v.version, changed_by = %v.changed_by, "budgets changed");
        }
        Ok(changed)
    }

    /// Replaces the tenants' profiles and priorities with what the store
    /// holds.
    pub async fn sync_tenants(&self) -> Result<(), String> {
        let rows = self
            .store
            .tenant_budgets()
            .await
            .map_err(|e| e.to_string())?;
        let mut map = HashMap::new();
        for (tenant, json) in rows {
            let p: BudgetProfile = serde_json::from_str(&json)
                .map_err(|e| format!("budgets of tenant {tenant}: {e}"))?;
            map.insert(tenant, p);
        }
        *self.tenants.write().unwrap_or_else(PoisonError::into_inner) = map;
        let prios = self
            .store
            .tenant_priorities()
            .await
            .map_err(|e| e.to_string())?;
        *self
            .priorities
            .write()
            .unwrap_or_else(PoisonError::into_inner) = prios.into_iter().collect();
        Ok(())
    }

    /// Follows the store every `every` (so every replica sharing it
    /// applies a change within that time) until `self` is dropped.
    pub fn follow(self: &Arc<Self>, every: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(b) = me.upgrade() else {
                    return;
                };
                if let Err(e) = b.sync().await {
                    tracing::warn!(error = %e, "could not read the budget versions");
                }
                if let Err(e) = b.sync_tenants().await {
                    tracing::warn!(error = %e, "could not read the tenants' budgets");
                }
            }
        });
    }

    /// The running experiment.
    pub fn experiment(&self) -> Option<Arc<Experiment>> {
        read(&self.experiment)
    }

    /// Starts `e`, unless one is running (its name is the error).
    pub fn start_experiment(&self, e: Arc<Experiment>) -> Result<(), String> {
        let mut slot = self
            .experiment
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = slot.as_ref() {
            return Err(running.name.clone());
        }
        *slot = Some(e);
        Ok(())
    }

    /// Stops the running experiment and hands it back.
    pub fn stop_experiment(&self) -> Option<Arc<Experiment>> {
        self.experiment
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_names_what_it_broke() {
        let base = BudgetProfile::cpu();
        let p = |v: serde_json::Value| serde_json::from_value::<BudgetPatch>(v).ok();
        let ok = p(serde_json::json!({"stages": {"rerank": 0}})).map(|x| x.apply(base));
        assert_eq!(ok.and_then(Result::ok).map(|p| p.rerank_ms), Some(0));
        // A stage over the total is the stage's fault …
        let e = p(serde_json::json!({"stages": {"rerank": 20000}})).map(|x| x.apply(base));
        assert_eq!(
            e.and_then(Result::err).map(|e| e.field),
            Some("stages.rerank".into())
        );
        // … unless the request only moved the total.
        let e = p(serde_json::json!({"total_ms": 100})).map(|x| x.apply(base));
        assert_eq!(
            e.and_then(Result::err).map(|e| e.field),
            Some("total_ms".into())
        );
        assert!(p(serde_json::json!({"stages": {"bogus": 1}})).is_none());
    }
}
