//! The built-in tools' integration tests: one binary, modules under `suite/`.

// Test code may panic on failure; that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod suite;
