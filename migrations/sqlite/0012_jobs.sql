-- Ingest jobs: large uploads run in the background; each job's progress is
-- written in the same transaction as the documents it counts, so after a
-- crash it says exactly how far it got. A job whose process stops beating
-- (heartbeat_ms) is reported as interrupted.
CREATE TABLE jobs (
    id               TEXT    PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    collection       TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled', 'interrupted')),
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    documents_total  BIGINT  NOT NULL,
    chunks_total     BIGINT  NOT NULL,
    documents_done   BIGINT  NOT NULL DEFAULT 0,
    chunks_done      BIGINT  NOT NULL DEFAULT 0,
    created          BIGINT  NOT NULL DEFAULT 0,
    replaced         BIGINT  NOT NULL DEFAULT 0,
    unchanged        BIGINT  NOT NULL DEFAULT 0,
    error            TEXT,
    created_ms       BIGINT  NOT NULL,
    started_ms       BIGINT,
    heartbeat_ms     BIGINT  NOT NULL,
    finished_ms      BIGINT
);
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_ms);
