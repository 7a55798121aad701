//! Terminals over HTTP and a WebSocket: an interactive program (`python3 -i`) driven through
//! the socket, resized, re-attached after the connection dropped (the scrollback comes back),
//! and ended; the seed's `/linglong/v1/terminals/ws`; bad input and a foreign page refused.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::support::{Server, start_with_workspaces};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn new_session(server: &Server) -> String {
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::text("Hi."),
    ));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "hello"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

async fn connect(server: &Server, path: &str) -> Socket {
    let url = format!("{}{path}", server.url.replacen("http", "ws", 1));
    let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    socket
}

/// Reads frames until the text seen (output, binary or text frames) contains `needle`; answers
/// the control messages (JSON text frames) met on the way, in order.
async fn read_until(socket: &mut Socket, seen: &mut String, needle: &str) -> Vec<Value> {
    let mut control = Vec::new();
    let wait = async {
        while !seen.contains(needle) {
            match socket.next().await {
                Some(Ok(Message::Binary(bytes))) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Value>(&text) {
                    Ok(value) if value.is_object() => control.push(value),
                    _ => seen.push_str(&text),
                },
                Some(Ok(_)) => {}
                other => panic!("the socket ended before {needle:?} ({other:?}): {seen:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), wait)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in {seen:?}"));
    control
}

async fn send(socket: &mut Socket, text: &str) {
    socket
        .send(Message::Binary(text.as_bytes().to_vec().into()))
        .await
        .unwrap();
}

/// `python3 -i` in the session's sandbox, driven through the WebSocket: input, output, a
/// resize, a dropped connection re-attached with its scrollback, and the program's end.
#[tokio::test]
async fn an_interactive_program_is_driven_through_the_websocket() {
    let server = start_with_workspaces().await;
    let session = new_session(&server).await;
    let (status, opened) = server
        .post(
            "/v1/terminals",
            json!({"session_id": session, "cols": 90, "rows": 20,
                   "command": ["/usr/bin/python3", "-i", "-q"]}),
        )
        .await;
    assert_eq!(status, 201, "{opened}");
    let id = opened["terminal_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("term_"), "{opened}");
    assert_eq!(opened["alive"], true);

    let mut socket = connect(&server, &format!("/v1/terminals/{id}/ws")).await;
    let mut seen = String::new();
    let control = read_until(&mut socket, &mut seen, ">>> ").await;
    assert_eq!(control[0]["type"], "attached", "{control:?}");
    assert_eq!(control[0]["terminal_id"], id.as_str());
    assert_eq!(control[0]["cols"], 90);
    send(
        &mut socket,
        "import os, sys; print(sys.stdin.isatty(), 6 * 7)\n",
    )
    .await;
    read_until(&mut socket, &mut seen, "True 42").await;
    socket
        .send(Message::Text(
            json!({"type": "resize", "cols": 120, "rows": 40})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    // Keystrokes as a text frame work too.
    socket
        .send(Message::Text("print(os.get_terminal_size())\n".into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, "columns=120, lines=40").await;

    // The connection drops; the terminal goes on, and a new attachment sees what it showed.
    drop(socket);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, listed) = server
        .get(&format!("/v1/terminals?session_id={session}"))
        .await;
    assert_eq!(listed["terminals"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["terminals"][0]["cols"], 120, "{listed}");
    let mut socket = connect(&server, &format!("/v1/terminals/{id}/ws")).await;
    let mut again = String::new();
    read_until(&mut socket, &mut again, "True 42").await;
    send(&mut socket, "x = 'still here'; x\n").await;
    read_until(&mut socket, &mut again, "'still here'").await;

    // The program ends: an exit message, then the socket closes.
    send(&mut socket, "exit(5)\n").await;
    let end = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    let value: Value = serde_json::from_str(&text).unwrap();
                    if value["type"] == "exit" {
                        return value;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the socket ended without an exit message: {other:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(end["code"], 5, "{end}");
    let (status, shown) = server.get(&format!("/v1/terminals/{id}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["alive"], false, "{shown}");
    assert_eq!(shown["exit_code"], 5, "{shown}");
    server.close_sandboxes().await;
}

/// Several terminals per session; closing one kills its program; bad requests are refused;
/// a page of another origin cannot open the socket.
#[tokio::test]
async fn terminals_are_listed_closed_and_guarded() {
    let server = start_with_workspaces().await;
    let session = new_session(&server).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, opened) = server
            .post("/v1/terminals", json!({"session_id": session}))
            .await;
        assert_eq!(status, 201, "{opened}");
        assert_eq!(
            (opened["cols"].as_u64(), opened["rows"].as_u64()),
            (Some(80), Some(24))
        );
        ids.push(opened["terminal_id"].as_str().unwrap().to_owned());
    }
    let (_, listed) = server.get("/v1/terminals").await;
    assert_eq!(listed["terminals"].as_array().unwrap().len(), 2, "{listed}");

    // A login shell runs in the sandbox, in the session's workspace.
    let mut socket = connect(&server, &format!("/v1/terminals/{}/ws", ids[0])).await;
    let mut seen = String::new();
    send(
        &mut socket,
        "echo \"in $PWD as $(id -u)\"; echo done-$((6 * 7))\n",
    )
    .await;
    read_until(&mut socket, &mut seen, "done-42").await;
    assert!(seen.contains("in /workspace"), "{seen}");

    let response = server
        .http
        .delete(format!("{}/v1/terminals/{}", server.url, ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let (status, _) = server.get(&format!("/v1/terminals/{}", ids[0])).await;
    assert_eq!(status, 404);
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = socket.next().await {
            if matches!(message, Message::Close(_)) {
                return true;
            }
        }
        true
    })
    .await
    .unwrap();
    assert!(closed);

    let (status, body) = server
        .post(
            "/v1/terminals",
            json!({"session_id": "01890a5d-ac96-774b-bcce-b302099a8057"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = server
        .post(
            "/v1/terminals",
            json!({"session_id": session, "command": []}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .post(
            "/v1/terminals",
            json!({"session_id": session, "shell": "zsh"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.get(&format!("/v1/terminals/{}/ws", ids[1])).await;
    assert_eq!(status, 400, "not a WebSocket upgrade: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("WebSocket"),
        "{body}"
    );

    let url = format!(
        "{}/v1/terminals/{}/ws",
        server.url.replacen("http", "ws", 1),
        ids[1]
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    let refused = tokio_tungstenite::connect_async(request).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 403)
        }
        other => panic!("a foreign origin was let in: {other:?}"),
    }
    server.close_sandboxes().await;
}

/// The seed's terminal socket: the session's one terminal (made on first use), its id first,
/// output as text frames, `{"__resize"}`; listed and deleted by the session's id.
#[tokio::test]
async fn the_seeds_terminal_socket() {
    let server = start_with_workspaces().await;
    let session = new_session(&server).await;
    let path = format!("/linglong/v1/terminals/ws?terminal_id={session}:auto&cols=100&rows=30");
    let mut socket = connect(&server, &path).await;
    let first = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let hello: Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
    let id = hello["__terminal_id"].as_str().unwrap().to_owned();
    socket
        .send(Message::Text(
            json!({"__resize": true, "cols": 101, "rows": 31})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    socket
        .send(Message::Text("stty size; echo seed-$((6 * 7))\n".into()))
        .await
        .unwrap();
    let mut seen = String::new();
    let wait = async {
        while !seen.contains("seed-42") {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => seen.push_str(&text),
                Some(Ok(Message::Binary(_))) => panic!("the seed's output is text"),
                Some(Ok(_)) => {}
                other => panic!("ended: {other:?} {seen}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), wait)
        .await
        .unwrap();
    assert!(seen.contains("31 101"), "{seen}");
    // The same session's socket attaches to the same terminal.
    let mut again = connect(&server, &path).await;
    let first = again.next().await.unwrap().unwrap();
    let hello: Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
    assert_eq!(hello["__terminal_id"], id.as_str());

    let (status, listed) = server.get("/linglong/v1/terminals").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["terminals"],
        json!([{"terminal_id": id, "session_id": session}]),
        "{listed}"
    );
    let response = server
        .http
        .delete(format!(
            "{}/linglong/v1/terminals/{session}:auto",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "deleted", "{body}");
    let (_, listed) = server.get("/linglong/v1/terminals").await;
    assert_eq!(listed["terminals"], json!([]), "{listed}");
    let (status, missing) = server.get("/linglong/v1/terminals/ws").await;
    assert_eq!(status, 400, "{missing}");
    server.close_sandboxes().await;
}

/// The agent's `terminal` tool runs on the same terminals: listed under its session, and a
/// person attaching sees what it ran and can type into it.
#[tokio::test]
async fn the_agents_terminal_is_listed_and_can_be_watched() {
    let server = start_with_workspaces().await;
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::tool_call(
            "terminal",
            json!({"input": "cd /tmp && echo agent-$((6 * 7))"}),
        ),
    ));
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::text("done"),
    ));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "work", "tool_ids": ["terminal"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let sent = server.mock.requests()[1].body.to_string();
    assert!(sent.contains("agent-42\\n[exit code 0]"), "{sent}");

    let (_, listed) = server
        .get(&format!("/v1/terminals?session_id={session}"))
        .await;
    let terminals = listed["terminals"].as_array().unwrap();
    assert_eq!(terminals.len(), 1, "{listed}");
    assert_eq!(terminals[0]["opened_by"], "agent");
    assert_eq!(terminals[0]["label"], "agent: main");
    let id = terminals[0]["terminal_id"].as_str().unwrap().to_owned();
    let mut socket = connect(&server, &format!("/v1/terminals/{id}/ws")).await;
    let mut seen = String::new();
    read_until(&mut socket, &mut seen, "agent-42").await;
    // A person's keystrokes go to the same shell (its directory is the agent's).
    send(&mut socket, "echo person-in-$PWD\n").await;
    read_until(&mut socket, &mut seen, "person-in-/tmp").await;
    server.close_sandboxes().await;
}

/// A plain GET of a terminal socket, as an `<img>` on any page sends it, opens nothing: the
/// upgrade is checked before the session's terminal is made (the second security review's N11).
#[tokio::test]
async fn a_plain_get_of_a_terminal_socket_starts_nothing() {
    let server = start_with_workspaces().await;
    let session = new_session(&server).await;
    for path in [
        format!("/linglong/v1/terminals/ws?terminal_id={session}&cols=80&rows=24"),
        format!("/v1/terminals/{session}/ws"),
    ] {
        let response = server
            .http
            .get(format!("{}{path}", server.url))
            .header("origin", "http://evil.example")
            .header("sec-fetch-site", "cross-site")
            .header("sec-fetch-dest", "image")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{path}");
    }
    let (status, listed) = server.get("/linglong/v1/terminals").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["terminals"],
        json!([]),
        "no terminal was started: {listed}"
    );
    server.close_sandboxes().await;
}
