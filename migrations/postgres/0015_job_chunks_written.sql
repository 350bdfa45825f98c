-- A job's chunks of documents it wrote (created or replaced), apart from
-- those of documents found unchanged: what re-sending a folder embedded.
ALTER TABLE jobs ADD COLUMN chunks_written BIGINT NOT NULL DEFAULT 0;
