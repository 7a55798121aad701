//! The HTTP API's integration tests: one binary, modules under `suite/`.

// Test code may panic on failure; that is how a test fails.
// They await whole futures on purpose: nothing keeps them per request in flight, as a
// handler's is (the crate's 2 KiB `future-size-threshold`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    clippy::large_futures
)]

mod suite;
