//! Configuration, layered: built-in defaults → `ragtime.toml` →
//! `RAGTIME__SECTION__KEY` environment variables (plus the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`). Validated once at start: each section,
//! in its own file beside its fields and its defaults, checks its own
//! values ([`Config::validate`] keeps what spans sections); an error names
//! the setting.

mod cache;
mod chat;
mod chunking;
mod embed;
mod limits;
mod llm;
mod load;
mod rerank;
mod retrieval;
mod server;
mod snapshots;
mod telemetry;

pub use cache::CacheConfig;
pub use chat::ChatConfig;
pub use chunking::{ChunkingConfig, Lexical};
pub use embed::EmbedConfig;
pub use limits::LimitsConfig;
pub use llm::{BackendConfig, BreakerConfig, HedgeConfig, LlmConfig};
pub use load::LoadConfig;
pub use rerank::RerankConfig;
pub use retrieval::{DatabaseConfig, Engine, RetrievalConfig};
pub use server::ServerConfig;
pub use snapshots::SnapshotsConfig;
pub use telemetry::{LogFormatSetting, TelemetryConfig};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use ragtime_pipeline::AnswerSettings;
use ragtime_pipeline::BudgetProfile;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::fmt;
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
/// Where data lives by default: `$XDG_DATA_HOME`, else `~/.local/share`.
/// Not the working folder: `ragtime ingest` run from anywhere writes to the
/// store `ragtime serve` reads.
pub fn data_home() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    home().join(".local/share")
}

/// `$HOME` (the working folder without one).
fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from)
}

pub fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("RAGTIME_CACHE") {
        return PathBuf::from(c);
    }
    home().join(".cache/ragtime")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    /// Folder for the SQLite database and index files (`RAGTIME__DATA_DIR`;
    /// default `~/.local/share/ragtime`, under `$XDG_DATA_HOME` when set).
    pub data_dir: PathBuf,
    /// `postgres://…` to use PostgreSQL; unset = SQLite in `data_dir`.
    pub database_url: Option<Secret>,
    pub database: DatabaseConfig,
    /// Bearer key for `/admin` (`RAGTIME__ADMIN_KEY`); unset = admin API off.
    pub admin_key: Option<Secret>,
    pub embed: EmbedConfig,
    pub chunking: ChunkingConfig,
    pub retrieval: RetrievalConfig,
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

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            data_dir: data_home().join("ragtime"),
            database_url: None,
            database: DatabaseConfig::default(),
            admin_key: None,
            embed: EmbedConfig::default(),
            chunking: ChunkingConfig::default(),
            retrieval: RetrievalConfig::default(),
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

    /// Checks every value that could only fail later, naming the key:
    /// each section checks its own; what spans sections is checked here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.budgets
            .validate()
            .map_err(|e| invalid(&format!("budgets.{}", e.field), e.message))?;
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
        self.server.validate()?;
        self.telemetry.validate()?;
        self.llm.validate()?;
        self.embed.validate()?;
        self.chunking.validate(self.embed.max_tokens)?;
        self.rerank.validate()?;
        let url = self.database_url();
        self.retrieval
            .validate(url.starts_with("postgres://") || url.starts_with("postgresql://"))?;
        self.database.validate(self.retrieval.engine)?;
        self.chat.validate()?;
        self.load.validate()?;
        self.limits.validate()?;
        self.cache.validate()?;
        Ok(())
    }

    /// The configuration as JSON, safe to print: secrets are `***`, the
    /// database URL keeps all but its password.
    pub fn redacted(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(url) = &self.database_url {
            v["database_url"] = serde_json::Value::String(ragtime_store::redact(url.expose()));
        }
        let standbys: Vec<String> = self
            .database
            .read_urls()
            .iter()
            .map(|u| ragtime_store::redact(u))
            .collect();
        v["database"]["read_urls"] = serde_json::json!(standbys);
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
