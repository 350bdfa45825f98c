-- PostgreSQL's followers are woken by LISTEN/NOTIFY on ingest_log; SQLite
-- has no notifications (several processes may share the file), so its
-- followers poll. Kept so both folders carry the same versions.
SELECT 1;
