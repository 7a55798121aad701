//! The store's integration tests: one binary, modules under `suite/`. Every scenario runs
//! against both backends: a SQLite file in a temporary folder, and PostgreSQL (from
//! `AGENTRY_TEST_DATABASE_URL`, default `postgres://root@127.0.0.1:5432/test`) in a schema of its
//! own. PostgreSQL being unreachable fails the PostgreSQL variants; it is not a skip.

// Test code may panic on failure; that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod suite;
