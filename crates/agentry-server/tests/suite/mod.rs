mod agents;
mod config;
mod infer;
mod mcp_servers;
mod openapi;
mod ops;
mod sessions;
mod support;
