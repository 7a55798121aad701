-- The order configurations were first stored in (the first registered model is the default one).
-- Existing rows are numbered by when they were last written, the best record there is.

ALTER TABLE config ADD COLUMN created_seq BIGINT NOT NULL DEFAULT 0;

UPDATE config SET created_seq = ordered.n
FROM (SELECT kind, name, row_number() OVER (ORDER BY updated_at, name) AS n FROM config) AS ordered
WHERE config.kind = ordered.kind AND config.name = ordered.name;
