//! Agentry as an MCP server over streamable HTTP (`/mcp`): placeholder being written.
