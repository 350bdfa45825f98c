-- A collection's change-log entries in order: what a replica replays over
-- a saved snapshot of the collection's indexes.
CREATE INDEX ingest_log_collection ON ingest_log (collection_id, id);
