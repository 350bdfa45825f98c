-- A trim records, for each collection, the last of its change-log entries
-- it removed: a collection's saved snapshot stays good after trims that
-- removed other collections' entries, or its own from before the
-- snapshot, so a collection that does not change never holds the log
-- back. Collections from before this record take the log's trim point.
ALTER TABLE collections ADD COLUMN log_trimmed_to BIGINT NOT NULL DEFAULT 0;
UPDATE collections SET log_trimmed_to =
    (SELECT CASE WHEN below > 0 THEN below - 1 ELSE 0 END FROM ingest_log_trim WHERE id = 1);

-- This store's random name: a snapshot whose own log entry was trimmed is
-- told by it that it was saved from this store, not from another with the
-- same ids.
CREATE TABLE store_identity (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    token  TEXT    NOT NULL
);
INSERT INTO store_identity (id, token) VALUES (1, md5(random()::text || clock_timestamp()::text));
