//! A2A (`/a2a/{agent}`): the official `a2a-sdk` Python client reads a published agent's card,
//! sends messages whole (a second one continuing the same context) and streamed, gets a task,
//! answers an approval the task waits for (`input-required`), and cancels a running task;
//! an unpublished agent is not found, and malformed JSON-RPC gets its error codes. As a client:
//! a sample agent served by the `a2a-sdk`, registered as a model (`protocol: "a2a"`), is
//! reached from a run through `talk_to` and `delegate`.

use std::time::Duration;

use agentry_app::queue::QueueSettings;
use agentry_testkit::{Chunking, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start_with};

/// A server whose worker runs background runs (A2A tasks are background runs).
async fn start() -> Server {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(50),
        ..QueueSettings::default()
    });
    server.state.app.start_worker();
    server
}

async fn agent(server: &Server, body: Value) {
    let (status, answer) = server.post("/v1/agents", body).await;
    assert_eq!(status, 201, "{answer}");
}

const CLIENT: &str = r#"
import asyncio, json, sys
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types import (AgentCard, CancelTaskRequest, GetTaskRequest, ListTasksRequest, Role,
                       SendMessageConfiguration, SendMessageRequest, SubscribeToTaskRequest,
                       TaskState)

base = sys.argv[1]

def state(task):
    return TaskState.Name(task.status.state)

def user(text, **ids):
    return new_text_message(text, role=Role.ROLE_USER, **ids)

async def main():
    out = {}
    methods = set()

    async def record(request):
        if request.method == "POST":
            methods.add(json.loads(request.content)["method"])

    async with httpx.AsyncClient(timeout=60, event_hooks={"request": [record]}) as http:
        card = await A2ACardResolver(http, base + "/a2a/helper").get_agent_card()
        # Given only the server's address: the default agent's card, at the root.
        root = await A2ACardResolver(http, base).get_agent_card()
        out["root"] = [root.name, [i.url for i in root.supported_interfaces]]
        out["card"] = {
            "name": card.name,
            "description": card.description,
            "skills": [skill.id for skill in card.skills],
            "streaming": card.capabilities.streaming,
            "interfaces": [[i.protocol_binding, i.protocol_version, i.url]
                           for i in card.supported_interfaces],
        }
        whole = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        [first] = [event async for event in whole.send_message(SendMessageRequest(message=user("Hello")))]
        task = first.task
        [second] = [event async for event in whole.send_message(
            SendMessageRequest(message=user("Again", context_id=task.context_id)))]
        out["send"] = {
            "state": state(task),
            "answer": get_artifact_text(task.artifacts[0]),
            "same_context": second.task.context_id == task.context_id,
            "other_task": second.task.id != task.id,
            "second_answer": get_artifact_text(second.task.artifacts[0]),
        }
        got = await whole.get_task(GetTaskRequest(id=task.id))
        out["get"] = {
            "state": state(got),
            "history": [[Role.Name(m.role), get_message_text(m)] for m in got.history],
        }
        try:
            await whole.get_task(GetTaskRequest(id="01a2b3c4-0000-7000-8000-000000000000"))
            out["missing"] = None
        except Exception as error:
            out["missing"] = type(error).__name__

        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        # A streaming method on an unknown task: the typed error, from the stream.
        try:
            async for _ in streaming.subscribe(
                    SubscribeToTaskRequest(id="01a2b3c4-0000-7000-8000-000000000000")):
                pass
            out["missing_stream"] = None
        except Exception as error:
            out["missing_stream"] = type(error).__name__
        kinds, text, states = [], "", []
        async for event in streaming.send_message(SendMessageRequest(message=user("Stream it"))):
            kind = event.WhichOneof("payload")
            kinds.append(kind)
            if kind == "artifact_update":
                piece = get_artifact_text(event.artifact_update.artifact)
                text = text + piece if event.artifact_update.append else piece
            elif kind == "status_update":
                states.append(TaskState.Name(event.status_update.status.state))
            elif kind == "task":
                states.append(state(event.task))
        out["stream"] = {"first": kinds[0], "last": kinds[-1], "text": text, "states": states,
                         "chunks": kinds.count("artifact_update")}

        guarded_card = await A2ACardResolver(http, base + "/a2a/guarded").get_agent_card()
        guarded = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(guarded_card)
        [asked] = [event async for event in guarded.send_message(SendMessageRequest(message=user("Echo hi")))]
        waiting = asked.task
        [answered] = [event async for event in guarded.send_message(
            SendMessageRequest(message=user("approve", task_id=waiting.id, context_id=waiting.context_id)))]
        out["approval"] = {
            "waiting": state(waiting),
            "asks": get_message_text(waiting.status.message),
            "after": state(answered.task),
            "answer": get_artifact_text(answered.task.artifacts[0]),
            "same_task": answered.task.id == waiting.id,
        }

        sleeper_card = await A2ACardResolver(http, base + "/a2a/sleeper").get_agent_card()
        sleeper = ClientFactory(ClientConfig(streaming=False, polling=True, httpx_client=http)).create(sleeper_card)
        [started] = [event async for event in sleeper.send_message(SendMessageRequest(message=user("Take long")))]
        for _ in range(100):
            now = await sleeper.get_task(GetTaskRequest(id=started.task.id))
            if state(now) == "TASK_STATE_WORKING":
                break
            await asyncio.sleep(0.05)
        cancelled = await sleeper.cancel_task(CancelTaskRequest(id=started.task.id))
        try:
            await sleeper.cancel_task(CancelTaskRequest(id=started.task.id))
            again = None
        except Exception as error:
            again = type(error).__name__
        out["cancel"] = {"started": state(started.task), "before": state(now),
                         "after": state(cancelled), "again": again}

        # The helper's three tasks, two a page; those of the first conversation that completed.
        first_page = await whole.list_tasks(ListTasksRequest(page_size=2))
        second_page = await whole.list_tasks(
            ListTasksRequest(page_size=2, page_token=first_page.next_page_token))
        in_context = await whole.list_tasks(ListTasksRequest(
            context_id=task.context_id, status=TaskState.TASK_STATE_COMPLETED,
            include_artifacts=True))
        listed = list(first_page.tasks) + list(second_page.tasks)
        out["list"] = {
            "total": first_page.total_size, "page_size": first_page.page_size,
            "pages": [len(first_page.tasks), len(second_page.tasks)],
            "more": [bool(first_page.next_page_token), bool(second_page.next_page_token)],
            "distinct": len({t.id for t in listed}),
            "artifacts": sum(len(t.artifacts) for t in listed),
            "context": sorted(get_artifact_text(t.artifacts[0]) for t in in_context.tasks),
        }

        # The same agent over A2A 0.3: a card offering only that interface.
        old = AgentCard()
        old.CopyFrom(card)
        del old.supported_interfaces[:]
        old.supported_interfaces.extend(
            [i for i in card.supported_interfaces if i.protocol_version == "0.3"])
        legacy = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(old)
        [reply] = [event async for event in legacy.send_message(SendMessageRequest(message=user("Over 0.3?")))]
        out["v03"] = [state(reply.task), get_artifact_text(reply.task.artifacts[0])]
        out["methods"] = sorted(methods)
    print(json.dumps(out))

asyncio.run(main())
"#;

#[tokio::test]
async fn the_official_a2a_client_sends_streams_gets_approves_and_cancels() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has the a2a-sdk client");
    };
    let server = start().await;
    agent(
        &server,
        json!({"id": "helper", "nickname": "Helper", "model_id": "mock", "labels": ["general"],
               "a2a": {"description": "Answers questions.", "default": true}}),
    )
    .await;
    server.add_echo_tool().await;
    agent(
        &server,
        json!({"id": "guarded", "model_id": "mock", "tool_ids": ["echo"],
               "approvals": {"tools": {"echo": "always"}}, "a2a": {}}),
    )
    .await;
    agent(
        &server,
        json!({"id": "sleeper", "model_id": "mock", "a2a": {}}),
    )
    .await;
    // One default agent at most.
    let (status, refused) = server
        .post(
            "/v1/agents",
            json!({"id": "second", "model_id": "mock", "a2a": {"default": true}}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    let mock = &server.mock;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello from Agentry.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello again.")));
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("one two three four five"))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(30)),
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "hi"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("echoed")));
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("too late")).delay_headers(Duration::from_secs(20)),
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Over 0.3.")));
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(servers.python())
            .args(["-c", CLIENT, &server.url])
            .output(),
    )
    .await
    .expect("the client finishes")
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    let endpoint = format!("{}/a2a/helper", server.url);
    assert_eq!(
        out["card"],
        json!({"name": "Helper", "description": "Answers questions.", "skills": ["helper"],
               "streaming": true,
               "interfaces": [["JSONRPC", "1.0", endpoint], ["JSONRPC", "0.3", endpoint]]}),
        "{out}"
    );
    assert_eq!(
        out["root"],
        json!(["Helper", [endpoint, endpoint]]),
        "{out}"
    );
    // A2A 1.0 by default (the client prefers it), 0.3 when that is all a card offers.
    assert_eq!(
        out["methods"],
        json!([
            "CancelTask",
            "GetTask",
            "ListTasks",
            "SendMessage",
            "SendStreamingMessage",
            "SubscribeToTask",
            "message/send"
        ]),
        "{out}"
    );
    assert_eq!(
        out["v03"],
        json!(["TASK_STATE_COMPLETED", "Over 0.3."]),
        "{out}"
    );
    assert_eq!(
        out["send"],
        json!({"state": "TASK_STATE_COMPLETED", "answer": "Hello from Agentry.",
               "same_context": true, "other_task": true, "second_answer": "Hello again."}),
        "{out}"
    );
    assert_eq!(
        out["get"],
        json!({"state": "TASK_STATE_COMPLETED",
               "history": [["ROLE_USER", "Hello"], ["ROLE_AGENT", "Hello from Agentry."]]}),
        "{out}"
    );
    assert_eq!(out["missing"], "TaskNotFoundError", "{out}");
    // `ListTasks` pages (issue 48: it was method-not-found): artifacts only when asked for.
    assert_eq!(
        out["list"],
        json!({"total": 3, "page_size": 2, "pages": [2, 1], "more": [true, false],
               "distinct": 3, "artifacts": 0,
               "context": ["Hello again.", "Hello from Agentry."]}),
        "{out}"
    );
    // Issue 48: streaming methods' errors come as the stream's event (an `application/json`
    // answer made the client fail on the content type).
    assert_eq!(out["missing_stream"], "TaskNotFoundError", "{out}");
    let stream = &out["stream"];
    assert_eq!(stream["first"], "task", "{out}");
    assert_eq!(stream["last"], "status_update", "{out}");
    assert_eq!(stream["text"], "one two three four five", "{out}");
    assert!(stream["chunks"].as_u64().unwrap() >= 3, "{out}");
    let states = stream["states"].as_array().unwrap();
    assert_eq!(
        states.first(),
        Some(&json!("TASK_STATE_SUBMITTED")),
        "{out}"
    );
    assert_eq!(states.last(), Some(&json!("TASK_STATE_COMPLETED")), "{out}");
    let approval = &out["approval"];
    assert_eq!(approval["waiting"], "TASK_STATE_INPUT_REQUIRED", "{out}");
    assert!(approval["asks"].as_str().unwrap().contains("echo"), "{out}");
    assert_eq!(approval["after"], "TASK_STATE_COMPLETED", "{out}");
    assert_eq!(approval["answer"], "echoed", "{out}");
    assert_eq!(approval["same_task"], true, "{out}");
    assert_eq!(
        out["cancel"],
        json!({"started": "TASK_STATE_SUBMITTED", "before": "TASK_STATE_WORKING",
               "after": "TASK_STATE_CANCELED", "again": "TaskNotCancelableError"}),
        "{out}"
    );
    // The approved call ran once; the model saw its result.
    let requests = server.mock.requests();
    assert!(
        requests
            .iter()
            .any(|request| request.body.to_string().contains("hi")),
        "{requests:?}"
    );
}

/// A JSON-RPC call to `/a2a/{agent}` with a raw body.
async fn call(server: &Server, agent: &str, body: &str) -> (u16, Value) {
    let response = server
        .http
        .post(format!("{}/a2a/{agent}", server.url))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn bad_json_rpc_and_unpublished_agents_are_refused_with_their_codes() {
    let server = start().await;
    agent(&server, json!({"id": "private", "model_id": "mock"})).await;
    agent(
        &server,
        json!({"id": "public", "model_id": "mock", "a2a": {}}),
    )
    .await;
    // An agent that is not published has no card and no endpoint.
    let card = server
        .http
        .get(format!(
            "{}/a2a/private/.well-known/agent-card.json",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(card.status().as_u16(), 404);
    let (status, _) = call(
        &server,
        "private",
        r#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}}"#,
    )
    .await;
    assert_eq!(status, 404);
    let message = |extra: &str| {
        format!(
            r#"{{"jsonrpc": "2.0", "id": "r1", "method": "message/send", "params": {{"message":
               {{"role": "user", "messageId": "m1", "parts": [{{"kind": "text", "text": "hi"}}]{extra}}}}}}}"#
        )
    };
    for (body, code) in [
        ("{not json".to_owned(), -32700),
        ("[1, 2]".to_owned(), -32600),
        (r#"{"id": 1, "method": "tasks/get"}"#.to_owned(), -32600),
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/fly"}"#.to_owned(), -32601),
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {}}"#.to_owned(), -32602),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {}}}"#
                .to_owned(),
            -32602,
        ),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}"#
                .to_owned(),
            -32001,
        ),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/set", "params": {}}"#
                .to_owned(),
            -32003,
        ),
        (message(r#", "contextId": "not-a-session""#), -32602),
        (message(r#", "taskId": "01a2b3c4-0000-7000-8000-000000000000""#), -32001),
        (
            message("").replace(
                r#"{"kind": "text", "text": "hi"}"#,
                r#"{"kind": "file", "file": {"uri": "http://x/y"}}"#,
            ),
            -32005,
        ),
    ] {
        let (status, answer) = call(&server, "public", &body).await;
        assert_eq!(status, 200, "{body}: {answer}");
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        assert!(answer["result"].is_null(), "{answer}");
    }
    // A streaming method's error is its stream's one event, as the reference server sends it.
    for body in [
        r#"{"jsonrpc": "2.0", "id": 9, "method": "tasks/resubscribe", "params": {"id": "nope"}}"#
            .to_owned(),
        message("")
            .replace("message/send", "message/stream")
            .replace(
                r#"{"kind": "text", "text": "hi"}"#,
                r#"{"kind": "file", "file": {"uri": "http://x/y"}}"#,
            ),
    ] {
        let response = server
            .http
            .post(format!("{}/a2a/public", server.url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream"),
            "{body}: {:?}",
            response.headers()
        );
        let text = response.text().await.unwrap();
        let data = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no event: {text}"));
        let event: Value = serde_json::from_str(data).unwrap();
        assert!(event["error"]["code"].is_i64(), "{event}");
        assert!(event["result"].is_null(), "{event}");
    }
    // Nothing was started by any of them.
    let (_, runs) = server.get("/v1/runs").await;
    assert_eq!(runs["runs"], json!([]), "{runs}");
    assert!(server.mock.requests().is_empty());
}

/// A sample A2A agent on the `a2a-sdk` server: it streams its answer, the user's text shouted,
/// word by word; it remembers how many messages each context sent it. Its second argument says
/// which versions it speaks and its card lists: `both` (1.0 with 0.3 compatibility), `1.0` or
/// `0.3` (the 0.3 compatibility layer, a card naming 0.3 only).
const REMOTE_AGENT: &str = r#"
import sys, uvicorn
from starlette.applications import Starlette
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

port = int(sys.argv[1])
versions = sys.argv[2]
url = f"http://127.0.0.1:{port}/"

seen = {}

class Shouter(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task or new_task_from_user_message(context.message)
        if context.current_task is None:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        seen[task.context_id] = seen.get(task.context_id, 0) + 1
        said = context.get_user_input().splitlines()[-1]
        words = (f"REMOTE SAYS ({seen[task.context_id]}) " + said.upper()).split(" ")
        for index, word in enumerate(words):
            await updater.add_artifact([new_text_part(word + (" " if index + 1 < len(words) else ""))],
                                       artifact_id="answer", append=index > 0,
                                       last_chunk=index + 1 == len(words))
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise Exception("cannot cancel")

card = AgentCard(
    name="Shouter", description="Repeats what it is told, loudly.", version="1.0.0",
    supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version=version, url=url)
                          for version in (["0.3", "1.0"] if versions == "both" else [versions])],
    capabilities=AgentCapabilities(streaming=True),
    default_input_modes=["text/plain"], default_output_modes=["text/plain"],
    skills=[AgentSkill(id="shout", name="Shout", description="Shouts", tags=["echo"])],
)
handler = DefaultRequestHandler(agent_executor=Shouter(), task_store=InMemoryTaskStore(), agent_card=card)
app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/", enable_v0_3_compat=versions != "1.0"))
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"#;

/// The sample remote agent speaking `versions`, started and answering its card: the process and
/// the card.
async fn remote_agent(versions: &str) -> (tokio::process::Child, Value, String) {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has the a2a-sdk server");
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut remote = tokio::process::Command::new(servers.python())
        .args(["-c", REMOTE_AGENT, &port.to_string(), versions])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}/");
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let card: Value = loop {
        if let Ok(response) = http
            .get(format!("{endpoint}.well-known/agent-card.json"))
            .send()
            .await
        {
            break response.json().await.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the remote agent did not start"
        );
        assert!(
            remote.try_wait().unwrap().is_none(),
            "the remote agent exited"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(card["name"], "Shouter");
    (remote, card, endpoint)
}

/// The remote agent at `endpoint`, registered as the model `shouter`.
async fn register_remote(server: &Server, endpoint: &str) {
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "shouter", "protocol": "a2a", "base_url": endpoint, "model_name": "shouter"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// A client that speaks only 1.0 (the `a2a-sdk` server without its 0.3 layer answers 0.3's
/// `message/stream` with "method not found") and one whose card names only 0.3 are both
/// reached: the card says which version to speak, over two turns in one remote context.
#[tokio::test]
async fn a_remote_agent_is_reached_in_the_a2a_version_its_card_names() {
    for versions in ["1.0", "0.3"] {
        let (mut remote, card, endpoint) = remote_agent(versions).await;
        assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], versions);
        let server = start().await;
        register_remote(&server, &endpoint).await;
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"session_id": "new", "model_id": "shouter", "text": "hello"}),
            )
            .await;
        assert_eq!(status, 200, "{versions}: {body}");
        assert_eq!(body["text"], "REMOTE SAYS (1) HELLO", "{versions}: {body}");
        // The same context next turn.
        let session = body["session_id"].as_str().unwrap().to_owned();
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"session_id": session, "model_id": "shouter", "text": "again"}),
            )
            .await;
        assert_eq!(status, 200, "{versions}: {body}");
        assert_eq!(body["text"], "REMOTE SAYS (2) AGAIN", "{versions}: {body}");
        remote.start_kill().unwrap();
    }
}

#[tokio::test]
async fn a_remote_a2a_agent_is_reached_through_talk_to_and_delegate() {
    let (mut remote, _, endpoint) = remote_agent("both").await;
    let server = start().await;
    register_remote(&server, &endpoint).await;
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "nowhere", "protocol": "a2a", "model_name": "x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("base_url"), "{body}");
    agent(
        &server,
        json!({"id": "boss", "model_id": "mock", "tool_ids": ["talk_to", "delegate"]}),
    )
    .await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "talk_to",
        json!({"agents": ["shouter"], "message": "hello there"}),
    )));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "whisper this", "agent": "shouter"}),
    )));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "The remote agent answered twice.",
    )));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "boss", "text": "Ask the shouter."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "The remote agent answered twice.");
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    let talked = requests[1].body.to_string();
    assert!(talked.contains("REMOTE SAYS (1) HELLO THERE"), "{talked}");
    let delegated = requests[2].body.to_string();
    assert!(
        delegated.contains("REMOTE SAYS (1) WHISPER THIS"),
        "{delegated}"
    );
    // Each child session holds the remote agent's answer, and its context for a next turn.
    let parent = body["session_id"].as_str().unwrap();
    let (_, shown) = server.get(&format!("/v1/sessions/{parent}")).await;
    let children = shown["children"].as_array().unwrap();
    assert_eq!(children.len(), 2, "{shown}");
    let child = children[0]["session_id"].as_str().unwrap();
    let (_, events) = server.get(&format!("/v1/sessions/{child}/events")).await;
    let answer = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["event"]["type"] == "assistant_message")
        .unwrap_or_else(|| panic!("{events}"))
        .to_string();
    assert!(answer.contains("REMOTE SAYS (1) HELLO THERE"), "{answer}");
    assert!(answer.contains("a2a-context:"), "{answer}");
    // The child conversation goes on in the remote agent's context: it counts a second
    // message there.
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": child, "model_id": "shouter", "text": "and again"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "REMOTE SAYS (2) AND AGAIN", "{body}");
    remote.start_kill().unwrap();
}
