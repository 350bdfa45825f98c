//! `[server]`: where the service listens and how it stops.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

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

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit_bytes: 32 * 1024 * 1024,
            shutdown_grace_s: 10,
        }
    }
}

impl ServerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.body_limit_bytes < 1024 {
            return Err(invalid("server.body_limit_bytes", "must be at least 1024"));
        }
        Ok(())
    }
}
