//! Hot standbys for reads (`database.read_urls`): the database engine's
//! searches and the API's document reads go to a streaming standby of the
//! primary, so read throughput grows with standbys while writes and the
//! change log stay on the primary.
//!
//! A standby is used only while it is close enough and has what this
//! process wrote:
//!
//! - [`Store::probe_standbys`] (every follower pass, twice a second) reads
//!   the primary's WAL position and each standby's replay position. A
//!   standby's lag is how long ago the primary was at the position the
//!   standby has replayed (0 once it has replayed all the primary had);
//!   one further behind than `max_lag`, or that did not answer, is
//!   skipped for the primary until a probe finds it well again.
//! - Read your writes: after each write this process commits, the store
//!   notes the primary's WAL position; a search reads a standby only once
//!   its replay position (as last probed) has passed it, and the primary
//!   before that. A document read is a read like a search: a client that
//!   has just written reads what it wrote.
//! - A read that fails on a standby for any reason but its own deadline
//!   is run again on the primary (no error reaches the user), and the
//!   standby is skipped until the next probe finds it answering.

use crate::{Pool, Store, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One standby as the store sees it.
#[derive(Debug)]
pub(crate) struct Standby {
    pool: PgPool,
    /// Its URL without the password, for metrics and logs.
    name: String,
    state: Mutex<State>,
    /// Searches sent to it.
    searches: AtomicU64,
    /// Document reads sent to it.
    document_reads: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// The last probe reached it.
    up: bool,
    /// Replay position at the last probe.
    replayed: u64,
    lag: Duration,
}

/// What `/metrics` and `/readyz` say of a standby.
#[derive(Debug, Clone, PartialEq)]
pub struct StandbyStatus {
    pub name: String,
    /// Searches may go to it now.
    pub usable: bool,
    pub up: bool,
    pub lag_ms: u64,
    /// Searches sent to it since start.
    pub searches: u64,
    /// Document reads (a document, a page of a collection's documents)
    /// sent to it since start.
    pub document_reads: u64,
}

/// What a read sent to a standby is, for its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    Search,
    Document,
}

/// The standbys of a store, and what it needs to choose one.
#[derive(Debug)]
pub(crate) struct Standbys {
    list: Vec<Standby>,
    max_lag: Duration,
    /// The primary's WAL position after this process's last write.
    written: AtomicU64,
    /// Writes whose WAL position could not be read after their commit
    /// (the primary answered the commit, then not the look): while any is
    /// unknown no standby serves, until a probe reads the primary's
    /// position, which is past them.
    written_unknown: AtomicU64,
    /// The primary's recent WAL positions, oldest first (to date a
    /// standby's replay position).
    history: Mutex<VecDeque<(Instant, u64)>>,
}

/// How long a search waits for a standby's connection before it reads
/// the primary instead.
const STANDBY_ACQUIRE: Duration = Duration::from_millis(100);

/// A pg_lsn as a number of bytes.
const LSN: &str = "(%s - '0/0'::pg_lsn)::bigint";

fn lsn(expr: &str) -> String {
    LSN.replace("%s", expr)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Standbys {
    /// Whether standby `s` may serve a search now: it answered the last
    /// probe, is within the lag and has this process's last write.
    fn usable(&self, s: &Standby) -> bool {
        let st = *lock(&s.state);
        st.up
            && st.lag <= self.max_lag
            && self.written_unknown.load(Ordering::Acquire) == 0
            && st.replayed >= self.written.load(Ordering::Acquire)
    }
}

impl Store {
    /// Reads searches from these standbys of the primary (`postgres://`
    /// URLs) while they are within `max_lag` of it. Connections are made
    /// at first use: a standby down at start is skipped until it answers.
    pub fn with_standbys(mut self, urls: &[String], max_lag: Duration) -> Result<Self, StoreError> {
        if urls.is_empty() {
            return Ok(self);
        }
        if !matches!(self.pool, Pool::Postgres(_)) {
            return Err(StoreError::Url("standbys need the PostgreSQL store".into()));
        }
        let mut list = Vec::with_capacity(urls.len());
        for url in urls {
            let opts =
                PgConnectOptions::from_str(url).map_err(|e| StoreError::Url(e.to_string()))?;
            // A standby that went away must cost a search little of its
            // budget before it falls over to the primary: the pool would
            // otherwise keep trying to connect for its whole wait.
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(STANDBY_ACQUIRE)
                .connect_lazy_with(opts);
            list.push(Standby {
                pool,
                name: crate::redact(url),
                state: Mutex::default(),
                searches: AtomicU64::new(0),
                document_reads: AtomicU64::new(0),
            });
        }
        self.standbys = Some(Arc::new(Standbys {
            list,
            max_lag,
            written: AtomicU64::new(0),
            written_unknown: AtomicU64::new(0),
            history: Mutex::default(),
        }));
        Ok(self)
    }

    /// Measures each standby's lag (see the module docs).
    pub async fn probe_standbys(&self) -> Result<(), StoreError> {
        let (Some(sb), Pool::Postgres(primary)) = (&self.standbys, &self.pool) else {
            return Ok(());
        };
        let unknown = sb.written_unknown.load(Ordering::Acquire);
        let now: i64 = sqlx::query_scalar(&format!("SELECT {}", lsn("pg_current_wal_lsn()")))
            .fetch_one(primary)
            .await?;
        let now = u64::try_from(now).unwrap_or(0);
        if unknown > 0 {
            // Those writes committed before this look: `now` is past them
            // (one that failed since stays unknown until the next probe).
            sb.written.fetch_max(now, Ordering::AcqRel);
            let _ = sb.written_unknown.compare_exchange(
                unknown,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        let at = Instant::now();
        {
            let mut h = lock(&sb.history);
            if h.back().is_none_or(|(_, l)| *l != now) {
                h.push_back((at, now));
            }
            // An hour is past any lag a standby is still used at.
            while h
                .front()
                .is_some_and(|(t, _)| at.duration_since(*t) > Duration::from_secs(3600))
            {
                h.pop_front();
            }
        }
        for s in &sb.list {
            let replayed: Result<Option<i64>, _> = tokio::time::timeout(
                Duration::from_secs(2),
                sqlx::query_scalar(&format!("SELECT {}", lsn("pg_last_wal_replay_lsn()")))
                    .fetch_one(&s.pool),
            )
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut));
            let mut st = lock(&s.state);
            match replayed {
                Ok(Some(r)) => {
                    let r = u64::try_from(r).unwrap_or(0);
                    // Lag: since the primary first stood past the replayed
                    // position (0 if it never has).
                    let h = lock(&sb.history);
                    let lag = h
                        .iter()
                        .find(|(_, l)| *l > r)
                        .map_or(Duration::ZERO, |(t, _)| at.duration_since(*t));
                    *st = State {
                        up: true,
                        replayed: r,
                        lag,
                    };
                }
                // Not in recovery (a promoted or wrongly named server) or
                // not answering: not a standby to read.
                Ok(None) | Err(_) => st.up = false,
            }
        }
        Ok(())
    }

    /// Notes the primary's WAL position after a write of this process:
    /// no standby serves its searches until it has replayed that far.
    pub(crate) async fn note_write(&self) {
        let (Some(sb), Pool::Postgres(primary)) = (&self.standbys, &self.pool) else {
            return;
        };
        // After a commit: a failed look cannot fail the write, only keep
        // the standbys from serving until a probe knows where it is.
        let at: Result<i64, _> =
            sqlx::query_scalar(&format!("SELECT {}", lsn("pg_current_wal_lsn()")))
                .fetch_one(primary)
                .await;
        match at {
            Ok(at) => {
                sb.written
                    .fetch_max(u64::try_from(at).unwrap_or(0), Ordering::AcqRel);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the primary's position after a write was not read; standbys wait for the next probe");
                sb.written_unknown.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// The standby a read may go to now, if any.
    fn read_pool(&self) -> Option<(&PgPool, &Standby)> {
        let sb = self.standbys.as_ref()?;
        let s = sb.list.iter().find(|s| sb.usable(s))?;
        Some((&s.pool, s))
    }

    /// Runs `read` on a standby that may serve it, else (or when it fails
    /// there for any reason but its deadline) on `primary`.
    pub(crate) async fn on_standby<'p, T, Fut>(
        &'p self,
        what: Read,
        primary: &'p PgPool,
        read: impl Fn(&'p PgPool) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        if let Some((standby, s)) = self.read_pool() {
            let counter = match what {
                Read::Search => &s.searches,
                Read::Document => &s.document_reads,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            match read(standby).await {
                Err(e) if !e.is_query_cancelled() => {
                    tracing::warn!(standby = %s.name, error = %e, "a read failed on a standby; reading the primary");
                    lock(&s.state).up = false;
                }
                done => return done,
            }
        }
        read(primary).await
    }

    /// Each standby's state, in the order configured.
    pub fn standbys(&self) -> Vec<StandbyStatus> {
        let Some(sb) = &self.standbys else {
            return Vec::new();
        };
        sb.list
            .iter()
            .map(|s| {
                let st = *lock(&s.state);
                StandbyStatus {
                    name: s.name.clone(),
                    usable: sb.usable(s),
                    up: st.up,
                    lag_ms: u64::try_from(st.lag.as_millis()).unwrap_or(u64::MAX),
                    searches: s.searches.load(Ordering::Relaxed),
                    document_reads: s.document_reads.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}
