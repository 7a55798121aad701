-- PostgreSQL's group-commit function changes (postgres/0012_group_commit_leases.sql); SQLite
-- has no such function, so its schema does not change.
SELECT 1;
