-- A tenant's priority in the LLM backends' queues (higher waits less),
-- set by the admin; tenants without a row have priority 0.
CREATE TABLE tenant_priorities (
    tenant      TEXT    PRIMARY KEY,
    priority    INTEGER NOT NULL,
    changed_ms  BIGINT  NOT NULL
);
