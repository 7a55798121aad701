//! The integration tests of agentry-mcp, in one binary.

mod suite;
