//! The OpenAI-compatible API (`/openai/v1`): OpenAI's official Python client lists the models
//! and agents, completes chats whole and streamed (an agent's own tool running inside), runs a
//! tool of its own through a `tool_calls` round trip (whole and streamed), and gets
//! OpenAI-shaped errors; the `openai-agents` SDK uses Agentry as its model with a function tool
//! of its own; the Responses API holds a stored conversation (three turns, one streamed, across
//! a restart) and a `store: false` one keeps nothing; a session named in `x-agentry-session-id` continues across calls;
//! bad requests are refused before anything runs.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start};

/// Runs `script` with the test venv's Python and the server's `url`: what it printed, as JSON
/// (it must succeed).
async fn python(servers: &agentry_testkit::mcp::McpServers, script: &str, url: &str) -> Value {
    let output = tokio::process::Command::new(servers.python())
        .args(["-c", script, url])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A saved agent `helper` on the mock model, with the `slow` command tool.
async fn helper(server: &Server) {
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "helper", "model_id": "mock", "tool_ids": ["slow"],
                   "system": "You help."}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

const CLIENT: &str = r#"
import json, sys
import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
out = {"models": sorted(m.id for m in client.models.list())}

whole = client.chat.completions.create(
    model="mock",
    messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    temperature=0.2,
)
out["whole"] = {
    "text": whole.choices[0].message.content,
    "role": whole.choices[0].message.role,
    "finish": whole.choices[0].finish_reason,
    "object": whole.object,
    "total": whole.usage.total_tokens,
}

text, finish, usage, roles = "", None, None, []
for chunk in client.chat.completions.create(
    model="agent:helper",
    messages=[{"role": "user", "content": "Use your tool."}],
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage.total_tokens
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            text += choice.delta.content
        if choice.finish_reason:
            finish = choice.finish_reason
out["streamed"] = {"text": text, "finish": finish, "usage": usage, "roles": roles}

tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ask = [{"role": "user", "content": "Weather in Paris?"}]
first = client.chat.completions.create(model="mock", messages=ask, tools=tools)
call = first.choices[0].message.tool_calls[0]
second = client.chat.completions.create(
    model="mock",
    messages=ask + [first.choices[0].message,
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}],
    tools=tools,
)
out["client_tool"] = {
    "finish": first.choices[0].finish_reason,
    "name": call.function.name,
    "arguments": json.loads(call.function.arguments),
    "answer": second.choices[0].message.content,
    "answer_finish": second.choices[0].finish_reason,
}
calls, finish = {}, None
for chunk in client.chat.completions.create(model="mock", messages=ask, tools=tools, stream=True):
    for choice in chunk.choices:
        for piece in choice.delta.tool_calls or []:
            entry = calls.setdefault(piece.index, {"name": None, "arguments": ""})
            if piece.function.name:
                entry["name"] = piece.function.name
            entry["arguments"] += piece.function.arguments or ""
        if choice.finish_reason:
            finish = choice.finish_reason
out["client_tool_streamed"] = {
    "finish": finish,
    "calls": [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls.values()],
}

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    out["missing"] = None
except openai.NotFoundError as error:
    out["missing"] = {"status": error.status_code, "code": error.code, "type": error.type}

print(json.dumps(out))
"#;

#[tokio::test]
async fn the_official_openai_client_completes_chats_with_models_and_agents() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has the openai client");
    };
    let server = start().await;
    helper(&server).await;
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("Hello!").with_usage(12, 3),
    ));
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("slow", json!({})).with_usage(20, 5),
    ));
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("The tool slept.").with_usage(30, 4),
    ));
    // A tool the client runs: asked for, answered by the client, then the answer; and once more
    // streamed.
    let weather = || {
        Reply::scripted(ScriptedTurn::tool_call(
            "get_weather",
            json!({"city": "Paris"}),
        ))
    };
    server.mock.enqueue(weather());
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("It is sunny in Paris.")));
    server.mock.enqueue(weather());
    let out = python(&servers, CLIENT, &server.url).await;
    assert_eq!(out["models"], json!(["agent:helper", "mock"]), "{out}");
    assert_eq!(
        out["whole"],
        json!({"text": "Hello!", "role": "assistant", "finish": "stop",
               "object": "chat.completion", "total": 15}),
        "{out}"
    );
    // The agent's tool ran inside Agentry; only the answer came back.
    assert_eq!(
        out["streamed"],
        json!({"text": "The tool slept.", "finish": "stop", "usage": 59, "roles": ["assistant"]}),
        "{out}"
    );
    assert_eq!(
        out["client_tool"],
        json!({"finish": "tool_calls", "name": "get_weather", "arguments": {"city": "Paris"},
               "answer": "It is sunny in Paris.", "answer_finish": "stop"}),
        "{out}"
    );
    assert_eq!(
        out["client_tool_streamed"],
        json!({"finish": "tool_calls",
               "calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}),
        "{out}"
    );
    assert_eq!(
        out["missing"],
        json!({"status": 404, "code": "model_not_found", "type": "invalid_request_error"}),
        "{out}"
    );
    let requests = server.mock.requests();
    // The developer message became the system prompt; the tool result went back to the model.
    assert!(requests[0].body.to_string().contains("Be brief."));
    assert!(
        requests[2].body.to_string().contains("slept"),
        "{}",
        requests[2].body
    );
    // The client's tool was offered to the model, and its result sent back to it.
    assert!(requests[3].body.to_string().contains("get_weather"));
    assert!(
        requests[4].body.to_string().contains("sunny, 21 C"),
        "{}",
        requests[4].body
    );
}

#[tokio::test]
async fn a_named_session_continues_across_calls() {
    let server = start().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("First answer.")));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Second answer.")));
    let call = |session: &str, text: &str| {
        server
            .http
            .post(format!("{}/openai/v1/chat/completions", server.url))
            .header("x-agentry-session-id", session)
            .json(&json!({"model": "mock", "messages": [{"role": "user", "content": text}]}))
            .send()
    };
    let first = call("new", "one").await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let session = first.headers()["x-agentry-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "First answer.");
    let second = call(&session, "two").await.unwrap();
    assert_eq!(second.status().as_u16(), 200);
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "Second answer.");
    // The second call's model saw the first exchange, from the session.
    let sent = server.mock.requests()[1].body.to_string();
    assert!(
        sent.contains("First answer.") && sent.contains("one"),
        "{sent}"
    );
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    assert!(events.to_string().contains("Second answer."));
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_run_nothing() {
    let server = start().await;
    let user = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (json!({"model": "mock", "messages": user, "n": 2}), 400, "n"),
        (
            json!({"model": "mock", "messages": user, "tools": [{"type": "retrieval"}]}),
            400,
            "tools[0]",
        ),
        (
            json!({"model": "mock", "messages": user,
                   "tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            400,
            "tools[0]",
        ),
        (json!({"model": "mock", "messages": []}), 400, "messages"),
        (
            json!({"model": "mock", "messages": [{"role": "tool", "tool_call_id": "nope", "content": "r"}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "agent:ghost", "messages": user}),
            404,
            "model",
        ),
        (
            json!({"model": "mock", "messages": user, "stop": 7}),
            400,
            "stop",
        ),
    ];
    for (body, status, param) in cases {
        let (got, answer) = server
            .post("/openai/v1/chat/completions", body.clone())
            .await;
        assert_eq!(got, status, "{body} → {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(answer["error"]["type"].is_string(), "{answer}");
    }
    let (got, answer) = server
        .raw(
            reqwest::Method::POST,
            "/openai/v1/chat/completions",
            "{not json",
        )
        .await;
    assert_eq!(got, 400, "{answer}");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert_eq!(server.mock.request_count(), 0, "nothing ran");
}

const AGENTS_SDK: &str = r#"
import json, sys
from openai import AsyncOpenAI
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
calls = []

@function_tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    calls.append([a, b])
    return a + b

client = AsyncOpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
agent = Agent(
    name="calculator",
    instructions="Use the add tool for sums.",
    model=OpenAIChatCompletionsModel(model="mock", openai_client=client),
    tools=[add],
)
result = Runner.run_sync(agent, "What is 2 + 3?")
print(json.dumps({"final": result.final_output, "calls": calls}))
"#;

#[tokio::test]
async fn the_openai_agents_sdk_runs_its_own_function_tool_through_agentry() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has openai-agents");
    };
    let server = start().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "add",
        json!({"a": 2, "b": 3}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("2 + 3 = 5")));
    let out = python(&servers, AGENTS_SDK, &server.url).await;
    // The SDK ran its tool locally, once, and Agentry's model saw the result.
    assert_eq!(out, json!({"final": "2 + 3 = 5", "calls": [[2, 3]]}));
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].body.to_string().contains("\"add\""));
    assert!(requests[0].body.to_string().contains("Use the add tool"));
    let second = requests[1].body.to_string();
    assert!(
        second.contains("\"role\":\"tool\"") && second.contains('5'),
        "{second}"
    );
}

const RESPONSES: &str = r#"
import json, sys
import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
first = client.responses.create(model="mock", instructions="Be brief.", input="My name is Ada.")
second = client.responses.create(model="mock", input="What is my name?",
                                 previous_response_id=first.id)
got = client.responses.retrieve(second.id)
streamed, completed = "", None
for event in client.responses.create(model="mock", input="Stream it.",
                                     previous_response_id=second.id, stream=True):
    if event.type == "response.output_text.delta":
        streamed += event.delta
    if event.type == "response.completed":
        completed = event.response
loose = client.responses.create(model="mock", input=[{"role": "user", "content": "hi"}],
                                store=False)
try:
    client.responses.retrieve(loose.id)
    kept = True
except openai.NotFoundError:
    kept = False
print(json.dumps({
    "first": first.output_text, "second": second.output_text,
    "got": got.output_text, "got_previous": got.previous_response_id,
    "second_id": second.id, "streamed": streamed,
    "completed": completed.output_text, "completed_id": completed.id,
    "completed_tokens": completed.usage.total_tokens,
    "loose": loose.output_text, "loose_kept": kept,
}))
"#;

const RESPONSES_AFTER_RESTART: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
after = client.responses.create(model="mock", input="Still there?",
                                previous_response_id=sys.argv[2])
print(json.dumps({"text": after.output_text, "previous": after.previous_response_id}))
"#;

#[tokio::test]
async fn the_official_client_holds_a_conversation_through_the_responses_api_across_a_restart() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has the openai client");
    };
    let server = start().await;
    for text in ["Hello, Ada.", "Your name is Ada."] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text(text)));
    }
    server.mock.enqueue(
        Reply::scripted(ScriptedTurn::text("Streaming works fine.").with_usage(10, 4))
            .chunked(agentry_testkit::Chunking::SseEvents),
    );
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Stateless.")));
    let python = |script: &'static str, args: Vec<String>| {
        let python = servers.python();
        async move {
            let output = tokio::process::Command::new(python)
                .args(["-c", script])
                .args(args)
                .output()
                .await
                .unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            serde_json::from_slice::<Value>(&output.stdout).unwrap()
        }
    };
    let out = python(RESPONSES, vec![server.url.clone()]).await;
    assert_eq!(out["first"], "Hello, Ada.", "{out}");
    assert_eq!(out["second"], "Your name is Ada.", "{out}");
    assert_eq!(out["got"], "Your name is Ada.", "{out}");
    assert!(out["got_previous"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(out["streamed"], "Streaming works fine.", "{out}");
    assert_eq!(out["completed"], "Streaming works fine.", "{out}");
    assert_eq!(out["completed_tokens"], 14, "{out}");
    assert_eq!(out["loose"], "Stateless.", "{out}");
    assert_eq!(
        out["loose_kept"], false,
        "store: false keeps nothing: {out}"
    );
    // Each stored turn's model saw the turns before it, from the session.
    let requests = server.mock.requests();
    let second = requests[1].body.to_string();
    assert!(
        second.contains("My name is Ada.") && second.contains("Hello, Ada."),
        "{second}"
    );
    assert!(second.contains("Be brief."), "{second}");
    // Another server on the same data (a restart) continues the conversation.
    let store = agentry_store::Store::open_home(server.home.path())
        .await
        .unwrap();
    let state = agentry_server::AppState::new(store).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = agentry_server::router(state);
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service())
            .await
            .unwrap();
    });
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Still here, Ada.")));
    let last = out["completed_id"].as_str().unwrap().to_owned();
    let after = python(RESPONSES_AFTER_RESTART, vec![url, last.clone()]).await;
    assert_eq!(
        after,
        json!({"text": "Still here, Ada.", "previous": last}),
        "{after}"
    );
    let sent = server.mock.requests().last().unwrap().body.to_string();
    assert!(
        sent.contains("My name is Ada.") && sent.contains("Streaming works fine."),
        "{sent}"
    );
}

const RESPONSES_HELPERS: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
add = {"type": "function", "name": "add", "description": "Adds two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                      "b": {"type": "integer"}}, "required": ["a", "b"]}}
out = {}

# 1. The stream helper on an answer with reasoning: events, text, the final response.
with client.responses.stream(model="mock", input="Think, then answer.") as stream:
    kinds, text = [], ""
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    final = stream.get_final_response()
out["stream"] = {"text": text, "final": final.output_text,
                 "types": [item.type for item in final.output],
                 "reasoning": final.output[0].summary[0].text,
                 "kinds": sorted(set(kinds))}

# 2. A client tool with the default store: a call, then its result with the whole input.
first = client.responses.create(model="mock", input="What is 2 + 3?", tools=[add])
call = [item for item in first.output if item.type == "function_call"][0]
inputs = [{"role": "user", "content": "What is 2 + 3?"}] + [item.model_dump() for item in first.output]
inputs.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
second = client.responses.create(model="mock", input=inputs, tools=[add])
out["whole_input"] = {"call": [call.name, json.loads(call.arguments)], "answer": second.output_text}

# 3. The same through previous_response_id: only the tool's result is sent.
third = client.responses.create(model="mock", input="And 4 + 4?", tools=[add])
call = [item for item in third.output if item.type == "function_call"][0]
fourth = client.responses.create(model="mock", previous_response_id=third.id, tools=[add],
                                 input=[{"type": "function_call_output",
                                         "call_id": call.call_id, "output": "8"}])
out["previous"] = fourth.output_text

# 4. store: false with a reasoning item sent back as it came (what to_input_list() does).
loose = client.responses.create(model="mock", input="Think and call.", tools=[add], store=False)
inputs = [{"role": "user", "content": "Think and call."}] + [item.model_dump() for item in loose.output]
call = [item for item in loose.output if item.type == "function_call"][0]
inputs.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
again = client.responses.create(model="mock", input=inputs, tools=[add], store=False)
out["loose"] = {"types": [item.type for item in loose.output], "answer": again.output_text}

# 5. The stream helper on a call of a client tool.
with client.responses.stream(model="mock", input="Stream a call.", tools=[add]) as stream:
    kinds = [event.type for event in stream]
    final = stream.get_final_response()
calls = [item for item in final.output if item.type == "function_call"]
out["stream_call"] = {"name": calls[0].name, "arguments": json.loads(calls[0].arguments),
                      "done": "response.function_call_arguments.done" in kinds}
print(json.dumps(out))
"#;

/// Issue 48: the official SDK's Responses helpers — `responses.stream()` (reasoning, text, a
/// client tool's call), client tools with the default `store` (the whole input sent back, or
/// `previous_response_id` and the tool's result) and with `store: false` (a reasoning item sent
/// back as it came).
#[tokio::test]
async fn the_official_sdks_responses_helpers_stream_and_run_client_tools() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has the openai client");
    };
    let server = start().await;
    let mock = &server.mock;
    let sse = agentry_testkit::Chunking::SseEvents;
    // 1
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("Five.").with_thinking("Two and three.", "sig"))
            .chunked(sse.clone()),
    );
    // 2
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "add",
        json!({"a": 2, "b": 3}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("2 + 3 = 5")));
    // 3
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "add",
        json!({"a": 4, "b": 4}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("4 + 4 = 8")));
    // 4
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("add", json!({"a": 1, "b": 2})).with_thinking("Use add.", "sig"),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("1 + 2 = 3")));
    // 5
    mock.enqueue(
        Reply::scripted(ScriptedTurn::tool_call("add", json!({"a": 6, "b": 1}))).chunked(sse),
    );
    let out = python(&servers, RESPONSES_HELPERS, &server.url).await;
    assert_eq!(out["stream"]["text"], "Five.", "{out}");
    assert_eq!(out["stream"]["final"], "Five.", "{out}");
    assert_eq!(
        out["stream"]["types"],
        json!(["reasoning", "message"]),
        "{out}"
    );
    assert_eq!(out["stream"]["reasoning"], "Two and three.", "{out}");
    for kind in [
        "response.created",
        "response.in_progress",
        "response.reasoning_summary_text.delta",
        "response.output_text.done",
        "response.completed",
    ] {
        assert!(
            out["stream"]["kinds"]
                .as_array()
                .unwrap()
                .contains(&json!(kind)),
            "{kind}: {out}"
        );
    }
    assert_eq!(
        out["whole_input"],
        json!({"call": ["add", {"a": 2, "b": 3}], "answer": "2 + 3 = 5"})
    );
    assert_eq!(out["previous"], "4 + 4 = 8", "{out}");
    assert_eq!(
        out["loose"],
        json!({"types": ["reasoning", "function_call"], "answer": "1 + 2 = 3"})
    );
    assert_eq!(
        out["stream_call"],
        json!({"name": "add", "arguments": {"a": 6, "b": 1}, "done": true})
    );
    // The model saw each tool's result after its call, from the whole input and from the
    // session alike.
    let requests = mock.requests();
    for (index, result) in [(2, "\"5\""), (4, "\"8\""), (6, "\"3\"")] {
        let sent = requests[index].body.to_string();
        assert!(
            sent.contains("\"role\":\"tool\"") && sent.contains(result),
            "request {index}: {sent}"
        );
    }
    assert!(requests[4].body.to_string().contains("And 4 + 4?"));
}

const AGENTS_SDK_RESPONSES: &str = r#"
import json, sys
from openai import AsyncOpenAI
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel

set_tracing_disabled(True)
calls = []

@function_tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    calls.append([a, b])
    return a + b

client = AsyncOpenAI(base_url=sys.argv[1] + "/openai/v1", api_key="not-needed")
agent = Agent(
    name="calculator",
    instructions="Use the add tool for sums.",
    model=OpenAIResponsesModel(model="mock", openai_client=client),
    tools=[add],
)
first = Runner.run_sync(agent, "What is 2 + 3?")
second = Runner.run_sync(agent, first.to_input_list() + [{"role": "user", "content": "And 4 + 4?"}])
print(json.dumps({"first": first.final_output, "second": second.final_output, "calls": calls}))
"#;

/// Issue 48: the Agents SDK's `OpenAIResponsesModel` runs its own function tool through
/// Agentry's Responses API over two turns (the second sends the first's items back, reasoning
/// included).
#[tokio::test]
async fn the_agents_sdk_runs_its_tools_over_the_responses_api_for_two_turns() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has openai-agents");
    };
    let server = start().await;
    let mock = &server.mock;
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("add", json!({"a": 2, "b": 3})).with_thinking("Add them.", "s"),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("2 + 3 = 5")));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "add",
        json!({"a": 4, "b": 4}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("4 + 4 = 8")));
    let out = python(&servers, AGENTS_SDK_RESPONSES, &server.url).await;
    assert_eq!(
        out,
        json!({"first": "2 + 3 = 5", "second": "4 + 4 = 8", "calls": [[2, 3], [4, 4]]})
    );
    // The second turn's model saw the first turn whole, and the new question.
    let requests = mock.requests();
    assert_eq!(requests.len(), 4);
    let third = requests[2].body.to_string();
    assert!(
        third.contains("What is 2 + 3?")
            && third.contains("2 + 3 = 5")
            && third.contains("And 4 + 4?"),
        "{third}"
    );
}

const LANGCHAIN: &str = r#"
import json, sys
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b

out = {}
for mode in ["chat", "responses"]:
    model = ChatOpenAI(model="mock", base_url=sys.argv[1] + "/openai/v1", api_key="not-needed",
                       use_responses_api=(mode == "responses"))
    with_tools = model.bind_tools([add])
    messages = [HumanMessage("What is 2 + 3?")]
    called = with_tools.invoke(messages)
    call = called.tool_calls[0]
    messages += [called, ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])]
    answer = with_tools.invoke(messages)
    streamed = "".join(chunk.text for chunk in model.stream("Stream it."))
    out[mode] = {"call": [call["name"], call["args"]], "answer": answer.text,
                 "streamed": streamed}
print(json.dumps(out))
"#;

/// Issue 48: LangChain's `ChatOpenAI`, in chat-completions mode and in Responses mode, runs a
/// bound tool through a call and its result, and streams.
#[tokio::test]
async fn langchain_runs_a_bound_tool_and_streams_in_both_modes() {
    let Ok(servers) = agentry_testkit::mcp::McpServers::locate() else {
        panic!("run scripts/install-mcp-servers first: the venv has langchain-openai");
    };
    let server = start().await;
    let mock = &server.mock;
    for _ in 0..2 {
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "add",
            json!({"a": 2, "b": 3}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("2 + 3 = 5")));
        mock.enqueue(
            Reply::scripted(ScriptedTurn::text("Streamed fine."))
                .chunked(agentry_testkit::Chunking::SseEvents),
        );
    }
    let out = python(&servers, LANGCHAIN, &server.url).await;
    let expected = json!({"call": ["add", {"a": 2, "b": 3}], "answer": "2 + 3 = 5",
                          "streamed": "Streamed fine."});
    assert_eq!(out, json!({"chat": expected, "responses": expected}));
    // The model saw the tool's result in both modes.
    let requests = mock.requests();
    for index in [1, 4] {
        let sent = requests[index].body.to_string();
        assert!(
            sent.contains("\"role\":\"tool\""),
            "request {index}: {sent}"
        );
    }
}
