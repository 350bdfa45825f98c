//! `[load]`: how requests shrink as the LLM backends fill up.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

/// Adaptive degradation (`[load]`): the levels requests shrink through as
/// the backends fill up.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadConfig {
    pub levels: ragtime_pipeline::backend::load::Levels,
}

impl LoadConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.levels
            .validate()
            .map_err(|e| invalid("load.levels", e))
    }
}
