//! Collections as a resource: creation (within a tenant's quota), listing
//! with the document and chunk counts every write keeps up to date, removal
//! with everything in them, and tenants' own quotas.
//!
//! A tenant's collections are named by an *owner prefix*: the tenant's
//! stored names start with it (`acme~`), or, for the one tenant whose names
//! are stored as they are, the prefix is empty and its names hold no `~`.

use crate::{BeginWrite, Pool, Store, StoreError, WriteLocks, now_ms};

/// A collection and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionRecord {
    pub id: i64,
    /// The stored name (with its owner prefix).
    pub name: String,
    pub description: String,
    pub documents: i64,
    pub chunks: i64,
    /// 0 for collections made before creation times were kept.
    pub created_ms: i64,
}

/// What one owner's collections hold together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub collections: i64,
    pub documents: i64,
    pub chunks: i64,
}

/// A tenant's own quotas; `None` takes the configured default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantQuota {
    pub max_collections: Option<i64>,
    pub max_documents: Option<i64>,
    pub max_chunks: Option<i64>,
}

/// The limits a write must stay within, for the owner it writes as.
#[derive(Debug, Clone, Copy)]
pub struct Limits<'a> {
    /// The owner prefix (see the module docs).
    pub owner: &'a str,
    pub max_collections: i64,
    pub max_documents: i64,
    pub max_chunks: i64,
}

impl Limits<'_> {
    /// `Err(QuotaExceeded)` if `usage` has more collections than allowed.
    pub(crate) fn check_collections(&self, usage: Usage) -> Result<(), StoreError> {
        over([("max_collections", usage.collections, self.max_collections)])
    }

    /// `Err(QuotaExceeded)` naming the first of documents and chunks that
    /// `usage` has more of than allowed.
    pub(crate) fn check_contents(&self, usage: Usage) -> Result<(), StoreError> {
        over([
            ("max_documents", usage.documents, self.max_documents),
            ("max_chunks", usage.chunks, self.max_chunks),
        ])
    }
}

/// The first `(limit, used, max)` with more used than allowed, as an error.
fn over<const N: usize>(checks: [(&'static str, i64, i64); N]) -> Result<(), StoreError> {
    match checks.into_iter().find(|(_, used, max)| used > max) {
        Some((limit, _, value)) => Err(StoreError::QuotaExceeded { limit, value }),
        None => Ok(()),
    }
}

/// Whether a new collection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    New(i64),
    Existing(i64),
}

impl Created {
    pub fn id(self) -> i64 {
        match self {
            Created::New(id) | Created::Existing(id) => id,
        }
    }
}

/// What removing a collection took with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub documents: i64,
    pub chunks: i64,
    /// The corpus version after the removal.
    pub version: i64,
}

/// Rows of `collections` owned by `$1` (see the module docs).
pub(crate) const OWNED: &str =
    "(($1 = '' AND name NOT LIKE '%~%') OR ($1 <> '' AND substr(name, 1, length($1)) = $1))";

const COLUMNS: &str = "id, name, description, documents, chunks, created_ms";

type Row = (i64, String, String, i64, i64, i64);

fn record(r: Row) -> CollectionRecord {
    CollectionRecord {
        id: r.0,
        name: r.1,
        description: r.2,
        documents: r.3,
        chunks: r.4,
        created_ms: r.5,
    }
}

/// What collections hold together (one row), before any `WHERE`.
const USAGE_SELECT: &str = "SELECT COUNT(*), CAST(COALESCE(SUM(documents), 0) AS BIGINT), CAST(COALESCE(SUM(chunks), 0) AS BIGINT) FROM collections";

/// `SELECT` of an owner's usage (one row).
pub(crate) fn usage_query() -> String {
    format!("{USAGE_SELECT} WHERE {OWNED}")
}

pub(crate) fn usage_of(row: (i64, i64, i64)) -> Usage {
    Usage {
        collections: row.0,
        documents: row.1,
        chunks: row.2,
    }
}

impl Store {
    /// Creates collection `name` unless it exists, within `limits` when
    /// given (refused with [`StoreError::QuotaExceeded`], nothing written).
    /// The creation is in the ingest log.
    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
        limits: Option<Limits<'_>>,
    ) -> Result<Created, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            if let Some(limits) = &limits {
                tx.lock_owner(limits.owner).await?;
            }
            let existing: Option<i64> = sqlx::query_scalar("SELECT id FROM collections WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(id) = existing {
                tx.rollback().await?;
                return Ok(Created::Existing(id));
            }
            if let Some(limits) = limits {
                let row = sqlx::query_as(&usage_query()).bind(limits.owner).fetch_one(&mut *tx).await?;
                let mut usage = usage_of(row);
                usage.collections += 1;
                if let Err(e) = limits.check_collections(usage) {
                    tx.rollback().await?;
                    return Err(e);
                }
            }
            // A creation of the same name by a writer outside the owner's
            // lock (or with no limits) that committed meanwhile makes this
            // one find it, not fail on the unique name.
            let id: Option<i64> = sqlx::query_scalar(
                "INSERT INTO collections (name, description, created_ms) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING RETURNING id",
            )
            .bind(name)
            .bind(description)
            .bind(now_ms())
            .fetch_optional(&mut *tx)
            .await?;
            let Some(id) = id else {
                tx.rollback().await?;
                let id: Option<i64> = sqlx::query_scalar("SELECT id FROM collections WHERE name = $1").bind(name).fetch_optional(p).await?;
                return match id {
                    Some(id) => Ok(Created::Existing(id)),
                    // Made and removed again meanwhile: try once more.
                    None => Box::pin(self.create_collection(name, description, limits)).await,
                };
            };
            tx.lock_log().await?;
            sqlx::query(
                "INSERT INTO ingest_log (collection_id, external_id, op, chunks, at_ms) VALUES ($1, '', 'create_collection', 0, $2)",
            )
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Created::New(id))
        })
    }

    /// One collection by its stored name.
    pub async fn collection(&self, name: &str) -> Result<Option<CollectionRecord>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM collections WHERE name = $1");
        let row: Option<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(name).fetch_optional(p).await?);
        Ok(row.map(record))
    }

    /// An owner's collections (all of them for `None`), sorted by name.
    pub async fn list_collections(
        &self,
        owner: Option<&str>,
    ) -> Result<Vec<CollectionRecord>, StoreError> {
        let rows: Vec<Row> = match owner {
            Some(owner) => {
                let q = format!("SELECT {COLUMNS} FROM collections WHERE {OWNED} ORDER BY name");
                on_pool!(self, p => sqlx::query_as(&q).bind(owner).fetch_all(p).await?)
            }
            None => {
                let q = format!("SELECT {COLUMNS} FROM collections ORDER BY name");
                on_pool!(self, p => sqlx::query_as(&q).fetch_all(p).await?)
            }
        };
        Ok(rows.into_iter().map(record).collect())
    }

    /// What an owner's collections hold together.
    pub async fn usage(&self, owner: &str) -> Result<Usage, StoreError> {
        let q = usage_query();
        let row = on_pool!(self, p => sqlx::query_as(&q).bind(owner).fetch_one(p).await?);
        Ok(usage_of(row))
    }

    /// What every tenant's collections hold together.
    pub async fn total_usage(&self) -> Result<Usage, StoreError> {
        let row = on_pool!(self, p => sqlx::query_as(USAGE_SELECT).fetch_one(p).await?);
        Ok(usage_of(row))
    }

    /// Removes a collection with its documents and chunks in one
    /// transaction; `None` if there was no such collection. The removal is
    /// in the ingest log (the corpus version moves).
    pub async fn drop_collection(&self, id: i64) -> Result<Option<Dropped>, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            // Locks the row first: a write in flight into the collection
            // ends before its documents are counted and removed (else they
            // would be left behind, or the removal fail on their foreign key).
            let counts: Option<(i64, i64)> = sqlx::query_as("UPDATE collections SET documents = documents WHERE id = $1 RETURNING documents, chunks")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((documents, chunks)) = counts else {
                tx.rollback().await?;
                return Ok(None);
            };
            sqlx::query("DELETE FROM chunks WHERE document_id IN (SELECT id FROM documents WHERE collection_id = $1)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM documents WHERE collection_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM collections WHERE id = $1").bind(id).execute(&mut *tx).await?;
            tx.lock_log().await?;
            let version: i64 = sqlx::query_scalar(
                "INSERT INTO ingest_log (collection_id, external_id, op, chunks, at_ms) VALUES ($1, '', 'drop_collection', $2, $3) RETURNING id",
            )
            .bind(id)
            .bind(i32::try_from(chunks).unwrap_or(i32::MAX))
            .bind(now_ms())
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Some(Dropped { documents, chunks, version }))
        })
    }

    /// A tenant's own quotas, if the admin set any.
    pub async fn tenant_quota(&self, tenant: &str) -> Result<Option<TenantQuota>, StoreError> {
        let q = "SELECT max_collections, max_documents, max_chunks FROM tenant_quotas WHERE tenant = $1";
        let row: Option<(Option<i64>, Option<i64>, Option<i64>)> =
            on_pool!(self, p => sqlx::query_as(q).bind(tenant).fetch_optional(p).await?);
        Ok(row.map(|(c, d, k)| TenantQuota {
            max_collections: c,
            max_documents: d,
            max_chunks: k,
        }))
    }

    /// Sets a tenant's own quotas (`Some`) or removes them (`None`);
    /// `false` when there were none to remove.
    pub async fn set_tenant_quota(
        &self,
        tenant: &str,
        quota: Option<TenantQuota>,
    ) -> Result<bool, StoreError> {
        let Some(q) = quota else {
            let sql = "DELETE FROM tenant_quotas WHERE tenant = $1";
            let n = on_pool!(self, p => sqlx::query(sql).bind(tenant).execute(p).await?.rows_affected());
            return Ok(n > 0);
        };
        let sql = "INSERT INTO tenant_quotas (tenant, max_collections, max_documents, max_chunks, changed_ms) \
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant) DO UPDATE SET \
                   max_collections = excluded.max_collections, max_documents = excluded.max_documents, \
                   max_chunks = excluded.max_chunks, changed_ms = excluded.changed_ms";
        on_pool!(self, p => {
            sqlx::query(sql)
                .bind(tenant)
                .bind(q.max_collections)
                .bind(q.max_documents)
                .bind(q.max_chunks)
                .bind(now_ms())
                .execute(p)
                .await?;
        });
        Ok(true)
    }
}
