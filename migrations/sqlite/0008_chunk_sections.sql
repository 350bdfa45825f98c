-- The section path of each chunk's first line ("Type layout › Size"):
-- shown with the passage, embedded with it and searched lexically.
ALTER TABLE chunks ADD COLUMN section TEXT NOT NULL DEFAULT '';
