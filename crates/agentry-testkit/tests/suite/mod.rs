//! Test modules, one per concern of the mock provider.

mod client;
mod delivery;
mod fixtures;
mod mcp_servers;
mod mock_process;
mod protocol_checks;
mod recording;
mod replay;
mod scripted;
mod wire;
