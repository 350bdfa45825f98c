-- Every change-log entry wakes the replicas' followers as it commits
-- (LISTEN ragtime_ingest); they poll as well, so a lost notification only
-- delays a change by the polling interval.
CREATE OR REPLACE FUNCTION ragtime_ingest_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('ragtime_ingest', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER ingest_log_notify
    AFTER INSERT ON ingest_log
    FOR EACH STATEMENT
    EXECUTE FUNCTION ragtime_ingest_notify();
