//! Where the compatibility APIs are mounted beside Agentry's own `/v1`: the routes that serve
//! them and the authorization that reads their paths as `/v1`'s both name these.

/// The seed's API.
pub const LINGLONG: &str = "/linglong";

/// The OpenAI-compatible API.
pub const OPENAI: &str = "/openai/v1";

/// The published A2A agents.
pub const A2A: &str = "/a2a";
