//! Configuration parsing and validation.

use agentry_mcp::{
    McpError, McpServerConfig, TransportKind, ValueSource, parse_servers_document,
    qualified_tool_name,
};
use serde_json::json;

#[test]
fn the_usual_mcp_servers_document_parses_both_transports() -> anyhow::Result<()> {
    let servers = parse_servers_document(&json!({
        "mcpServers": {
            "files": {"command": "npx", "args": ["-y", "server"], "env": {"TOKEN": {"secret": "gh"}}},
            "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
            "typed": {"type": "streamableHttp", "url": "http://127.0.0.1:1/mcp"}
        }
    }))?;
    assert_eq!(servers.len(), 3);
    assert_eq!(servers["files"].transport_kind()?, TransportKind::Stdio);
    assert_eq!(
        servers["files"].env["TOKEN"],
        ValueSource::Secret {
            secret: "gh".into()
        }
    );
    assert_eq!(servers["files"].secret_names().collect::<Vec<_>>(), ["gh"]);
    assert_eq!(
        servers["remote"].transport_kind()?,
        TransportKind::StreamableHttp
    );
    assert_eq!(
        servers["typed"].transport_kind()?,
        TransportKind::StreamableHttp
    );
    // A bare map of servers is accepted too.
    let bare = parse_servers_document(&json!({"t": {"command": "x"}}))?;
    assert_eq!(bare["t"].command.as_deref(), Some("x"));
    assert_eq!(bare["t"].transport_kind()?, TransportKind::Stdio);
    // What the builder makes round-trips through the stored JSON.
    let built = McpServerConfig::stdio("x", ["a"]);
    let stored = serde_json::to_value(&built)?;
    assert_eq!(serde_json::from_value::<McpServerConfig>(stored)?, built);
    Ok(())
}

#[test]
fn bad_configurations_are_refused_with_a_reason() {
    let cases = [
        (json!([]), "expected a JSON object"),
        (json!({"mcpServers": {}}), "no servers"),
        (json!({"mcpServers": {"a": {}}}), "needs \"command\""),
        (
            json!({"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}),
            "not both",
        ),
        (
            json!({"mcpServers": {"a": {"url": "ftp://h/"}}}),
            "http or https",
        ),
        (
            json!({"mcpServers": {"a": {"url": "not a url"}}}),
            "not a URL",
        ),
        (json!({"mcpServers": {"a": {"command": " "}}}), "non-empty"),
        (
            json!({"mcpServers": {"a__b": {"command": "x"}}}),
            "not a valid MCP server name",
        ),
        (
            json!({"mcpServers": {"../x": {"command": "x"}}}),
            "not a valid MCP server name",
        ),
        (
            json!({"mcpServers": {"a": {"command": "x", "bogus": 1}}}),
            "unknown field",
        ),
        (
            json!({"mcpServers": {"a": {"command": "x", "env": {"A=B": "c"}}}}),
            "environment variable",
        ),
        (
            json!({"mcpServers": {"a": {"url": "http://h/", "headers": {"bad header": "v"}}}}),
            "header name",
        ),
        (
            json!({"mcpServers": {"a": {"command": "x", "call_timeout_ms": 0}}}),
            "positive",
        ),
        (
            json!({"mcpServers": {"a": {"command": "x"}}, "other": 1}),
            "beside",
        ),
    ];
    for (document, expected) in cases {
        match parse_servers_document(&document) {
            Err(McpError::InvalidConfig(message)) => assert!(
                message.contains(expected),
                "{document}: {message:?} does not say {expected:?}"
            ),
            other => panic!("{document}: expected an invalid configuration, got {other:?}"),
        }
    }
}

#[test]
fn tool_names_are_qualified_and_made_valid_for_model_apis() {
    assert_eq!(
        qualified_tool_name("everything", "get-sum"),
        "everything__get-sum"
    );
    assert_eq!(
        qualified_tool_name("fs", "read.file/v2"),
        "fs__read_file_v2"
    );
    assert_eq!(qualified_tool_name("s", &"x".repeat(100)).len(), 64);
}
