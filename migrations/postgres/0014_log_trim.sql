-- The change log is trimmed below every live replica's position: each
-- replica reports the entry its indexes (and its saved snapshots) reflect;
-- entries below the lowest are removed, and `below` records where the log
-- now starts, so a replica that fell further behind, or a snapshot older
-- than that, reloads from the store instead of missing a change.
CREATE TABLE replicas (
    id        TEXT   PRIMARY KEY,
    position  BIGINT NOT NULL,
    seen_ms   BIGINT NOT NULL
);

CREATE TABLE ingest_log_trim (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    below  BIGINT  NOT NULL
);
INSERT INTO ingest_log_trim (id, below) VALUES (1, 0);
