"""An independent MCP client for Agentry's MCP server tests: the official Python `mcp` SDK.

Usage: python mcp_client.py '<spec as JSON>'

The spec:
  {"transport": "http", "url": "http://127.0.0.1:PORT/mcp", "headers": {"Authorization": "..."}}
  or {"transport": "stdio", "command": "/path/agentry", "args": [...], "env": {...}}
  plus "mode": "legacy" (initialize handshake, a stateful session) or "auto" (2026-07-28
  discovery, stateless requests), and "calls": [{"tool": NAME, "arguments": {...}}, ...]
  (a call may set "timeout" in seconds: the client then gives up and cancels it).

Prints one JSON object on stdout: the negotiated protocol version, the server's name, the
listed tools (as on the wire), and for each call its result (as on the wire), the progress
notifications that arrived for it and the seconds it took; or {"error": ...} with exit status 1
when connecting or listing fails. A call that fails with a protocol error (or times out)
records it as {"error": ...} and the script goes on.
"""

import asyncio
import json
import sys
import time
import traceback

from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def wire(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def server_of(spec):
    if spec["transport"] == "http":
        http = create_mcp_http_client(headers=spec.get("headers") or None)
        return streamable_http_client(spec["url"], http_client=http)
    if spec["transport"] == "stdio":
        return StdioServerParameters(
            command=spec["command"], args=spec.get("args", []), env=spec.get("env")
        )
    raise ValueError(f"unknown transport {spec['transport']!r}")


async def main(spec):
    out = {}
    async with Client(server_of(spec), mode=spec.get("mode", "auto"), read_timeout_seconds=60) as client:
        out["protocol_version"] = client.protocol_version
        info = client.server_info
        out["server_name"] = info.name if info is not None else None
        listed = await client.list_tools()
        out["tools"] = [wire(tool) for tool in listed.tools]
        out["calls"] = []
        for call in spec.get("calls", []):
            progress = []

            async def on_progress(value, total, message, progress=progress):
                progress.append({"progress": value, "total": total, "message": message})

            started = time.perf_counter()
            record = {"tool": call["tool"]}
            try:
                result = await client.call_tool(
                    call["tool"],
                    call.get("arguments", {}),
                    read_timeout_seconds=call.get("timeout"),
                    progress_callback=on_progress,
                )
                record["result"] = wire(result)
            except Exception as error:  # a protocol error: recorded, the script goes on
                record["error"] = f"{type(error).__name__}: {error}"
            record["seconds"] = time.perf_counter() - started
            record["progress"] = progress
            out["calls"].append(record)
    return out


if __name__ == "__main__":
    try:
        result = asyncio.run(main(json.loads(sys.argv[1])))
    except BaseException as error:  # noqa: BLE001 - report anything as JSON
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        sys.exit(1)
    print(json.dumps(result))
