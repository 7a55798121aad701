//! The other real servers: filesystem on a temporary folder, memory, time, and fetch's refusal
//! of loopback addresses (a real `isError` result).

use agentry_mcp::CallOptions;
use serde_json::{Value, json};

use super::support::{add_connected, connected, servers, stdio, text};

#[tokio::test]
async fn filesystem_reads_and_writes_inside_its_folder_only() -> anyhow::Result<()> {
    let servers = servers()?;
    let folder = tempfile::tempdir()?;
    let root = folder.path().canonicalize()?;
    std::fs::write(root.join("notes.txt"), "first line\n")?;
    let manager = connected("fs", stdio(&servers.filesystem(&root))).await?;
    assert!(
        manager
            .tools()
            .iter()
            .any(|tool| tool.name == "fs__read_text_file")
    );

    let read = manager
        .call_tool(
            "fs",
            "read_text_file",
            json!({"path": root.join("notes.txt")}),
            CallOptions::default(),
        )
        .await?;
    assert!(!read.is_error);
    assert_eq!(text(&read).trim(), "first line");

    let written = manager
        .call_tool(
            "fs",
            "write_file",
            json!({"path": root.join("new.txt"), "content": "from agentry"}),
            CallOptions::default(),
        )
        .await?;
    assert!(!written.is_error, "{written:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("new.txt"))?,
        "from agentry"
    );

    let listed = manager
        .call_tool(
            "fs",
            "list_directory",
            json!({"path": root}),
            CallOptions::default(),
        )
        .await?;
    let listing = text(&listed);
    assert!(
        listing.contains("notes.txt") && listing.contains("new.txt"),
        "{listing}"
    );

    // Outside the allowed folder: the server refuses, as a tool error.
    let outside = manager
        .call_tool(
            "fs",
            "read_text_file",
            json!({"path": "/etc/hostname"}),
            CallOptions::default(),
        )
        .await?;
    assert!(outside.is_error, "{outside:?}");
    assert!(
        text(&outside).to_lowercase().contains("denied"),
        "{}",
        text(&outside)
    );
    Ok(())
}

#[tokio::test]
async fn memory_keeps_a_knowledge_graph() -> anyhow::Result<()> {
    let servers = servers()?;
    let folder = tempfile::tempdir()?;
    let file = folder.path().join("memory.jsonl");
    let manager = connected("memory", stdio(&servers.memory(&file))).await?;
    let created = manager
        .call_tool(
            "memory",
            "create_entities",
            json!({"entities": [{"name": "Agentry", "entityType": "project", "observations": ["written in Rust"]}]}),
            CallOptions::default(),
        )
        .await?;
    assert!(!created.is_error, "{created:?}");
    let graph = manager
        .call_tool("memory", "read_graph", json!({}), CallOptions::default())
        .await?;
    let structured = graph
        .structured_content
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no structured content"))?;
    assert_eq!(structured["entities"][0]["name"], "Agentry");
    assert_eq!(
        structured["entities"][0]["observations"][0],
        "written in Rust"
    );
    assert!(std::fs::read_to_string(&file)?.contains("Agentry"));
    Ok(())
}

#[tokio::test]
async fn time_and_fetch_from_pypi() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("time", stdio(&servers.time())).await?;
    add_connected(&manager, "fetch", stdio(&servers.fetch())).await?;

    let now = manager
        .call_tool(
            "time",
            "get_current_time",
            json!({"timezone": "UTC"}),
            CallOptions::default(),
        )
        .await?;
    assert!(!now.is_error, "{now:?}");
    let reported: Value = match &now.structured_content {
        Some(value) => value.clone(),
        None => serde_json::from_str(&text(&now))?,
    };
    assert_eq!(reported["timezone"], "UTC");
    let year = chrono_year(reported["datetime"].as_str().unwrap_or_default());
    assert!(year >= 2025, "{reported}");

    let bad_zone = manager
        .call_tool(
            "time",
            "get_current_time",
            json!({"timezone": "Mars/Olympus"}),
            CallOptions::default(),
        )
        .await?;
    assert!(bad_zone.is_error, "{bad_zone:?}");

    // mcp-server-fetch refuses loopback without --allow-private-ips: a real tool error.
    let refused = manager
        .call_tool(
            "fetch",
            "fetch",
            json!({"url": "http://127.0.0.1:9/"}),
            CallOptions::default(),
        )
        .await?;
    assert!(refused.is_error, "{refused:?}");
    assert!(!text(&refused).is_empty());
    Ok(())
}

fn chrono_year(datetime: &str) -> i32 {
    datetime
        .get(..4)
        .and_then(|year| year.parse().ok())
        .unwrap_or(0)
}
