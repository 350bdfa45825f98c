-- Collections as a resource: a description, document and chunk counts kept
-- with every write (quotas and GET /v1/collections read them, never a
-- count over the chunks), per-tenant quotas set by the admin, and
-- collection creation and removal in the ingest log.
ALTER TABLE collections ADD COLUMN description TEXT NOT NULL DEFAULT '';
ALTER TABLE collections ADD COLUMN documents BIGINT NOT NULL DEFAULT 0;
ALTER TABLE collections ADD COLUMN chunks BIGINT NOT NULL DEFAULT 0;
ALTER TABLE collections ADD COLUMN created_ms BIGINT NOT NULL DEFAULT 0;

UPDATE collections SET
    documents = (SELECT COUNT(*) FROM documents d WHERE d.collection_id = collections.id),
    chunks = (SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id
              WHERE d.collection_id = collections.id);

-- A tenant's own quotas; a missing row or a NULL takes the configured default.
CREATE TABLE tenant_quotas (
    tenant           TEXT   PRIMARY KEY,
    max_collections  BIGINT,
    max_documents    BIGINT,
    max_chunks       BIGINT,
    changed_ms       BIGINT NOT NULL
);

-- SQLite cannot change a CHECK in place: the log is copied into a table
-- that allows the two new operations (ids kept, so the corpus version does
-- not move).
CREATE TABLE ingest_log_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL,
    external_id   TEXT    NOT NULL,
    op            TEXT    NOT NULL CHECK (op IN ('upsert', 'delete', 'create_collection', 'drop_collection')),
    chunks        INTEGER NOT NULL,
    at_ms         BIGINT  NOT NULL
);
INSERT INTO ingest_log_new SELECT id, collection_id, external_id, op, chunks, at_ms FROM ingest_log;
DROP TABLE ingest_log;
ALTER TABLE ingest_log_new RENAME TO ingest_log;
