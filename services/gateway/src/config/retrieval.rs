//! `[retrieval]`: where collections are searched; `[database]`: the
//! standbys the `postgres` engine's searches may read.

use super::{ConfigError, Secret, invalid};
use serde::{Deserialize, Serialize};

/// Which retrieval engine searches the collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Each replica holds the collections' HNSW and BM25 indexes in its
    /// memory (loaded from snapshots or the store).
    Memory,
    /// Searches run inside PostgreSQL with pgvector: replicas hold no
    /// index (needs `database_url = "postgres://…"`).
    Postgres,
}

/// Where collections are searched (`[retrieval]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrievalConfig {
    /// `memory` (default) or `postgres` (`RAGTIME__RETRIEVAL__ENGINE`).
    pub engine: Engine,
    /// `postgres` engine: HNSW candidates a dense search keeps at least
    /// (`hnsw.ef_search`; more finds more of the true nearest, slower).
    /// Past 100,000 chunks in the database the list grows with their
    /// count, to at most 1000.
    pub ef_search: usize,
    /// `postgres` engine with `pg_textsearch`: the BM25 index is built
    /// again (beside the old one, searches going on) once this part of the
    /// documents was written since its last build — the segments a stream
    /// of writes leaves rank worse than a build (`docs/scaling.md`); 0
    /// never rebuilds it.
    pub bm25_rebuild_after: f64,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            engine: Engine::Memory,
            ef_search: ragtime_pipeline::corpus::DEFAULT_EF_SEARCH,
            bm25_rebuild_after: 0.1,
        }
    }
}

impl RetrievalConfig {
    /// `postgres_store`: whether `database_url` names PostgreSQL.
    pub(super) fn validate(&self, postgres_store: bool) -> Result<(), ConfigError> {
        if self.engine == Engine::Postgres && !postgres_store {
            return Err(invalid(
                "retrieval.engine",
                "\"postgres\" searches inside PostgreSQL: set database_url = \"postgres://…\" (the store is SQLite)",
            ));
        }
        if !(1..=1000).contains(&self.ef_search) {
            return Err(invalid("retrieval.ef_search", "must be between 1 and 1000"));
        }
        if !(0.0..=1.0).contains(&self.bm25_rebuild_after) {
            return Err(invalid(
                "retrieval.bm25_rebuild_after",
                "must be between 0 (never) and 1 (a part of the documents)",
            ));
        }
        Ok(())
    }
}

/// Hot standbys of the PostgreSQL primary, and the database engine's
/// search connections (`[database]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `postgres://…` URLs of streaming standbys: the `postgres` engine's
    /// searches and the API's document reads go to them while they keep
    /// up (writes stay on the primary at `database_url`).
    pub read_urls: Vec<Secret>,
    /// A standby further behind the primary than this is passed over for
    /// the primary until it catches up.
    pub max_read_lag_ms: u64,
    /// Connections the `postgres` engine's searches hold at once, beside
    /// the 16 that writes, the change-log listener and key lookups share:
    /// while all are taken a search is refused at once (503 `overloaded`)
    /// instead of queueing. 1 to 1,000.
    pub search_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            read_urls: Vec::new(),
            max_read_lag_ms: 1000,
            search_connections: ragtime_store::Options::default().search_connections,
        }
    }
}

impl DatabaseConfig {
    /// The URLs as given, for the store.
    pub fn read_urls(&self) -> Vec<String> {
        self.read_urls
            .iter()
            .map(|u| u.expose().to_owned())
            .collect()
    }

    pub(super) fn validate(&self, engine: Engine) -> Result<(), ConfigError> {
        if !(1..=1000).contains(&self.search_connections) {
            return Err(invalid(
                "database.search_connections",
                "must be between 1 and 1000",
            ));
        }
        if self.read_urls.is_empty() {
            return Ok(());
        }
        if engine != Engine::Postgres {
            return Err(invalid(
                "database.read_urls",
                "standbys serve the searches of retrieval.engine = \"postgres\"; set it, or leave read_urls empty",
            ));
        }
        for (i, url) in self.read_urls.iter().enumerate() {
            let u = url.expose();
            if !(u.starts_with("postgres://") || u.starts_with("postgresql://")) {
                return Err(invalid(
                    &format!("database.read_urls[{i}]"),
                    "must start with postgres:// or postgresql://",
                ));
            }
        }
        if self.max_read_lag_ms == 0 {
            return Err(invalid("database.max_read_lag_ms", "must be positive"));
        }
        Ok(())
    }
}
