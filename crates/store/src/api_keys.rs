//! API keys: a public id, the tenant it acts for, a SHA-256 of its secret,
//! and when it was revoked (if it was).

use crate::{Pool, Store, StoreError, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub secret_hash: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
}

type Row = (String, String, String, String, i64, Option<i64>);

fn to_record(r: Row) -> ApiKeyRecord {
    ApiKeyRecord {
        id: r.0,
        tenant: r.1,
        name: r.2,
        secret_hash: r.3,
        created_ms: r.4,
        revoked_ms: r.5,
    }
}

const COLUMNS: &str = "SELECT id, tenant, name, secret_hash, created_ms, revoked_ms FROM api_keys";

impl Store {
    pub async fn add_api_key(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        secret_hash: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        let at = now_ms();
        let q = "INSERT INTO api_keys (id, tenant, name, secret_hash, created_ms) VALUES ($1, $2, $3, $4, $5)";
        on_pool!(self, p => {
            sqlx::query(q).bind(id).bind(tenant).bind(name).bind(secret_hash).bind(at).execute(p).await?;
        });
        Ok(ApiKeyRecord {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            secret_hash: secret_hash.to_owned(),
            created_ms: at,
            revoked_ms: None,
        })
    }

    pub async fn api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let q = format!("{COLUMNS} WHERE id = $1");
        let row: Option<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(id).fetch_optional(p).await?);
        Ok(row.map(to_record))
    }

    /// Every key, newest first.
    pub async fn api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let q = format!("{COLUMNS} ORDER BY created_ms DESC, id");
        let rows: Vec<Row> = on_pool!(self, p => sqlx::query_as(&q).fetch_all(p).await?);
        Ok(rows.into_iter().map(to_record).collect())
    }

    /// Revokes a key; `false` if there is no such key or it was revoked.
    pub async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let q = "UPDATE api_keys SET revoked_ms = $1 WHERE id = $2 AND revoked_ms IS NULL";
        let n = on_pool!(self, p => sqlx::query(q).bind(now_ms()).bind(id).execute(p).await?.rows_affected());
        Ok(n > 0)
    }
}
