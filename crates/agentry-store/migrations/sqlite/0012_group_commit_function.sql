-- PostgreSQL's group-commit function changes (postgres/0012_group_commit_function.sql); SQLite
-- has no such function, so its schema does not change.
SELECT 1;
