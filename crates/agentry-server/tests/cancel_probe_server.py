"""An MCP server (the official Python SDK) whose `wait` tool records in a file whether it
finished or was cancelled: the tests use it to see a cancellation reach the server."""

import asyncio, sys, pathlib
from mcp.server.mcpserver import MCPServer

marker = pathlib.Path(sys.argv[1])
server = MCPServer("cancel-probe")

@server.tool()
async def wait(seconds: float) -> str:
    """Sleeps for a while."""
    marker.write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        marker.write_text("cancelled")
        raise
    marker.write_text("finished")
    return "slept"

server.run()
