//! Session routes over HTTP.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::json;

use super::support::start;

async fn session_with_turn(server: &super::support::Server, text: &str) -> String {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text(format!(
            "answer to {text}"
        ))));
    let (status, body) = server
        .post("/v1/infer", json!({"session_id": "new", "text": text}))
        .await;
    assert_eq!(status, 200, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn list_show_search_read_title_fork_delete() {
    let server = start().await;
    let first = session_with_turn(&server, "bananas").await;
    let second = session_with_turn(&server, "cherries").await;

    let (status, list) = server.get("/v1/sessions").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), first.as_str()], "newest first");
    assert_eq!(list["sessions"][0]["unread"], true);
    assert_eq!(list["sessions"][0]["title"], "cherries");

    let (_, hits) = server.get("/v1/sessions/search?q=BANANA").await;
    assert_eq!(hits["hits"].as_array().unwrap().len(), 1);
    assert_eq!(hits["hits"][0]["session_id"], first.as_str());

    let (status, _) = server
        .post(&format!("/v1/sessions/{first}/read"), json!({}))
        .await;
    assert_eq!(status, 204);
    let (_, shown) = server.get(&format!("/v1/sessions/{first}")).await;
    assert_eq!(shown["session"]["unread"], false);

    let (_, titled) = server
        .post(
            &format!("/v1/sessions/{first}/title"),
            json!({"title": "Fruit"}),
        )
        .await;
    assert_eq!(titled["title"], "Fruit");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("\"Cherry talk\"")));
    let (status, titled) = server
        .post(&format!("/v1/sessions/{second}/title"), json!({}))
        .await;
    assert_eq!(status, 200, "{titled}");
    assert_eq!(titled["title"], "Cherry talk");

    let (status, fork) = server
        .post(&format!("/v1/sessions/{first}/fork"), json!({"at_seq": 2}))
        .await;
    assert_eq!(status, 201, "{fork}");
    let fork_id = fork["session"]["id"].as_str().unwrap().to_owned();
    assert_eq!(fork["session"]["parent"]["id"], first.as_str());
    let (_, events) = server.get(&format!("/v1/sessions/{fork_id}/events")).await;
    assert_eq!(events["events"].as_array().unwrap().len(), 2);
    // Continue the fork: the model goes on from the shared history (a valid one).
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("continued")));
    let (status, _) = server
        .post(&format!("/v1/sessions/{fork_id}/continue"), json!({}))
        .await;
    assert_eq!(status, 202);
    let mut stream = server
        .sse(&format!("/v1/sessions/{fork_id}/stream"), None, Some(2))
        .await;
    let rest = stream.rest().await;
    assert_eq!(rest.last().unwrap().name, "run.finished");
    server.mock.check_protocol().unwrap();

    let (status, _) = server
        .raw(
            reqwest::Method::DELETE,
            &format!("/v1/sessions/{first}"),
            "",
        )
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get(&format!("/v1/sessions/{first}")).await;
    assert_eq!(status, 404);
    // The fork keeps the shared history.
    let (_, events) = server.get(&format!("/v1/sessions/{fork_id}/events")).await;
    assert!(events["events"].as_array().unwrap().len() >= 2);
}

#[tokio::test]
async fn bad_ids_and_queries_are_400_and_unknown_ones_404() {
    let server = start().await;
    for path in [
        "/v1/sessions/..%2F..%2Fx",
        "/v1/sessions/1700000000/events",
        "/v1/sessions/not-an-id/stream",
        "/v1/sessions?limit=0",
        "/v1/sessions?limit=abc",
        "/v1/sessions/search",
    ] {
        let (status, reply) = server.get(path).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert!(reply["error"]["message"].is_string());
    }
    let unknown = "01890a5d-ac96-774b-bcce-b302099a8057";
    let (status, _) = server.get(&format!("/v1/sessions/{unknown}")).await;
    assert_eq!(status, 404);
    let (status, _) = server
        .post(&format!("/v1/sessions/{unknown}/fork"), json!({}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .raw(
            reqwest::Method::DELETE,
            &format!("/v1/sessions/{unknown}"),
            "",
        )
        .await;
    assert_eq!(status, 404);
    let (_, list) = server.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn health_and_readiness() {
    let server = start().await;
    let (status, body) = server.get("/healthz").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    let (status, body) = server.get("/readyz").await;
    assert_eq!(status, 200);
    assert_eq!(body["database"], "sqlite");
    let (status, body) = server.get("/v1/infer").await;
    assert_eq!(status, 405);
    assert_eq!(body["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn optional_bodies_must_be_valid_json_when_present() {
    let server = start().await;
    let session = session_with_turn(&server, "plums").await;
    for body in ["null", "{bad", r#"{"at_seq": "two"}"#, r#"{"unknown": 1}"#] {
        let (status, reply) = server
            .raw(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/fork"),
                body,
            )
            .await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_request");
    }
    let (status, _) = server
        .raw(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/read"),
            "",
        )
        .await;
    assert_eq!(status, 204);
    let (status, reply) = server
        .raw(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/read"),
            r#"{"seq": 999}"#,
        )
        .await;
    assert_eq!(status, 400, "{reply}");
}

#[tokio::test]
async fn an_oversized_optional_body_is_a_json_413() {
    let server = start().await;
    let session = session_with_turn(&server, "figs").await;
    let huge = format!(
        r#"{{"at_seq": 1, "pad": "{}"}}"#,
        "x".repeat(5 * 1024 * 1024)
    );
    let (status, reply) = server
        .raw(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/fork"),
            &huge,
        )
        .await;
    assert_eq!(status, 413, "{reply}");
    assert_eq!(reply["error"]["code"], "request_too_large");
}

/// A new session is created by its run's first commit: a one-round run writes twice (the
/// session with the run's start, the answer with the run's end), and a streamed run's
/// `session` event comes once the session is there to read.
#[tokio::test]
async fn a_new_session_is_created_with_its_runs_first_commit() {
    let server = start().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi there.")));
    let before = server.state.app.parts().store.commit_counts();
    let (status, body) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "Hello"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let after = server.state.app.parts().store.commit_counts();
    assert_eq!(after.writes - before.writes, 2);
    let session = body["session_id"].as_str().unwrap();
    let (status, shown) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["session"]["title"], "Hello", "{shown}");
    assert_eq!(shown["session"]["status"], "idle", "{shown}");

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi again.")));
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(json!({"session_id": "new", "text": "Again"})),
            None,
        )
        .await;
    let intro = stream.next().await.unwrap();
    assert_eq!(intro.name, "session");
    let session = intro.data["session_id"].as_str().unwrap().to_owned();
    assert_eq!(stream.session.as_deref(), Some(session.as_str()));
    let (status, shown) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{shown}");
    let mut last = intro.name;
    while let Some(event) = stream.next().await {
        last = event.name;
    }
    assert_eq!(last, "run.finished");
}

/// A streamed run in a new session answers its headers once the session is stored, on
/// `/v1/infer/stream` (`x-session-id`) and on the OpenAI-compatible endpoint
/// (`x-agentry-session-id`): a client that reads the header and asks for the session at once
/// finds it. The database's write lock is held from outside while the request is sent, so the
/// run's first commit waits; the headers must wait with it.
#[tokio::test]
async fn a_streamed_run_names_its_new_session_once_the_session_is_stored() {
    let server = start().await;
    for (path, header, body, end) in [
        (
            "/v1/infer/stream",
            "x-session-id",
            json!({"session_id": "new", "text": "Hello"}),
            "event: run.finished",
        ),
        (
            "/openai/v1/chat/completions",
            "x-agentry-session-id",
            json!({"model": "mock", "stream": true,
                   "messages": [{"role": "user", "content": "Hello"}]}),
            "data: [DONE]",
        ),
    ] {
        let (mut lock, request) = send_while_locked(
            &server,
            server
                .http
                .post(format!("{}{path}", server.url))
                .header("x-agentry-session-id", "new")
                .json(&body),
        )
        .await;
        assert!(
            !request.is_finished(),
            "{path}: the headers came before the session was stored"
        );
        sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
        let response = request.await.unwrap().unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let session = response.headers()[header].to_str().unwrap().to_owned();
        let (status, shown) = server.get(&format!("/v1/sessions/{session}")).await;
        assert_eq!(status, 200, "{path}: {shown}");
        let text = response.text().await.unwrap();
        assert!(text.contains(end), "{path}: {text}");
        let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
        assert!(events.to_string().contains("Hi there."), "{path}: {events}");
    }
}

/// A client that goes away while its streamed run's new session is being stored leaves the run
/// going: the hub owns the run before the response waits for the session, so the run ends with
/// its answer, not cancelled.
#[tokio::test]
async fn a_client_gone_before_its_new_session_is_stored_leaves_the_run_going() {
    let server = start().await;
    let (mut lock, request) = send_while_locked(
        &server,
        server
            .http
            .post(format!("{}/v1/infer/stream", server.url))
            .json(&json!({"session_id": "new", "text": "Hello"})),
    )
    .await;
    // The client goes away (its connection closes) before any answer.
    request.abort();
    let _ = request.await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, list) = server.get("/v1/sessions").await;
        if let Some(session) = list["sessions"].as_array().unwrap().first() {
            let id = session["id"].as_str().unwrap();
            let (_, events) = server.get(&format!("/v1/sessions/{id}/events")).await;
            let text = events.to_string();
            if text.contains("run_finished") {
                assert!(text.contains("Hi there."), "{text}");
                assert!(!text.contains("\"cancelled\""), "{text}");
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not finish: {list}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Sends `request` (answered "Hi there." by the mock) while a second connection holds the
/// database's write lock ([`hold_write_lock`]), and gives it 300 ms: the lock and the request
/// in flight.
async fn send_while_locked(
    server: &super::support::Server,
    request: reqwest::RequestBuilder,
) -> (
    sqlx::SqliteConnection,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi there.")));
    let lock = hold_write_lock(server).await;
    let request = tokio::spawn(request.send());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    (lock, request)
}

/// A second connection to the server's SQLite database holding its write lock (until `COMMIT`
/// on it): the server's writes wait, its reads go on.
async fn hold_write_lock(server: &super::support::Server) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let database = server.home.path().join("agentry.db");
    let mut lock = sqlx::SqliteConnection::connect(&format!("sqlite://{}", database.display()))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    lock
}

/// Issue 48: a client posting turns to one session back to back over HTTP, each as soon as the
/// previous answer came, is never told the session is busy: an answer is returned only once
/// the session can take the next turn (a release build saw 4 of 1,500 turns get 409 before;
/// `agentry-core`'s `the_next_turn_sent_the_moment_a_run_ends_is_never_refused` reproduces
/// the race without HTTP and failed before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_turns_on_one_session_get_no_409() {
    let server = start().await;
    let session = session_with_turn(&server, "first").await;
    const TURNS: usize = 200;
    for n in 0..TURNS {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text(format!("answer {n}"))));
    }
    let mut busy = Vec::new();
    for n in 0..TURNS {
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"session_id": session, "text": format!("turn {n}")}),
            )
            .await;
        if status == 409 {
            busy.push(n);
            continue;
        }
        assert_eq!(status, 200, "turn {n}: {body}");
        assert_eq!(body["text"], format!("answer {n}"), "turn {n}");
    }
    assert!(busy.is_empty(), "turns told the session was busy: {busy:?}");
}

/// A run with no input goes on from its session's conversation; where there is none (a new
/// session, a fork taken before the first event) the request is a 400 naming what is missing,
/// not a 500, and nothing runs (found by the API fuzzer).
#[tokio::test]
async fn a_run_without_input_needs_a_conversation_to_go_on_from() {
    let server = start().await;
    let first = session_with_turn(&server, "Hello").await;
    let (status, fork) = server
        .post(&format!("/v1/sessions/{first}/fork"), json!({"at_seq": 0}))
        .await;
    assert_eq!(status, 201, "{fork}");
    let empty = fork["session"]["id"].as_str().unwrap().to_owned();
    let asked = server.mock.requests().len();
    for session in [empty.as_str(), "new"] {
        let (status, body) = server
            .post("/v1/infer", json!({"session_id": session}))
            .await;
        assert_eq!(status, 400, "{session}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no input"),
            "{body}"
        );
    }
    assert_eq!(server.mock.requests().len(), asked);
}
