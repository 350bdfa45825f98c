//! Who a request acts for, and what it may do. An API key (`Authorization:
//! Bearer rk_<id>_<secret>`) names its tenant; without one (any other bearer
//! token counts as none, since OpenAI clients always send something) the
//! request is the `default` tenant's, unless `auth.require_api_key` is set.
//! The admin key opens `/admin` only. Per-tenant rate limits: a token
//! bucket over `/v1` requests (`governor`) and a count of open streams.

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};
use ragtime_core::Tenant;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use subtle::ConstantTimeEq;

pub fn hash_secret(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Equal, in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The tenant a `/v1` request acts for; extracting it authenticates the
/// key and takes a token from the tenant's bucket.
pub struct Caller(pub Tenant);

fn is_admin_key(state: &AppState, sent: &str) -> bool {
    state
        .config
        .admin_key
        .as_ref()
        .is_some_and(|a| same(sent, a.expose()))
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let required = state.config.auth.require_api_key;
        // OpenAI clients always send some key: without `require_api_key`, a
        // token that is not a ragtime key (`rk_…`) is no key at all.
        let sent = bearer(&parts.headers)
            .filter(|k| required || k.starts_with("rk_") || is_admin_key(state, k));
        let tenant = match sent {
            None if required => {
                return Err(ApiError::new(
                    ErrorCode::Unauthorized,
                    "an api key is required: send Authorization: Bearer <key>",
                ));
            }
            None => Tenant::default_tenant(),
            Some(k) if is_admin_key(state, k) => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "the admin key is for /admin only; use an api key",
                ));
            }
            Some(k) => api_key_tenant(state, k).await?,
        };
        state.limits.admit(tenant.name())?;
        tracing::Span::current().record("tenant", tenant.name());
        Ok(Caller(tenant))
    }
}

async fn api_key_tenant(state: &AppState, sent: &str) -> Result<Tenant, ApiError> {
    let unknown = || ApiError::new(ErrorCode::Unauthorized, "unknown or revoked api key");
    let (id, secret) = sent
        .strip_prefix("rk_")
        .and_then(|rest| rest.split_once('_'))
        .ok_or_else(unknown)?;
    let rec = match state.keys.get(id) {
        Some(known) => known,
        None => {
            let found = state.store.api_key(id).await.map_err(ApiError::internal)?;
            state.keys.insert(id.to_owned(), found.clone());
            found
        }
    }
    .ok_or_else(unknown)?;
    if rec.revoked_ms.is_some() || !same(&hash_secret(secret), &rec.secret_hash) {
        return Err(unknown());
    }
    Ok(Tenant(rec.tenant))
}

/// A `/readyz` or `/metrics` request. With `server.require_key_for_probes`
/// it needs the admin key or a valid api key (401 otherwise); `admin` says
/// whether it sent the admin key (only the admin reads where the backends
/// are).
pub struct Probe {
    pub admin: bool,
}

impl FromRequestParts<Arc<AppState>> for Probe {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let sent = bearer(&parts.headers);
        let admin = sent.is_some_and(|k| is_admin_key(state, k));
        if admin || !state.config.server.require_key_for_probes {
            return Ok(Probe { admin });
        }
        match sent {
            Some(k) => api_key_tenant(state, k).await.map(|_| Probe { admin }),
            None => Err(ApiError::new(
                ErrorCode::Unauthorized,
                "server.require_key_for_probes: send Authorization: Bearer <key>",
            )),
        }
    }
}

/// An `/admin` request: extracting it checks the admin key, so a handler
/// that takes one runs for the admin only.
pub struct Admin;

impl FromRequestParts<Arc<AppState>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let Some(key) = &state.config.admin_key else {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                "the admin api is off: set RAGTIME__ADMIN_KEY to turn it on",
            ));
        };
        let sent = bearer(&parts.headers).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "send the admin key as Authorization: Bearer <key>",
            )
        })?;
        if same(sent, key.expose()) {
            Ok(Admin)
        } else if sent.starts_with("rk_") {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                "an api key cannot use the admin api",
            ))
        } else {
            Err(ApiError::new(ErrorCode::Forbidden, "wrong admin key"))
        }
    }
}

type Buckets<C> =
    RateLimiter<String, HashMapStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Per-tenant token buckets and open-stream counts.
pub struct Limits<C: Clock + Clone = DefaultClock> {
    rate: f64,
    buckets: Option<(Buckets<C>, C)>,
    streams: u32,
    open: Mutex<HashMap<String, Arc<AtomicU32>>>,
}

impl Limits {
    /// `rate` requests per second (0: off) with bursts of `burst` (0: the
    /// rate, rounded up); `streams` open at once (0: no limit).
    pub fn new(rate: f64, burst: u32, streams: u32) -> Self {
        Self::with_clock(rate, burst, streams, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Limits<C> {
    pub fn with_clock(rate: f64, burst: u32, streams: u32, clock: C) -> Self {
        let burst = NonZeroU32::new(burst)
            .or_else(|| NonZeroU32::new(rate.ceil().max(1.0) as u32))
            .unwrap_or(NonZeroU32::MIN);
        let quota = (rate > 0.0)
            .then(|| Quota::with_period(Duration::from_secs_f64(1.0 / rate)))
            .flatten()
            .map(|q| q.allow_burst(burst));
        Self {
            rate,
            buckets: quota.map(|q| (RateLimiter::hashmap_with_clock(q, clock.clone()), clock)),
            streams,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for one request, or refuses with 429.
    pub fn admit(&self, tenant: &str) -> Result<(), ApiError> {
        let Some((buckets, clock)) = &self.buckets else {
            return Ok(());
        };
        buckets.check_key(&tenant.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(clock.now()).as_secs_f64();
            ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "tenant {tenant:?} is over its {} requests per second",
                    self.rate
                ),
            )
            .retry_after(wait.ceil().max(1.0) as u64)
        })
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
    use governor::clock::FakeRelativeClock;

    #[test]
    fn buckets_refill_at_the_rate_and_streams_are_counted() {
        let clock = FakeRelativeClock::default();
        let l = Limits::with_clock(10.0, 2, 1, clock.clone());
        assert!(l.admit("a").is_ok() && l.admit("a").is_ok());
        let refused = l.admit("a").err();
        assert_eq!(
            refused.map(|e| (e.code, e.retry_after)),
            Some((ErrorCode::RateLimited, Some(1))),
            "burst of 2 spent"
        );
        assert!(l.admit("b").is_ok(), "another tenant has its own bucket");
        clock.advance(Duration::from_millis(99));
        assert!(l.admit("a").is_err(), "not a whole token yet");
        clock.advance(Duration::from_millis(2));
        assert!(l.admit("a").is_ok(), "refilled at 10 per second");
        let s = l.open_stream("a");
        assert!(s.is_ok());
        assert!(l.open_stream("a").is_err());
        drop(s);
        assert!(l.open_stream("a").is_ok());
        assert!(Limits::new(0.0, 0, 0).admit("x").is_ok(), "0 = off");
    }

    #[test]
    fn keys_compare_in_full() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd") && !same("abc", "ab") && !same("", "a"));
    }
}
