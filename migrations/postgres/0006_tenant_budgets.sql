-- Per-tenant budget profiles that override the global one for that tenant.
CREATE TABLE tenant_budgets (
    tenant      TEXT   PRIMARY KEY,
    profile     TEXT   NOT NULL,
    changed_ms  BIGINT NOT NULL
);
