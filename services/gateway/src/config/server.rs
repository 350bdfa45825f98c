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
    /// Longest an upload's body may take to arrive, in milliseconds: past
    /// it the request gets 408 and holds nothing (an ingest slot is taken
    /// only once the body is in).
    pub body_timeout_ms: u64,
    /// Longest a request's headers may take to arrive, in milliseconds:
    /// past it the connection is closed (a client trickling its headers
    /// holds nothing for long).
    pub header_timeout_ms: u64,
    /// `/readyz` and `/metrics` answer only a request with the admin key
    /// or an api key (off: Kubernetes probes send none).
    pub require_key_for_probes: bool,
    /// How long in-flight requests get to finish on shutdown.
    pub shutdown_grace_s: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit_bytes: 32 * 1024 * 1024,
            body_timeout_ms: 30_000,
            header_timeout_ms: 10_000,
            require_key_for_probes: false,
            shutdown_grace_s: 10,
        }
    }
}

impl ServerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.body_limit_bytes < 1024 {
            return Err(invalid("server.body_limit_bytes", "must be at least 1024"));
        }
        for (key, ms) in [
            ("server.body_timeout_ms", self.body_timeout_ms),
            ("server.header_timeout_ms", self.header_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&ms) {
                return Err(invalid(key, "must be between 1 and 3600000"));
            }
        }
        Ok(())
    }
}
