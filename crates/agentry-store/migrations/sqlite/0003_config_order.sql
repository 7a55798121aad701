-- The order configurations were first stored in (the first registered model is the default one).
-- Existing rows keep the order they were inserted in (their rowid).

ALTER TABLE config ADD COLUMN created_seq INTEGER NOT NULL DEFAULT 0;

UPDATE config SET created_seq = rowid;
