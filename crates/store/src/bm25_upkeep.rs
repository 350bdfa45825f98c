//! Keeping `pg_textsearch`'s BM25 index as good as a fresh build.
//!
//! `pg_textsearch` 0.6.1 writes the documents of each write into its
//! in-memory table and, past a size, out into segments. The segments a
//! stream of writes leaves rank worse than one built over the same rows
//! by `CREATE INDEX`: SciFact's train questions over the engine's own
//! ingest rank at lexical nDCG@10 0.650 (hybrid 0.724) in the index the
//! ingest left, and 0.686 (hybrid 0.732, within 0.01 of the in-memory
//! engine's 0.738) once the same index is rebuilt — where merging its
//! segments (`bm25_force_merge`) changes nothing. So the engine rebuilds
//! it (`REINDEX INDEX CONCURRENTLY`: searches and writes go on against the
//! old one meanwhile) once enough of the documents were written since its
//! last build; one replica at a time, under an advisory lock.
//!
//! A write is counted by the document's `updated_ms` (set when it is made
//! or replaced, by the writing replica's clock); `search_schema.bm25_built_ms`
//! records when the last build began (unknown — an index made before this
//! was kept — counts every document as written since, so the first look
//! after an upgrade builds it). A rough count on purpose: a document
//! replaced many times counts once and a removed one not at all; it
//! decides when, not whether, the index is built again.

use crate::search::Lexical;
use crate::{Pool, Store, StoreError, now_ms};

/// The advisory lock (`pg_advisory_lock`'s one 64-bit key) a rebuild
/// holds: one at a time, whatever the number of replicas.
pub const BM25_REBUILD_LOCK: i64 = 0x7261_6774_626d_3235; // "ragtbm25"

/// What a look at the BM25 index found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bm25Upkeep {
    /// The documents in the database.
    pub documents: i64,
    /// Those written since the index was last built.
    pub written_since: i64,
    /// Whether this look rebuilt it (false: not due, or another replica
    /// was rebuilding it).
    pub rebuilt: bool,
}

impl Store {
    /// Rebuilds the BM25 index when at least `fraction` of the documents
    /// (and at least `at_least` of them) were written since its last
    /// build; `None` where the database ranks words without it. Runs on
    /// the primary, for as long as the build takes (seconds per hundred
    /// thousand documents), with no statement timeout.
    pub async fn keep_bm25_fresh(
        &self,
        fraction: f64,
        at_least: i64,
    ) -> Result<Option<Bm25Upkeep>, StoreError> {
        let Pool::Postgres(p) = &self.pool else {
            return Ok(None);
        };
        if self.lexical_ranking() != Some(Lexical::Bm25) {
            return Ok(None);
        }
        let due = |(documents, written_since): (i64, i64)| Bm25Upkeep {
            documents,
            written_since,
            rebuilt: written_since >= at_least.max(1)
                && written_since as f64 >= fraction * documents as f64,
        };
        let look = due(written_since_build(p).await?);
        if !look.rebuilt {
            return Ok(Some(look));
        }
        // REINDEX … CONCURRENTLY runs outside any transaction, on one
        // connection that also holds the lock. Closed rather than pooled
        // should this call be dropped midway: pooled, it would keep the
        // session's lock and its timeout.
        let mut conn = p.acquire().await?;
        conn.close_on_drop();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(BM25_REBUILD_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if !locked {
            return Ok(Some(Bm25Upkeep {
                rebuilt: false,
                ..look
            }));
        }
        // Counted again under the lock: another replica may have just
        // built it.
        let look = due(written_since_build(&mut *conn).await?);
        let rebuilt = if look.rebuilt {
            rebuild(&mut conn).await
        } else {
            Ok(())
        };
        // The connection goes back to the pool with its timeout, whatever
        // the build did.
        let reset = sqlx::query("RESET statement_timeout")
            .execute(&mut *conn)
            .await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(BM25_REBUILD_LOCK)
            .execute(&mut *conn)
            .await;
        rebuilt?;
        reset?;
        unlocked?;
        Ok(Some(look))
    }
}

/// The documents, and how many were written since the index's last build.
async fn written_since_build<'c>(on: impl sqlx::PgExecutor<'c>) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE updated_ms > \
         COALESCE((SELECT bm25_built_ms FROM search_schema WHERE id = 1), 0)) FROM documents",
    )
    .fetch_one(on)
    .await
}

/// Builds the index again beside the old one and swaps it in; a build a
/// replica died in left a copy behind (`_ccnew…` before the swap,
/// `_ccold…` after it), dropped first.
async fn rebuild(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = 'documents'::regclass AND NOT i.indisvalid \
         AND c.relname LIKE 'documents\\_bm25\\_cc%'",
    )
    .fetch_all(&mut *conn)
    .await?;
    for name in left {
        sqlx::query(&format!("DROP INDEX CONCURRENTLY IF EXISTS \"{name}\""))
            .execute(&mut *conn)
            .await?;
    }
    let began = now_ms();
    sqlx::query("REINDEX INDEX CONCURRENTLY documents_bm25")
        .execute(&mut *conn)
        .await?;
    record_build(&mut *conn, began).await
}

/// Records that the index's last build began at `began_ms`.
pub(crate) async fn record_build<'c>(
    on: impl sqlx::PgExecutor<'c>,
    began_ms: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE search_schema SET bm25_built_ms = $1 WHERE id = 1")
        .bind(began_ms)
        .execute(on)
        .await?;
    Ok(())
}
