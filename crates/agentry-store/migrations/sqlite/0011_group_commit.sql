-- PostgreSQL's schema gains a function that applies a group commit's batch in one call
-- (postgres/0011_group_commit.sql). SQLite runs in this process: its batches are statements
-- on the writer connection, with no round trip to save, so its schema does not change.
SELECT 1;
