mod chat;
mod crash;
mod mcp;
mod mcp_serve;
mod run;
mod sandbox;
mod serve;
mod sessions;
