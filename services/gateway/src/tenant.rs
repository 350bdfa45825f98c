//! Who a `/v1` request acts for. An API key (`Authorization: Bearer
//! rk_<id>_<secret>`) names its tenant; without one (any other bearer token
//! counts as none, since OpenAI clients always send something) the request
//! is the `default` tenant's, unless `auth.require_api_key` is set. Every tenant
//! has its own namespace of collections and conversations (the default
//! tenant's names are stored as they are, others' behind a prefix that no
//! user-chosen name can contain), and its own rate limits.

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub const DEFAULT_TENANT: &str = "default";

/// The tenant a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

impl Tenant {
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The stored name of the tenant's collection `name` (already checked
    /// to hold only letters, digits, `_`, `-` and `.`).
    pub fn collection(&self, name: &str) -> String {
        if self.0 == DEFAULT_TENANT {
            name.to_owned()
        } else {
            format!("{}~{name}", self.0)
        }
    }

    /// The stored id of the tenant's conversation `id`.
    pub fn conversation(&self, id: &str) -> String {
        if self.0 == DEFAULT_TENANT {
            id.to_owned()
        } else {
            format!("{}/{id}", self.0)
        }
    }
}

/// Tenant names: 1–32 of lowercase letters, digits, `_` and `-`.
pub fn valid_tenant(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

pub fn hash_secret(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Equal in time independent of where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

impl FromRequestParts<Arc<AppState>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let required = state.config.auth.require_api_key;
        // OpenAI clients always send some key: without `require_api_key`, a
        // token that is not a ragtime key (`rk_…`) is no key at all.
        let sent = bearer(&parts.headers).filter(|k| {
            required
                || k.starts_with("rk_")
                || state
                    .config
                    .admin_key
                    .as_ref()
                    .is_some_and(|a| same(k.as_bytes(), a.0.as_bytes()))
        });
        let tenant = match sent {
            None if required => {
                return Err(ApiError::new(
                    ErrorCode::Unauthorized,
                    "an api key is required: send Authorization: Bearer <key>",
                ));
            }
            None => Tenant(DEFAULT_TENANT.to_owned()),
            Some(sent) => {
                if let Some(admin) = &state.config.admin_key
                    && same(sent.as_bytes(), admin.0.as_bytes())
                {
                    return Err(ApiError::new(
                        ErrorCode::Forbidden,
                        "the admin key is for /admin only; use an api key",
                    ));
                }
                let unknown =
                    || ApiError::new(ErrorCode::Unauthorized, "unknown or revoked api key");
                let (id, secret) = sent
                    .strip_prefix("rk_")
                    .and_then(|rest| rest.split_once('_'))
                    .ok_or_else(unknown)?;
                let rec = state
                    .store
                    .api_key(id)
                    .await
                    .map_err(ApiError::internal)?
                    .ok_or_else(unknown)?;
                if rec.revoked_ms.is_some()
                    || !same(hash_secret(secret).as_bytes(), rec.secret_hash.as_bytes())
                {
                    return Err(unknown());
                }
                Tenant(rec.tenant)
            }
        };
        state.limits.admit(&tenant.0)?;
        tracing::Span::current().record("tenant", tenant.name());
        Ok(tenant)
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-tenant token buckets and open-stream counts.
pub struct Limits {
    rate: f64,
    burst: f64,
    streams: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
    open: Mutex<HashMap<String, Arc<AtomicU32>>>,
}

impl Limits {
    pub fn new(rate: f64, burst: u32, streams: u32) -> Self {
        let burst = if burst == 0 {
            rate.ceil().max(1.0)
        } else {
            f64::from(burst)
        };
        Self {
            rate,
            burst,
            streams,
            buckets: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for one request, or refuses with 429.
    pub fn admit(&self, tenant: &str) -> Result<(), ApiError> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut b = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = b.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * self.rate)
            .min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - bucket.tokens) / self.rate).ceil().max(1.0) as u64;
            Err(ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "tenant {tenant:?} is over its {} requests per second",
                    self.rate
                ),
            )
            .retry_after(wait))
        }
    }

    /// Holds one of the tenant's chat streams open until dropped, or
    /// refuses with 429.
    pub fn open_stream(&self, tenant: &str) -> Result<StreamSlot, ApiError> {
        let counter = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tenant.to_owned())
            .or_default()
            .clone();
        let now = counter.fetch_add(1, Ordering::AcqRel) + 1;
        if self.streams > 0 && now > self.streams {
            counter.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "tenant {tenant:?} already has {} streams open",
                    self.streams
                ),
            )
            .retry_after(1));
        }
        Ok(StreamSlot(counter))
    }
}

pub struct StreamSlot(Arc<AtomicU32>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_cannot_be_reached_by_another_tenant() {
        let acme = Tenant("acme".into());
        let default = Tenant(DEFAULT_TENANT.into());
        assert_eq!(acme.collection("docs"), "acme~docs");
        assert_eq!(default.collection("docs"), "docs");
        // User-chosen collection names never hold '~', conversation ids never '/'.
        assert!(crate::routes::documents::check_collection("acme~docs", "c").is_err());
        assert_eq!(acme.conversation("c1"), "acme/c1");
        assert!(
            valid_tenant("acme-2")
                && !valid_tenant("Acme")
                && !valid_tenant("a/b")
                && !valid_tenant("")
        );
    }

    #[test]
    fn buckets_refill_at_the_rate_and_streams_are_counted() {
        let l = Limits::new(1000.0, 2, 1);
        assert!(l.admit("a").is_ok() && l.admit("a").is_ok());
        assert!(l.admit("a").is_err(), "burst of 2 spent");
        assert!(l.admit("b").is_ok(), "another tenant has its own bucket");
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(l.admit("a").is_ok(), "refilled");
        let s = l.open_stream("a");
        assert!(s.is_ok());
        assert!(l.open_stream("a").is_err());
        drop(s);
        assert!(l.open_stream("a").is_ok());
        assert!(Limits::new(0.0, 0, 0).admit("x").is_ok(), "0 = off");
    }
}
