//! Configuration, layered: built-in defaults → `ragtime.toml` →
//! `RAGTIME__SECTION__KEY` environment variables (plus the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`). Validated once at start.

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use ragtime_pipeline::AnswerSettings;
use ragtime_pipeline::BudgetProfile;
use ragtime_pipeline::chat::{AnswerMode, OnUngrounded};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config: {0}")]
    Load(String),
    #[error("config: {key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

/// A value that must never reach a log line: `Debug` and `Serialize`
/// (`ragtime config`) show `***`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(SecretString);

impl Secret {
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(SecretString::from(s))
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(SecretString::from(s))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

/// Where `make setup` puts models and binaries (`RAGTIME_CACHE`, default
/// `~/.cache/ragtime`).
pub fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("RAGTIME_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/ragtime")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    /// Folder for the SQLite database and index files (`RAGTIME__DATA_DIR`).
    pub data_dir: PathBuf,
    /// `postgres://…` to use PostgreSQL; unset = SQLite in `data_dir`.
    pub database_url: Option<Secret>,
    /// Bearer key for `/admin` (`RAGTIME__ADMIN_KEY`); unset = admin API off.
    pub admin_key: Option<Secret>,
    pub embed: EmbedConfig,
    pub chunking: ChunkingConfig,
    pub rerank: RerankConfig,
    pub llm: LlmConfig,
    pub chat: ChatConfig,
    pub cache: CacheConfig,
    pub auth: AuthConfig,
    pub limits: LimitsConfig,
    pub snapshots: SnapshotsConfig,
    pub budgets: BudgetProfile,
    pub load: LoadConfig,
    pub telemetry: TelemetryConfig,
}

/// End-user authentication (`[auth]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Refuse `/v1` requests without an API key (`RAGTIME__AUTH__REQUIRE_API_KEY`).
    /// Off: requests without a key act for the tenant `default`.
    pub require_api_key: bool,
}

/// Per-tenant rate limits and quotas, and what idle collections cost
/// (`[limits]`); 0 turns a rate limit off.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Sustained requests per second per tenant on `/v1`.
    pub requests_per_s: f64,
    /// Requests a tenant may send at once before the rate applies (0: the
    /// rate, rounded up).
    pub burst: u32,
    /// Chat streams open at once per tenant.
    pub concurrent_streams: u32,
    /// Collections a tenant may have (admins set a tenant's own with
    /// `PUT /admin/tenants/{tenant}/quotas`).
    pub max_collections: i64,
    /// Documents a tenant may store over all its collections.
    pub max_documents: i64,
    /// Chunks a tenant may store over all its collections.
    pub max_chunks: i64,
    /// A collection no search has used for this long drops its in-memory
    /// indexes; its next request loads them from the store (0: never).
    pub idle_unload_s: u64,
    /// Collections whose indexes load at start, the largest first; the
    /// rest load at their first request.
    pub preload_collections: usize,
    /// Ingests (`POST /v1/documents`, uploads) running at once over all
    /// tenants; one more answers 503 `overloaded` with `Retry-After` (0:
    /// no limit). Each holds its documents' text and vectors until it
    /// commits, so this bounds ingest memory beside the embedding queue.
    pub max_concurrent_ingests: usize,
    /// Ingest jobs a replica holds, queued or running; one more answers
    /// 503 `overloaded` (0: no limit). A running job takes one of
    /// `max_concurrent_ingests`.
    pub max_jobs: usize,
    /// Jobs one tenant may hold on a replica, queued or running; one more
    /// answers 503 `overloaded` naming this setting (0: no limit).
    pub max_jobs_per_tenant: usize,
    /// The text all held jobs keep in memory until they are done (each
    /// holds its whole upload); a job that would pass it answers 503
    /// `overloaded` naming this setting (0: no limit).
    pub max_queued_job_bytes: usize,
    /// An ingest whose documents' text is larger than this (or that has
    /// more than 1,000 documents) runs as a job: 202 with its id.
    pub job_above_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let q = ragtime_pipeline::corpus::Quotas::default();
        Self {
            requests_per_s: 0.0,
            burst: 0,
            concurrent_streams: 0,
            max_collections: q.max_collections,
            max_documents: q.max_documents,
            max_chunks: q.max_chunks,
            idle_unload_s: 0,
            preload_collections: 1000,
            max_concurrent_ingests: 8,
            max_jobs: 16,
            max_jobs_per_tenant: 4,
            max_queued_job_bytes: 512 * 1024 * 1024,
            job_above_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Collections' indexes saved in `data_dir/indexes` (`[snapshots]`), so
/// a start reads them instead of rebuilding the HNSW graph from the store
/// (then replays the store's changes made after the save).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotsConfig {
    pub enabled: bool,
    /// Collections with fewer chunks load from the store and are not saved.
    pub min_chunks: usize,
    /// A loaded collection that changed is saved again after this many
    /// seconds (a save holds up ingests while it writes).
    pub every_s: u64,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_chunks: 10_000,
            every_s: 300,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChatConfig {
    /// Passages put into the prompt (a request's `top_k` overrides it).
    pub top_k: usize,
    /// Earlier messages of a stored conversation put into the prompt.
    pub history_messages: usize,
    /// Days a conversation's messages are kept (0: for ever); a
    /// background task removes older ones every hour.
    pub retention_days: u32,
    /// `generate`, `extractive` or `quote_then_generate` (a request's
    /// `answer` overrides it). Unset: `extractive` on the embedded local
    /// model (on two cores SmolLM2-135M answers right less often than the
    /// extractive quote, and loops; `ragtime-bench answers`), `generate`
    /// with a configured backend.
    pub answer: Option<AnswerMode>,
    /// What an answer the grounding check does not support becomes:
    /// `annotate` or `extractive`.
    pub on_ungrounded: OnUngrounded,
    /// Sampling temperature when the client sends none.
    pub temperature: f64,
    /// `frequency_penalty` when the client sends none.
    pub frequency_penalty: f64,
    /// `max_tokens` when the client sets none.
    pub max_tokens: u32,
}

impl Default for ChatConfig {
    fn default() -> Self {
        let a = AnswerSettings::default();
        Self {
            top_k: 5,
            history_messages: 6,
            retention_days: 30,
            answer: None,
            on_ungrounded: a.on_ungrounded,
            temperature: a.temperature,
            frequency_penalty: a.frequency_penalty,
            max_tokens: a.max_tokens,
        }
    }
}

impl ChatConfig {
    /// The settings in force; `local`: whether the LLM is the embedded
    /// local model.
    pub fn answer_settings(&self, local: bool) -> AnswerSettings {
        let auto = if local {
            AnswerMode::Extractive
        } else {
            AnswerMode::Generate
        };
        AnswerSettings {
            mode: self.answer.unwrap_or(auto),
            on_ungrounded: self.on_ungrounded,
            temperature: self.temperature,
            frequency_penalty: self.frequency_penalty,
            max_tokens: self.max_tokens,
        }
    }
}

/// The semantic response cache (`[cache]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub enabled: bool,
    pub max_entries: u64,
    pub ttl_s: u64,
    /// A cached question at least this similar (cosine) to the new one,
    /// and not vetoed (negation, number, swapped entities), is a hit.
    pub min_cosine: f32,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let d = ragtime_cache::CacheOptions::default();
        Self {
            enabled: true,
            max_entries: d.max_entries,
            ttl_s: d.ttl.as_secs(),
            min_cosine: d.min_cosine,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listen address (`RAGTIME__SERVER__ADDR`); port 0 picks a free port.
    pub addr: SocketAddr,
    /// Largest request body accepted, in bytes.
    pub body_limit_bytes: usize,
    /// How long in-flight requests get to finish on shutdown.
    pub shutdown_grace_s: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbedConfig {
    /// Folder with `model.onnx` and `tokenizer.json`.
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library.
    pub ort_lib: PathBuf,
    pub intra_threads: usize,
    pub max_tokens: usize,
    /// Most texts in one inference (micro-batches merge up to this).
    pub batch_size: usize,
    /// Most padded tokens in one inference (texts × longest).
    pub max_batch_tokens: usize,
    /// Embedding worker threads.
    pub workers: usize,
    /// How long a worker waits for concurrent requests to fill a batch (µs).
    pub batch_wait_us: u64,
    /// Query-embedding cache bounds.
    pub cache_entries: u64,
    pub cache_ttl_s: u64,
    /// Passage texts ingestion may queue for embedding; an ingest that
    /// would pass it while others wait answers 503 with `Retry-After`.
    pub max_queued_texts: usize,
    /// Embed passages at ingestion with int8 matrix products: about twice
    /// the ingest throughput, at a cosine of ≈ 0.995 to fp32 and no
    /// measurable change in retrieval quality. Queries always use fp32.
    pub passage_int8: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkingConfig {
    /// Tokens per chunk (the embedding window is 256; MiniLM was trained
    /// on 128, and 128 scores better on SciFact than 200).
    pub max_tokens: usize,
    /// Tokens shared by consecutive chunks.
    pub overlap_tokens: usize,
    /// What BM25 ranks documents by (`RAGTIME__CHUNKING__LEXICAL`):
    /// `documents` (whole documents, title and text as fields; better on
    /// collections of short documents, e.g. abstracts), `chunks` (a
    /// document ranks by its best chunk; better on long, many-section
    /// documents such as manuals), or `auto` (per collection: documents
    /// while they average at most 8 chunks, else chunks).
    pub lexical: Lexical,
}

/// [`ChunkingConfig::lexical`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lexical {
    Documents,
    Chunks,
    Auto,
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            overlap_tokens: 24,
            lexical: Lexical::Auto,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RerankConfig {
    /// A BERT-style cross-encoder exported to ONNX (`RAGTIME__RERANK__MODEL_DIR`):
    /// its ONNX file and `tokenizer.json`. Unset: no reranking.
    pub model_dir: Option<PathBuf>,
    /// The ONNX file in `model_dir`; empty: `model-int8.onnx` where there
    /// is one (about twice as fast on CPU, so the default budget scores
    /// every candidate), else `model.onnx`.
    pub model_file: String,
    /// Candidates reranked, best-first by retrieval rank.
    pub depth: usize,
    /// Pairs per model call (the granularity of anytime reranking).
    pub batch: usize,
    /// Weight of the cross-encoder score in the final blend (0–1).
    pub weight: f32,
    pub max_tokens: usize,
}

impl Default for RerankConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            model_file: String::new(),
            depth: 20,
            batch: 4,
            weight: ragtime_pipeline::rerank::DEFAULT_WEIGHT,
            max_tokens: 256,
        }
    }
}

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
    /// How long the local server may take to load before readiness fails.
    pub startup_timeout_s: u64,
    /// The slots of the backend at `base_url`.
    pub max_concurrency: usize,
    /// Several backends instead of one (`base_url`): requests go to the one
    /// with the least expected wait.
    pub backends: Vec<BackendConfig>,
    /// Requests that may wait for a slot, per backend; past it, 503.
    pub max_queue: usize,
    pub hedge: HedgeConfig,
    pub breaker: BreakerConfig,
    /// Health probes of every backend, this often (0: off).
    pub probe_ms: u64,
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

/// Adaptive degradation (`[load]`): the levels requests shrink through as
/// the backends fill up.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadConfig {
    pub levels: ragtime_pipeline::load::Levels,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatSetting {
    Auto,
    Pretty,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub log_format: LogFormatSetting,
    /// From the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (unset: no export).
    pub otlp_endpoint: Option<String>,
    /// From `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` (default) or `http/protobuf`.
    pub otlp_protocol: String,
    /// Share of healthy requests whose trace is exported, 0 to 1 (a caller's
    /// sampled `traceparent` is honoured). Degraded requests — partial, a
    /// stage overran, shed, failed — are exported whatever it is.
    pub sample_ratio: f64,
    /// Spans of not-yet-chosen traces held until their request ends; past
    /// it spans are dropped (and counted).
    pub sample_buffer_spans: usize,
    /// The same bound in MiB (spans' text and attributes, estimated): when
    /// either is reached the oldest held traces give way.
    pub sample_buffer_mib: usize,
    /// Put the question and the answer on the request's span
    /// (`input.value`, `output.value`, at most 4 KiB each). Off by default:
    /// traces then carry no user content.
    pub capture_content: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            data_dir: PathBuf::from("./data"),
            database_url: None,
            admin_key: None,
            embed: EmbedConfig::default(),
            chunking: ChunkingConfig::default(),
            rerank: RerankConfig::default(),
            llm: LlmConfig::default(),
            chat: ChatConfig::default(),
            cache: CacheConfig::default(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            snapshots: SnapshotsConfig::default(),
            budgets: BudgetProfile::default(),
            load: LoadConfig::default(),
            telemetry: TelemetryConfig::default(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit_bytes: 32 * 1024 * 1024,
            shutdown_grace_s: 10,
        }
    }
}

impl Default for EmbedConfig {
    fn default() -> Self {
        let c = cache_dir();
        Self {
            model_dir: c.join("models/all-minilm-l6-v2"),
            ort_lib: c.join("onnxruntime/libonnxruntime.so.1.31.1"),
            intra_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
            max_tokens: 256,
            batch_size: 32,
            max_batch_tokens: 1024,
            workers: 1,
            batch_wait_us: 0,
            cache_entries: 100_000,
            cache_ttl_s: 3600,
            max_queued_texts: 50_000,
            passage_int8: true,
        }
    }
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
            startup_timeout_s: 120,
            max_concurrency: 16,
            backends: Vec::new(),
            max_queue: 32,
            hedge: HedgeConfig::default(),
            breaker: BreakerConfig::default(),
            probe_ms: 500,
        }
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormatSetting::Auto,
            otlp_endpoint: None,
            otlp_protocol: "grpc".into(),
            sample_ratio: 1.0,
            sample_buffer_spans: 20_000,
            sample_buffer_mib: 64,
            capture_content: false,
        }
    }
}

impl Config {
    /// Loads defaults → `file` (or `./ragtime.toml` if present) → environment.
    /// An explicitly named file must exist.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) if !path.is_file() => {
                return Err(ConfigError::Load(format!(
                    "{}: no such file",
                    path.display()
                )));
            }
            Some(path) => fig = fig.merge(Toml::file_exact(path)),
            None if Path::new("ragtime.toml").is_file() => {
                fig = fig.merge(Toml::file_exact("ragtime.toml"))
            }
            None => {}
        }
        let fig = fig.merge(Env::prefixed("RAGTIME__").split("__"));
        let mut config: Config = fig.extract().map_err(|e| ConfigError::Load(describe(&e)))?;
        if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            && !endpoint.trim().is_empty()
        {
            config.telemetry.otlp_endpoint = Some(endpoint);
        }
        if let Ok(p) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
            && !p.trim().is_empty()
        {
            config.telemetry.otlp_protocol = p.trim().to_owned();
        }
        config.validate()?;
        // Say the answer mode in force (`ragtime config` shows it).
        config.chat.answer = Some(config.answers().mode);
        Ok(config)
    }

    /// How chat answers are made, `chat.answer` resolved against the LLM
    /// in use.
    pub fn answers(&self) -> AnswerSettings {
        let local = self.llm.base_url.is_none() && self.llm.backends.is_empty();
        self.chat.answer_settings(local)
    }

    /// Checks every value that could only fail later, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.budgets
            .validate()
            .map_err(|e| invalid(&format!("budgets.{}", e.field), e.message))?;
        if let Some(url) = &self.llm.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(invalid(
                "llm.base_url",
                format!("{url:?} is not an http(s) URL"),
            ));
        }
        if let Some(url) = self.database_url.as_ref().map(Secret::expose) {
            let ok = ["sqlite:", "postgres://", "postgresql://"]
                .iter()
                .any(|p| url.starts_with(p));
            if !ok {
                return Err(invalid(
                    "database_url",
                    "must start with postgres://, postgresql:// or sqlite:",
                ));
            }
        }
        if let Some(k) = &self.admin_key
            && k.expose().len() < 16
        {
            return Err(invalid("admin_key", "must be at least 16 characters"));
        }
        let t = &self.telemetry;
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return Err(invalid("telemetry.sample_ratio", "must be between 0 and 1"));
        }
        if !(100..=10_000_000).contains(&t.sample_buffer_spans) {
            return Err(invalid(
                "telemetry.sample_buffer_spans",
                "must be between 100 and 10000000",
            ));
        }
        if !(1..=4096).contains(&t.sample_buffer_mib) {
            return Err(invalid(
                "telemetry.sample_buffer_mib",
                "must be between 1 and 4096",
            ));
        }
        if self.llm.model.trim().is_empty() {
            return Err(invalid("llm.model", "must not be empty"));
        }
        let e = &self.embed;
        if !(1..=64).contains(&e.intra_threads) {
            return Err(invalid("embed.intra_threads", "must be between 1 and 64"));
        }
        if !(8..=512).contains(&e.max_tokens) {
            return Err(invalid("embed.max_tokens", "must be between 8 and 512"));
        }
        if !(1..=1024).contains(&e.batch_size) {
            return Err(invalid("embed.batch_size", "must be between 1 and 1024"));
        }
        if !(16..=1_048_576).contains(&e.max_batch_tokens) {
            return Err(invalid(
                "embed.max_batch_tokens",
                "must be between 16 and 1048576",
            ));
        }
        if !(1..=8).contains(&e.workers) {
            return Err(invalid("embed.workers", "must be between 1 and 8"));
        }
        let c = &self.chunking;
        if c.max_tokens < 16 || c.max_tokens > e.max_tokens {
            return Err(invalid(
                "chunking.max_tokens",
                format!("must be between 16 and embed.max_tokens ({})", e.max_tokens),
            ));
        }
        if c.overlap_tokens * 2 > c.max_tokens {
            return Err(invalid(
                "chunking.overlap_tokens",
                "must be at most half of chunking.max_tokens",
            ));
        }
        let r = &self.rerank;
        if !(0.0..=1.0).contains(&r.weight) {
            return Err(invalid("rerank.weight", "must be between 0 and 1"));
        }
        if !(1..=200).contains(&r.depth) || !(1..=64).contains(&r.batch) {
            return Err(invalid(
                "rerank.depth",
                "rerank.depth must be 1–200 and rerank.batch 1–64",
            ));
        }
        if !(0.0..=2.0).contains(&self.chat.temperature) {
            return Err(invalid("chat.temperature", "must be between 0 and 2"));
        }
        if !(-2.0..=2.0).contains(&self.chat.frequency_penalty) {
            return Err(invalid(
                "chat.frequency_penalty",
                "must be between -2 and 2",
            ));
        }
        if !(1..=32_768).contains(&self.chat.max_tokens) {
            return Err(invalid("chat.max_tokens", "must be between 1 and 32768"));
        }
        self.validate_backends()?;
        self.load
            .levels
            .validate()
            .map_err(|e| invalid("load.levels", e))?;
        if self.llm.ctx_size < 512 {
            return Err(invalid("llm.ctx_size", "must be at least 512"));
        }
        if self.llm.threads == 0 || self.llm.parallel == 0 {
            return Err(invalid(
                "llm.threads",
                "llm.threads and llm.parallel must be at least 1",
            ));
        }
        if !(self.limits.requests_per_s >= 0.0 && self.limits.requests_per_s.is_finite()) {
            return Err(invalid("limits.requests_per_s", "must be 0 (off) or more"));
        }
        for (name, v) in [
            ("limits.max_collections", self.limits.max_collections),
            ("limits.max_documents", self.limits.max_documents),
            ("limits.max_chunks", self.limits.max_chunks),
        ] {
            if v < 1 {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        if !(1..=50).contains(&self.chat.top_k) {
            return Err(invalid("chat.top_k", "must be between 1 and 50"));
        }
        if self.chat.history_messages > 100 {
            return Err(invalid("chat.history_messages", "must be at most 100"));
        }
        let k = &self.cache;
        if !(-1.0..=1.0).contains(&k.min_cosine) {
            return Err(invalid("cache.min_cosine", "must be between -1 and 1"));
        }
        if k.enabled && (k.max_entries == 0 || k.ttl_s == 0) {
            return Err(invalid(
                "cache.max_entries",
                "cache.max_entries and cache.ttl_s must be positive (or set cache.enabled = false)",
            ));
        }
        if self.server.body_limit_bytes < 1024 {
            return Err(invalid("server.body_limit_bytes", "must be at least 1024"));
        }
        Ok(())
    }

    fn validate_backends(&self) -> Result<(), ConfigError> {
        let l = &self.llm;
        let http = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        for (i, b) in l.backends.iter().enumerate() {
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
        if !l.backends.is_empty() && l.base_url.is_some() {
            return Err(invalid(
                "llm.backends",
                "set llm.base_url or llm.backends, not both",
            ));
        }
        if !(1..=4096).contains(&l.max_concurrency) {
            return Err(invalid("llm.max_concurrency", "must be between 1 and 4096"));
        }
        if l.max_queue > 100_000 {
            return Err(invalid("llm.max_queue", "must be at most 100000"));
        }
        let h = &l.hedge;
        if !(0.0..=1.0).contains(&h.share) || h.floor_ms > h.cap_ms {
            return Err(invalid(
                "llm.hedge",
                "share must be between 0 and 1, and floor_ms at most cap_ms",
            ));
        }
        if l.breaker.failures == 0 {
            return Err(invalid("llm.breaker.failures", "must be at least 1"));
        }
        Ok(())
    }

    /// The configuration as JSON, safe to print: secrets are `***`, the
    /// database URL keeps all but its password.
    pub fn redacted(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(url) = &self.database_url {
            v["database_url"] = serde_json::Value::String(ragtime_store::redact(url.expose()));
        }
        v
    }

    /// The database the store opens.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.expose().to_owned(),
            None => ragtime_store::Store::sqlite_url(&self.data_dir),
        }
    }
}

/// Figment's message plus where the bad value came from.
fn describe(e: &figment::Error) -> String {
    e.clone()
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let src = e
                .metadata
                .as_ref()
                .map(|m| m.name.to_string())
                .unwrap_or_default();
            let key = if key.is_empty() {
                String::new()
            } else {
                format!("{key}: ")
            };
            let src = if src.is_empty() {
                String::new()
            } else {
                format!(" (from {src})")
            };
            format!("{key}{}{src}", e.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}
