-- Stage budgets changed at runtime through the admin API: every change is a
-- new version (the audit log); the newest one is in force on every replica.
CREATE TABLE budget_versions (
    version     BIGSERIAL PRIMARY KEY,
    profile     TEXT   NOT NULL,
    changed_by  TEXT   NOT NULL,
    changed_ms  BIGINT NOT NULL,
    note        TEXT   NOT NULL DEFAULT ''
);
