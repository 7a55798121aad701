#!/bin/sh
# Agentry's MCP client under the MCP conformance suite's client scenarios: the suite runs
# `sh client.sh AGENTRY SERVER_URL` with MCP_CONFORMANCE_SCENARIO naming the scenario, against a
# test server of its own. Each scenario is what a user does with the CLI: save the server (which
# connects and lists its tools once), then call what the scenario's server offers.
set -eu
agentry="$1"
url="$2"
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
"$agentry" --home "$home" mcp add conformance --url "$url"
case "${MCP_CONFORMANCE_SCENARIO:-}" in
  initialize) ;;
  tools_call) "$agentry" --home "$home" mcp call conformance add_numbers '{"a": 2, "b": 3}' ;;
  sse-retry) "$agentry" --home "$home" mcp call conformance test_reconnection ;;
  *) echo "client.sh: no steps for scenario ${MCP_CONFORMANCE_SCENARIO:-(none)}" >&2; exit 2 ;;
esac
