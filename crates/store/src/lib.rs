//! The durable store. SQLite (WAL, `synchronous=FULL`) is the embedded
//! default; PostgreSQL is used when the database URL says `postgres://`.
//! Migrations for both live in the workspace's `migrations/` folder and are
//! embedded in the binary.
//!
//! Reads that follow a write carry `fail` points (`store::corpus_version`,
//! `store::get_document`): a test built with the `fail` crate's
//! `failpoints` feature makes them fail as a database gone away right
//! after a commit would; in any other build they are nothing.

/// Runs one SQL text on whichever pool the store holds (`$N` placeholders
/// work in SQLite and PostgreSQL alike).
macro_rules! on_pool {
    ($self:expr, $p:ident => $body:expr) => {
        match &$self.pool {
            Pool::Sqlite($p) => $body,
            Pool::Postgres($p) => $body,
        }
    };
}

/// As `on_pool!`, for a read a hot standby may serve: `$body` (a
/// `Result`, `?` allowed) runs on a standby that may serve it
/// ([`Store::on_standby`]: up, close enough, past this process's writes),
/// and again on the primary when it fails there.
macro_rules! on_read_pool {
    ($self:expr, $what:expr, $p:ident => $body:expr) => {
        match &$self.pool {
            Pool::Sqlite($p) => async { $body }.await,
            Pool::Postgres(primary) => {
                $self
                    .on_standby($what, primary, |$p| async move { $body })
                    .await
            }
        }
    };
}

/// Locks collection `$id`'s row in the write transaction `$tx` and
/// evaluates to whether the collection exists. Every write into a
/// collection takes it first: writes into one collection take turns (and so
/// never deadlock), and a removal waits for a write in flight, or the
/// write sees the collection gone.
macro_rules! lock_collection_row {
    ($tx:expr, $id:expr) => {
        sqlx::query("UPDATE collections SET documents = documents WHERE id = $1")
            .bind($id)
            .execute(&mut *$tx)
            .await?
            .rows_affected()
            > 0
    };
}

/// A transaction that will write. On SQLite it takes the write lock at
/// `BEGIN` (`IMMEDIATE`): a deferred transaction that reads first and then
/// writes cannot wait for a concurrent writer (the busy timeout does not
/// apply to the upgrade) and fails at once with "database is locked".
trait BeginWrite {
    type Db: sqlx::Database;
    fn begin_write(
        &self,
    ) -> impl std::future::Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>>
    + Send;
}

impl BeginWrite for SqlitePool {
    type Db = sqlx::Sqlite;
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.begin_with("BEGIN IMMEDIATE").await
    }
}

impl BeginWrite for PgPool {
    type Db = sqlx::Postgres;
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        self.begin().await
    }
}

/// Locks a write transaction holds until it ends, for what only holds if
/// writers take turns. SQLite needs none: `BEGIN IMMEDIATE` already lets
/// one writer in at a time. On PostgreSQL they are transaction-scoped
/// advisory locks (released at commit or rollback, after the commit is
/// visible), so they hold across every replica on the database.
///
/// - [`WriteLocks::lock_owner`]: one owner's writes take turns, so a quota
///   checked inside the transaction still holds when it commits (two
///   replicas one below `max_collections` cannot both create). Taken first.
/// - [`WriteLocks::lock_log`]: change-log entries are numbered and become
///   visible in one order. PostgreSQL hands out a sequence value when a row
///   is written but shows the row at commit, so without it an entry with a
///   lower id can appear after a follower has read past it, and is never
///   applied. Taken last, right before the entries are written, so it is
///   held only for the end of the transaction and its commit.
trait WriteLocks {
    fn lock_owner(
        &mut self,
        owner: &str,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send;
    fn lock_log(&mut self) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send;
}

/// The advisory-lock namespaces (the first key of the two-key form).
const LOCK_OWNER: i32 = 0x5254_0001;
const LOCK_LOG: i32 = 0x5254_0002;

impl WriteLocks for sqlx::Transaction<'static, sqlx::Sqlite> {
    async fn lock_owner(&mut self, _owner: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }
    async fn lock_log(&mut self) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

impl WriteLocks for sqlx::Transaction<'static, sqlx::Postgres> {
    async fn lock_owner(&mut self, owner: &str) -> Result<(), sqlx::Error> {
        // Owners whose names hash alike share a lock: they take turns too.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_OWNER)
            .bind(owner)
            .execute(&mut **self)
            .await
            .map(drop)
    }
    async fn lock_log(&mut self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(LOCK_LOG)
            .execute(&mut **self)
            .await
            .map(drop)
    }
}

mod api_keys;
mod bm25_upkeep;
mod budgets;
mod collections;
mod conversations;
mod documents;
pub mod filter_sql;
mod jobs;
pub mod search;
mod standbys;

pub use api_keys::ApiKeyRecord;
pub use bm25_upkeep::{BM25_REBUILD_LOCK, Bm25Upkeep};
pub use budgets::BudgetVersion;
pub use collections::{CollectionRecord, Created, Dropped, Limits, TenantQuota, Usage};
pub use conversations::Turn;
pub use documents::{
    ChunkRecord, DocumentRecord, DocumentSummary, IndexChunk, LogEntry, NewChunk, NewDocument,
    Upsert, WriteReceipt, decode_vector, encode_vector,
};
pub use jobs::{JOB_HEARTBEAT_MS, JOB_STALE_MS, JobRecord, JobStatus, JobStep, NewJob};
pub use search::{FilteredPaths, FoundChunk, FoundDocument, Lexical, Missing, SearchLimits};
pub use standbys::StandbyStatus;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("database url: {0}")]
    Url(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A write that would pass a quota; nothing was written.
    #[error("over the {limit} quota of {value}")]
    QuotaExceeded { limit: &'static str, value: i64 },
    /// The collection written to was removed (by this or another
    /// process) after the write looked it up; nothing was written.
    #[error("collection {0} no longer exists")]
    CollectionGone(i64),
    /// The database cannot serve what was asked of it (searching inside
    /// it): what it lacks.
    #[error("{0}")]
    Unsupported(search::Missing),
    /// Every connection the database engine's searches have is taken
    /// ([`Options::search_connections`]): try again shortly.
    #[error(
        "every one of the database's search connections is in use (database.search_connections)"
    )]
    SearchesBusy,
}

impl StoreError {
    /// Whether the database stopped the query (its `statement_timeout`
    /// passed, or it was cancelled): SQLSTATE 57014.
    pub fn is_query_cancelled(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("57014"))
    }
}

/// Which database the store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Wakes when a change-log entry commits ([`Store::change_listener`]).
pub struct ChangeListener(sqlx::postgres::PgListener);

impl ChangeListener {
    /// Waits for the next notification. After a lost connection it
    /// reconnects and listens again on the next call (notifications sent
    /// in between are lost: the caller polls as well).
    pub async fn next(&mut self) -> Result<(), StoreError> {
        self.0.recv().await?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A connection pool with the schema migrated to the latest version.
#[derive(Debug, Clone)]
pub struct Store {
    pool: Pool,
    /// The vectors' dimension once the database engine's schema is
    /// enabled ([`Store::enable_database_search`]): chunk writes then
    /// write its columns too. Shared by every clone.
    search_schema: std::sync::Arc<std::sync::OnceLock<search::Schema>>,
    /// Hot standbys searches may read ([`Store::with_standbys`]).
    standbys: Option<std::sync::Arc<standbys::Standbys>>,
    /// How the database engine answered filtered dense searches
    /// ([`Store::filtered_paths`]). Shared by every clone.
    paths: std::sync::Arc<search::PathCounts>,
    /// The database engine's searches' own connections (PostgreSQL; made
    /// as they are first needed): a flood of slow searches waits for
    /// these, never for those writes, the change-log listener and key
    /// lookups take.
    searches: Option<PgPool>,
}

/// How a store is opened beyond its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Connections the database engine's searches hold at once, beside
    /// the store's own 16 (PostgreSQL only; at least 1).
    pub search_connections: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            search_connections: 8,
        }
    }
}

/// How long a search waits for one of them before it gives up as busy.
const SEARCH_ACQUIRE: Duration = Duration::from_secs(1);

impl Store {
    /// Opens the database at `url` (`sqlite://PATH` or `postgres://…`),
    /// creating a SQLite file if needed, and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, Options::default()).await
    }

    /// [`Store::open`] with `options`.
    pub async fn open_with(url: &str, options: Options) -> Result<Self, StoreError> {
        let search_schema = std::sync::Arc::new(std::sync::OnceLock::new());
        let mut searches = None;
        let pool = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let opts =
                PgConnectOptions::from_str(url).map_err(|e| StoreError::Url(e.to_string()))?;
            searches = Some(
                PgPoolOptions::new()
                    .max_connections(options.search_connections.max(1))
                    .min_connections(0)
                    .acquire_timeout(SEARCH_ACQUIRE)
                    .connect_lazy_with(opts.clone()),
            );
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(5))
                .connect_with(opts)
                .await?;
            sqlx::migrate!("../../migrations/postgres")
                .run(&pool)
                .await?;
            if let Some(schema) = search::enabled_schema(&pool).await? {
                let _ = search_schema.set(schema);
            }
            Pool::Postgres(pool)
        } else if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::Url(e.to_string()))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // FULL: a commit is on disk before it is acknowledged.
                .synchronous(SqliteSynchronous::Full)
                .foreign_keys(true)
                // Writers to different collections of one process meet
                // here (each collection has its own lock): a long write,
                // such as removing a large collection, is waited for.
                .busy_timeout(Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(opts)
                .await?;
            sqlx::migrate!("../../migrations/sqlite").run(&pool).await?;
            Pool::Sqlite(pool)
        } else {
            return Err(StoreError::Url(format!(
                "unsupported scheme in {:?}: use sqlite://PATH or postgres://…",
                redact(url)
            )));
        };
        Ok(Self {
            pool,
            search_schema,
            standbys: None,
            paths: std::sync::Arc::default(),
            searches,
        })
    }

    /// A listener woken as another process (or this one) commits a
    /// change-log entry: PostgreSQL's `LISTEN ragtime_ingest`; `None` on
    /// SQLite, which has no notifications (its followers poll).
    pub async fn change_listener(&self) -> Result<Option<ChangeListener>, StoreError> {
        match &self.pool {
            Pool::Sqlite(_) => Ok(None),
            Pool::Postgres(p) => {
                let mut l = sqlx::postgres::PgListener::connect_with(p).await?;
                l.listen("ragtime_ingest").await?;
                Ok(Some(ChangeListener(l)))
            }
        }
    }

    /// The SQLite URL for `ragtime.db` in `data_dir`.
    pub fn sqlite_url(data_dir: &Path) -> String {
        format!("sqlite://{}", data_dir.join("ragtime.db").display())
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// A round trip to the database (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.pool {
            Pool::Sqlite(p) => sqlx::query("SELECT 1").execute(p).await.map(drop)?,
            Pool::Postgres(p) => sqlx::query("SELECT 1").execute(p).await.map(drop)?,
        }
        Ok(())
    }

    /// Names of all collections, sorted.
    pub async fn collections(&self) -> Result<Vec<String>, StoreError> {
        let q = "SELECT name FROM collections ORDER BY name";
        Ok(match &self.pool {
            Pool::Sqlite(p) => sqlx::query_scalar(q).fetch_all(p).await?,
            Pool::Postgres(p) => sqlx::query_scalar(q).fetch_all(p).await?,
        })
    }

    pub async fn close(&self) {
        match &self.pool {
            Pool::Sqlite(p) => p.close().await,
            Pool::Postgres(p) => p.close().await,
        }
        if let Some(p) = &self.searches {
            p.close().await;
        }
    }
}

/// Milliseconds since the Unix epoch: the clock every stored time uses.
pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A database URL with any password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("sqlite://data/ragtime.db"),
            "sqlite://data/ragtime.db"
        );
    }
}
