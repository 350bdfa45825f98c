//! `[llm]`: the LLM backends, their admission, hedging and breakers.

use super::{ConfigError, invalid};
use super::{Secret, cache_dir};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// OpenAI-compatible base URL ending in `/v1` (`RAGTIME__LLM__BASE_URL`).
    /// Unset: start and supervise the local llama-server.
    pub base_url: Option<String>,
    /// Model name sent to the backend (`RAGTIME__LLM__MODEL`).
    pub model: String,
    pub api_key: Option<Secret>,
    /// The local llama-server binary and model (used when `base_url` is unset).
    pub server_bin: PathBuf,
    pub model_path: PathBuf,
    /// Context window (tokens): the local server's, split over its slots;
    /// for a remote backend, the window of one sequence.
    pub ctx_size: u32,
    pub threads: u32,
    /// The local server's slots (concurrent sequences).
    pub parallel: u32,
    /// Prompt tokens the local server reads in one step; it reports its
    /// progress once a step, which is how a first token that will come
    /// too late is known early (docs/benchmarks.md, "Under load").
    pub batch_size: u32,
    /// Ask a llama.cpp backend to reuse the part of a prompt its slot has
    /// already read (`cache_prompt`): prompts put the instructions and
    /// sources first, so requests on the same sources share a prefix
    /// (docs/benchmarks.md, "Prompt prefix reuse").
    pub prompt_cache: bool,
    /// How long the local server may take to load before readiness fails.
    pub startup_timeout_s: u64,
    /// The slots of the backend at `base_url`.
    pub max_concurrency: usize,
    /// Several backends instead of one (`base_url`): requests go to the one
    /// with the least expected wait.
    pub backends: Vec<BackendConfig>,
    /// Requests that may wait for a slot, per backend; past it, 503.
    pub max_queue: usize,
    /// The longest a request waits for a slot before it is answered
    /// without the model (0: as long as its first-token budget allows).
    /// Whoever will not get the model's answer learns it within about a
    /// second; a short wait still keeps a slot that comes free busy.
    pub max_queue_wait_ms: u64,
    pub hedge: HedgeConfig,
    pub breaker: BreakerConfig,
    /// Health probes of every backend, this often (0: off).
    pub probe_ms: u64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        let c = cache_dir();
        Self {
            base_url: None,
            model: "smollm2-135m-instruct".into(),
            api_key: None,
            server_bin: c.join("bin/llama-server"),
            model_path: c.join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ctx_size: 4096,
            threads: 2,
            parallel: 2,
            batch_size: 256,
            prompt_cache: true,
            startup_timeout_s: 120,
            max_concurrency: 16,
            backends: Vec::new(),
            max_queue: 32,
            max_queue_wait_ms: 750,
            hedge: HedgeConfig::default(),
            breaker: BreakerConfig::default(),
            probe_ms: 500,
        }
    }
}

/// One of several LLM backends (`[[llm.backends]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// OpenAI-compatible base URL ending in `/v1`.
    pub base_url: String,
    /// Model name sent to it (default: `llm.model`).
    #[serde(default)]
    pub model: Option<String>,
    /// Its slots (concurrent sequences).
    pub max_concurrency: usize,
    /// Share of traffic at equal expected wait.
    #[serde(default = "one")]
    pub weight: f64,
    /// Its context window per sequence (default: `llm.ctx_size`).
    #[serde(default)]
    pub ctx_size: Option<u32>,
}

fn one() -> f64 {
    1.0
}

/// Hedged requests (`[llm.hedge]`): a request whose first token is later
/// than its backend's p95 (within `floor_ms`–`cap_ms`) also goes to a
/// second backend with a free slot; at most `share` of requests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HedgeConfig {
    pub enabled: bool,
    pub share: f64,
    pub floor_ms: u64,
    pub cap_ms: u64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        let d = ragtime_pipeline::backend::HedgePolicy::default();
        Self {
            enabled: d.enabled,
            share: d.share,
            floor_ms: d.floor.as_millis() as u64,
            cap_ms: d.cap.as_millis() as u64,
        }
    }
}

/// Circuit breakers (`[llm.breaker]`): `failures` in a row open a
/// backend's breaker for `cooldown_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    pub failures: u32,
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 3,
            cooldown_ms: 5_000,
        }
    }
}

impl LlmConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let http = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        if let Some(url) = &self.base_url
            && !http(url)
        {
            return Err(invalid(
                "llm.base_url",
                format!("{url:?} is not an http(s) URL"),
            ));
        }
        if self.model.trim().is_empty() {
            return Err(invalid("llm.model", "must not be empty"));
        }
        for (i, b) in self.backends.iter().enumerate() {
            let key = format!("llm.backends[{i}]");
            if !http(&b.base_url) {
                return Err(invalid(&format!("{key}.base_url"), "is not an http(s) URL"));
            }
            if !(1..=4096).contains(&b.max_concurrency) {
                return Err(invalid(
                    &format!("{key}.max_concurrency"),
                    "must be between 1 and 4096",
                ));
            }
            if !(b.weight > 0.0 && b.weight.is_finite()) {
                return Err(invalid(&format!("{key}.weight"), "must be greater than 0"));
            }
        }
        if !self.backends.is_empty() && self.base_url.is_some() {
            return Err(invalid(
                "llm.backends",
                "set llm.base_url or llm.backends, not both",
            ));
        }
        if !(1..=4096).contains(&self.max_concurrency) {
            return Err(invalid("llm.max_concurrency", "must be between 1 and 4096"));
        }
        if self.max_queue_wait_ms > 3_600_000 {
            return Err(invalid(
                "llm.max_queue_wait_ms",
                "must be at most 3600000 (an hour; 0 waits as long as the budget allows)",
            ));
        }
        if self.max_queue > 100_000 {
            return Err(invalid("llm.max_queue", "must be at most 100000"));
        }
        let h = &self.hedge;
        if !(0.0..=1.0).contains(&h.share) || h.floor_ms > h.cap_ms {
            return Err(invalid(
                "llm.hedge",
                "share must be between 0 and 1, and floor_ms at most cap_ms",
            ));
        }
        if self.breaker.failures == 0 {
            return Err(invalid("llm.breaker.failures", "must be at least 1"));
        }
        if !(32..=8192).contains(&self.batch_size) {
            return Err(invalid("llm.batch_size", "must be between 32 and 8192"));
        }
        if self.ctx_size < 512 {
            return Err(invalid("llm.ctx_size", "must be at least 512"));
        }
        if self.threads == 0 || self.parallel == 0 {
            return Err(invalid(
                "llm.threads",
                "llm.threads and llm.parallel must be at least 1",
            ));
        }
        Ok(())
    }
}
