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

ALTER TABLE ingest_log DROP CONSTRAINT ingest_log_op_check;
ALTER TABLE ingest_log ADD CONSTRAINT ingest_log_op_check
    CHECK (op IN ('upsert', 'delete', 'create_collection', 'drop_collection'));
