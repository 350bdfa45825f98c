//! `[retrieval]`: where collections are searched.

use super::{ConfigError, invalid};
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
    pub ef_search: usize,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            engine: Engine::Memory,
            ef_search: ragtime_pipeline::corpus::DEFAULT_EF_SEARCH,
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
        Ok(())
    }
}
