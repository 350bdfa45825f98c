//! Budget versions: each runtime change of the stage budgets (the profile as
//! JSON), who made it, when and why. The newest version is in force.

use crate::{Pool, Store, StoreError, now_ms};

/// One version of the budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetVersion {
    pub version: i64,
    /// The profile as JSON.
    pub profile: String,
    pub changed_by: String,
    pub changed_ms: i64,
    pub note: String,
}

type Row = (i64, String, String, i64, String);

fn to_version(r: Row) -> BudgetVersion {
    BudgetVersion {
        version: r.0,
        profile: r.1,
        changed_by: r.2,
        changed_ms: r.3,
        note: r.4,
    }
}

const COLUMNS: &str = "SELECT version, profile, changed_by, changed_ms, note FROM budget_versions";

impl Store {
    /// Records a new version; returns it once committed.
    pub async fn add_budget_version(
        &self,
        profile: &str,
        changed_by: &str,
        note: &str,
    ) -> Result<BudgetVersion, StoreError> {
        let q = "INSERT INTO budget_versions (profile, changed_by, changed_ms, note) VALUES ($1, $2, $3, $4) RETURNING version, profile, changed_by, changed_ms, note";
        let at = now_ms();
        let row: Row = on_pool!(self, p => sqlx::query_as(q).bind(profile).bind(changed_by).bind(at).bind(note).fetch_one(p).await?);
        Ok(to_version(row))
    }

    /// The version in force (the newest), if the budgets were ever changed.
    pub async fn latest_budget_version(&self) -> Result<Option<BudgetVersion>, StoreError> {
        let q = format!("{COLUMNS} ORDER BY version DESC LIMIT 1");
        let row: Option<Row> = on_pool!(self, p => sqlx::query_as(&q).fetch_optional(p).await?);
        Ok(row.map(to_version))
    }

    pub async fn budget_version(&self, version: i64) -> Result<Option<BudgetVersion>, StoreError> {
        let q = format!("{COLUMNS} WHERE version = $1");
        let row: Option<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(version).fetch_optional(p).await?);
        Ok(row.map(to_version))
    }

    /// The newest `limit` versions, newest first.
    pub async fn budget_history(&self, limit: usize) -> Result<Vec<BudgetVersion>, StoreError> {
        let q = format!("{COLUMNS} ORDER BY version DESC LIMIT $1");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(limit).fetch_all(p).await?);
        Ok(rows.into_iter().map(to_version).collect())
    }
}

impl Store {
    /// Sets (or replaces) a tenant's own budget profile (JSON).
    pub async fn set_tenant_budgets(&self, tenant: &str, profile: &str) -> Result<(), StoreError> {
        let q = "INSERT INTO tenant_budgets (tenant, profile, changed_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant) DO UPDATE SET profile = excluded.profile, changed_ms = excluded.changed_ms";
        on_pool!(self, p => {
            sqlx::query(q).bind(tenant).bind(profile).bind(now_ms()).execute(p).await?;
        });
        Ok(())
    }

    /// Removes a tenant's override; `false` if it had none.
    pub async fn delete_tenant_budgets(&self, tenant: &str) -> Result<bool, StoreError> {
        let q = "DELETE FROM tenant_budgets WHERE tenant = $1";
        let n = on_pool!(self, p => sqlx::query(q).bind(tenant).execute(p).await?.rows_affected());
        Ok(n > 0)
    }

    /// Every override: (tenant, profile JSON).
    pub async fn tenant_budgets(&self) -> Result<Vec<(String, String)>, StoreError> {
        let q = "SELECT tenant, profile FROM tenant_budgets ORDER BY tenant";
        Ok(on_pool!(self, p => sqlx::query_as(q).fetch_all(p).await?))
    }
}

impl Store {
    /// Sets a tenant's queue priority (`Some`) or removes it (`None`);
    /// `false` when there was none to remove.
    pub async fn set_tenant_priority(
        &self,
        tenant: &str,
        priority: Option<u8>,
    ) -> Result<bool, StoreError> {
        let Some(priority) = priority else {
            let q = "DELETE FROM tenant_priorities WHERE tenant = $1";
            let n =
                on_pool!(self, p => sqlx::query(q).bind(tenant).execute(p).await?.rows_affected());
            return Ok(n > 0);
        };
        let q = "INSERT INTO tenant_priorities (tenant, priority, changed_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant) DO UPDATE SET priority = excluded.priority, changed_ms = excluded.changed_ms";
        on_pool!(self, p => {
            sqlx::query(q).bind(tenant).bind(i32::from(priority)).bind(now_ms()).execute(p).await?;
        });
        Ok(true)
    }

    /// Every tenant's priority: (tenant, priority).
    pub async fn tenant_priorities(&self) -> Result<Vec<(String, u8)>, StoreError> {
        let q = "SELECT tenant, priority FROM tenant_priorities ORDER BY tenant";
        let rows: Vec<(String, i32)> = on_pool!(self, p => sqlx::query_as(q).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(|(t, p)| (t, u8::try_from(p.clamp(0, 255)).unwrap_or(0)))
            .collect())
    }
}
