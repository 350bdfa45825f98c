//! `[cache]`: the semantic response cache.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

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

impl CacheConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(-1.0..=1.0).contains(&self.min_cosine) {
            return Err(invalid("cache.min_cosine", "must be between -1 and 1"));
        }
        if self.enabled && (self.max_entries == 0 || self.ttl_s == 0) {
            return Err(invalid(
                "cache.max_entries",
                "cache.max_entries and cache.ttl_s must be positive (or set cache.enabled = false)",
            ));
        }
        Ok(())
    }
}
