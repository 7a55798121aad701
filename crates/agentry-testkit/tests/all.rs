//! The agentry-testkit integration tests: a real reqwest client against a running
//! [`agentry_testkit::MockProvider`].

mod suite;
