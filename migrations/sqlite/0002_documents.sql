-- Documents, their chunks (with embeddings, so indexes can be rebuilt from
-- the store alone) and the ingest log (its id is the corpus version).
CREATE TABLE documents (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    external_id   TEXT    NOT NULL,
    title         TEXT    NOT NULL DEFAULT '',
    metadata      TEXT    NOT NULL DEFAULT '{}',
    content_hash  TEXT    NOT NULL,
    updated_ms    BIGINT  NOT NULL,
    UNIQUE (collection_id, external_id)
);

CREATE TABLE chunks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    text        TEXT    NOT NULL,
    tokens      INTEGER NOT NULL,
    embedding   BLOB    NOT NULL,
    UNIQUE (document_id, position)
);

CREATE TABLE ingest_log (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL,
    external_id   TEXT    NOT NULL,
    op            TEXT    NOT NULL CHECK (op IN ('upsert', 'delete')),
    chunks        INTEGER NOT NULL,
    at_ms         BIGINT  NOT NULL
);
