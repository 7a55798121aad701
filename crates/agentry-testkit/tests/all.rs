//! The agentry-testkit integration tests: a real reqwest client against a running
//! [`agentry_testkit::MockProvider`].

// Always true in a test binary; it marks the helpers in the suite as test code for clippy,
// which otherwise only treats `#[test]` functions as such (unwrap/expect are allowed in tests).
#[cfg(test)]
mod suite;
