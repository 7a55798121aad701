//! The application's own integration tests: the app driven at its boundary — `runs::prepare`,
//! `start_in_session` and `App::follow` — with the mock provider and a SQLite store, below any
//! front-end. One binary, modules under `suite/`.

// Test code may panic on failure; that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod suite;
