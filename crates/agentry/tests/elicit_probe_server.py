"""A minimal MCP server over stdio, in plain JSON-RPC (revision 2025-11-25), whose `book` tool
asks the person for a date and a number of seats with `elicitation/create` and says what it
got: the tests use it to answer an elicitation from `agentry chat`. (The Python SDK cannot send
requests to the client on the 2026 revision that Agentry prefers, so this one speaks only the
`initialize` lifecycle.)"""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


SCHEMA = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "title": "Date"},
        "seats": {"type": "integer", "title": "Seats", "minimum": 1},
    },
    "required": ["date", "seats"],
}

while True:
    message = read()
    method = message.get("method")
    if "id" not in message or method is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "elicit-probe", "version": "1"},
        }})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [{
            "name": "book",
            "description": "Books a table, asking the person for the details.",
            "inputSchema": {"type": "object", "properties": {}},
        }]}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": "ask-1", "method": "elicitation/create", "params": {
            "mode": "form",
            "message": "Which date, and how many seats?",
            "requestedSchema": SCHEMA,
        }})
        answer = read()
        while answer.get("id") != "ask-1":
            answer = read()
        result = answer.get("result", {})
        if result.get("action") == "accept":
            content = result.get("content", {})
            text = f"booked {content.get('seats')} seats on {content.get('date')}"
        else:
            text = f"not booked: {result.get('action', answer.get('error'))}"
        send({"jsonrpc": "2.0", "id": message["id"],
              "result": {"content": [{"type": "text", "text": text}]}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": message["id"],
              "error": {"code": -32601, "message": f"unknown method {method}"}})
