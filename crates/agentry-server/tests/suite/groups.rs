//! Group chat: @mention routing, everyone woken without a mention, further rounds from mentions
//! in replies, the round limit, nobody woken twice in a row, each member's own point of view,
//! members of a round in parallel, the transcript in the session log, SSE progress, and bad
//! requests. Each member runs on a model served by its own mock, so parallel members get the
//! replies meant for them.

use std::time::Duration;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start};

const NAMES: [(&str, &str); 3] = [("alice", "Alice"), ("bob", "Bob"), ("carol", "Carol")];

struct Group {
    server: Server,
    alice: MockProvider,
    bob: MockProvider,
    carol: MockProvider,
}

/// A server with agents alice, bob and carol (nicknames capitalised), each on a model served
/// by its own mock, with the system prompt `You are <id>-prompt.`.
async fn setup() -> Group {
    let server = start().await;
    let mut mocks = Vec::new();
    for (id, nickname) in NAMES {
        let mock = MockProvider::start().await.unwrap();
        let (status, body) = server
            .post(
                "/v1/models",
                json!({"id": format!("m-{id}"), "protocol": "openai",
                       "base_url": mock.openai_base_url(), "model_name": id}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": id, "nickname": nickname, "model_id": format!("m-{id}"),
                       "system": format!("You are {id}-prompt.")}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        mocks.push(mock);
    }
    let carol = mocks.pop().unwrap();
    let bob = mocks.pop().unwrap();
    let alice = mocks.pop().unwrap();
    Group {
        server,
        alice,
        bob,
        carol,
    }
}

fn text(reply: &str) -> Reply {
    Reply::scripted(ScriptedTurn::text(reply))
}

impl Group {
    async fn create(&self, max_rounds: Option<u32>) -> String {
        let mut body = json!({"members": ["alice", "bob", "carol"]});
        if let Some(rounds) = max_rounds {
            body["max_rounds"] = json!(rounds);
        }
        let (status, body) = self.server.post("/v1/groups", body).await;
        assert_eq!(status, 201, "{body}");
        body["session_id"].as_str().unwrap().to_owned()
    }

    async fn say(&self, session: &str, text: &str) -> Value {
        let (status, body) = self
            .server
            .post(
                &format!("/v1/groups/{session}/messages"),
                json!({"text": text}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    fn counts(&self) -> [usize; 3] {
        [
            self.alice.request_count(),
            self.bob.request_count(),
            self.carol.request_count(),
        ]
    }
}

/// `(round, agent_id or "user", text)` of an outcome's messages.
fn said(outcome: &Value) -> Vec<(u64, String, String)> {
    outcome["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let event = &m["event"]["event"];
            (
                event["round"].as_u64().unwrap(),
                event["agent_id"].as_str().unwrap_or("user").to_owned(),
                event["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn triple(round: u64, who: &str, text: &str) -> (u64, String, String) {
    (round, who.to_owned(), text.to_owned())
}

/// The text of a recorded OpenAI message.
fn content(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    }
}

/// `(role, text)` of the messages of a recorded OpenAI request.
fn conversation(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), content(m)))
        .collect()
}

#[tokio::test]
async fn a_mention_wakes_only_the_agent_named() {
    let group = setup().await;
    let session = group.create(None).await;
    group.bob.enqueue(text("Bob here."));
    let outcome = group
        .say(
            &session,
            "@bob can you check this? (mail carol@example.com)",
        )
        .await;
    assert_eq!(outcome["stop_reason"], "completed", "{outcome}");
    assert_eq!(outcome["rounds"], 1);
    assert_eq!(
        said(&outcome),
        vec![
            triple(
                0,
                "user",
                "@bob can you check this? (mail carol@example.com)"
            ),
            triple(1, "bob", "Bob here."),
        ]
    );
    assert_eq!(group.counts(), [0, 1, 0]);
}

#[tokio::test]
async fn no_mention_wakes_everyone_through_infer() {
    let group = setup().await;
    group.alice.enqueue(text("A."));
    group.bob.enqueue(text("B."));
    group.carol.enqueue(text("C."));
    let (status, outcome) = group
        .server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["alice", "bob", "carol"], "session_id": "new",
                   "text": "Good morning, team."}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["group"], true);
    assert_eq!(outcome["rounds"], 1);
    let mut replies: Vec<(u64, String, String)> = said(&outcome)[1..].to_vec();
    replies.sort();
    assert_eq!(
        replies,
        vec![
            triple(1, "alice", "A."),
            triple(1, "bob", "B."),
            triple(1, "carol", "C.")
        ]
    );
    assert_eq!(group.counts(), [1, 1, 1]);
    // The new session is a group of the three.
    let session = outcome["session_id"].as_str().unwrap();
    let (status, detail) = group.server.get(&format!("/v1/groups/{session}")).await;
    assert_eq!(status, 200, "{detail}");
    let members: Vec<&str> = detail["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(members, vec!["alice", "bob", "carol"]);
    // The same session goes on through `/v1/infer` with the same agents.
    group.carol.enqueue(text("C again."));
    let (status, outcome) = group
        .server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["carol", "alice", "bob"], "session_id": session,
                   "text": "@Carol and you?"}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(said(&outcome)[1], triple(1, "carol", "C again."));
    assert_eq!(group.counts(), [1, 1, 2]);
}

#[tokio::test]
async fn mentions_in_replies_start_further_rounds() {
    let group = setup().await;
    let session = group.create(None).await;
    // Alice mentions herself and Bob: only Bob answers in round 2.
    group
        .alice
        .enqueue(text("I think so, @Alice agrees. @bob?"));
    group.bob.enqueue(text("Agreed. Over to you, @carol."));
    group.carol.enqueue(text("Done, thanks @ALICE."));
    group.alice.enqueue(text("Great."));
    let outcome = group.say(&session, "@alice start please").await;
    assert_eq!(outcome["stop_reason"], "completed", "{outcome}");
    assert_eq!(outcome["rounds"], 4);
    assert_eq!(
        said(&outcome),
        vec![
            triple(0, "user", "@alice start please"),
            triple(1, "alice", "I think so, @Alice agrees. @bob?"),
            triple(2, "bob", "Agreed. Over to you, @carol."),
            triple(3, "carol", "Done, thanks @ALICE."),
            triple(4, "alice", "Great."),
        ]
    );
    assert_eq!(outcome["text"], "Great.");
    assert_eq!(group.counts(), [2, 1, 1]);
    // Each reply records whom it mentions.
    let mentions = &outcome["messages"][1]["event"]["event"]["mentions"];
    assert_eq!(mentions, &json!(["alice", "bob"]));
}

#[tokio::test]
async fn the_same_agent_is_not_woken_twice_in_a_row() {
    let group = setup().await;
    let session = group.create(None).await;
    // Everyone speaks in round 1 and mentions only members who also spoke: no round 2.
    group.alice.enqueue(text("@bob what do you think?"));
    group.bob.enqueue(text("@alice I agree, @bob too."));
    group.carol.enqueue(text("@all fine by me"));
    let outcome = group.say(&session, "Thoughts?").await;
    assert_eq!(outcome["stop_reason"], "completed", "{outcome}");
    assert_eq!(outcome["rounds"], 1);
    assert_eq!(said(&outcome).len(), 4);
    assert_eq!(group.counts(), [1, 1, 1]);
}

#[tokio::test]
async fn the_round_limit_stops_the_exchange() {
    let group = setup().await;
    let session = group.create(Some(3)).await;
    group.alice.set_fallback(text("@bob your turn"));
    group.bob.set_fallback(text("@alice your turn"));
    let outcome = group.say(&session, "@alice go").await;
    assert_eq!(outcome["stop_reason"], "max_rounds", "{outcome}");
    assert_eq!(outcome["rounds"], 3);
    let who: Vec<String> = said(&outcome).into_iter().map(|(_, who, _)| who).collect();
    assert_eq!(who, vec!["user", "alice", "bob", "alice"]);
    assert_eq!(group.counts(), [2, 1, 0]);
    // The default limit is 5.
    let session = group.create(None).await;
    let outcome = group.say(&session, "@bob go").await;
    assert_eq!(outcome["stop_reason"], "max_rounds", "{outcome}");
    assert_eq!(outcome["rounds"], 5);
    assert_eq!(group.counts(), [4, 4, 0]);
}

#[tokio::test]
async fn each_member_sees_the_conversation_from_its_point_of_view() {
    let group = setup().await;
    let session = group.create(None).await;
    group.alice.enqueue(text("A1"));
    group.say(&session, "@alice hi").await;
    group.bob.enqueue(text("B1"));
    group.say(&session, "@bob what did Alice say?").await;
    group.alice.enqueue(text("A2"));
    group.say(&session, "@alice again").await;

    // Bob's first turn: his own system prompt, everything so far labelled, in one user turn.
    let bob = group.bob.requests();
    let bob = conversation(&bob[0].body);
    assert_eq!(bob.len(), 2, "{bob:?}");
    assert_eq!(bob[0].0, "system");
    assert!(bob[0].1.starts_with("You are bob-prompt."), "{}", bob[0].1);
    assert!(bob[0].1.contains("@Alice (id `alice`)"), "{}", bob[0].1);
    assert!(!bob[0].1.contains("alice-prompt"));
    assert_eq!(bob[1].0, "user");
    assert_eq!(
        bob[1].1,
        "**user**: @alice hi\n\n**Alice** (alice): A1\n\n**user**: @bob what did Alice say?"
    );

    // Alice's second turn: her first reply is her own assistant message; what she missed
    // comes labelled.
    let alice = group.alice.requests();
    assert_eq!(alice.len(), 2);
    let alice = conversation(&alice[1].body);
    assert_eq!(
        alice
            .iter()
            .map(|(role, _)| role.as_str())
            .collect::<Vec<_>>(),
        vec!["system", "user", "assistant", "user"]
    );
    assert!(alice[0].1.starts_with("You are alice-prompt."));
    assert_eq!(alice[1].1, "**user**: @alice hi");
    assert_eq!(alice[2].1, "A1");
    assert_eq!(
        alice[3].1,
        "**user**: @bob what did Alice say?\n\n**Bob** (bob): B1\n\n**user**: @alice again"
    );
}

#[tokio::test]
async fn members_of_a_round_run_in_parallel() {
    let group = setup().await;
    let session = group.create(None).await;
    let delay = Duration::from_millis(1500);
    group.alice.enqueue(text("A").delay_headers(delay));
    group.bob.enqueue(text("B").delay_headers(delay));
    group.say(&session, "@alice @bob both of you").await;
    let alice = group.alice.requests()[0].received_at;
    let bob = group.bob.requests()[0].received_at;
    // Each answer takes 1.5 s: one after the other, the second request would come at least
    // that long after the first.
    let apart = if alice > bob {
        alice - bob
    } else {
        bob - alice
    };
    assert!(
        apart < delay,
        "the members ran one after the other ({apart:?})"
    );
}

#[tokio::test]
async fn the_transcript_is_in_the_session_log() {
    let group = setup().await;
    let session = group.create(Some(4)).await;
    group.carol.enqueue(text("Sure, @bob knows."));
    group.bob.enqueue(text("It is 42."));
    let outcome = group.say(&session, "@carol what is the answer?").await;
    let run_id = outcome["run_id"].as_str().unwrap().to_owned();

    let (status, body) = group
        .server
        .get(&format!("/v1/sessions/{session}/events"))
        .await;
    assert_eq!(status, 200, "{body}");
    let events: Vec<&Value> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["event"])
        .collect();
    assert!(
        events
            .iter()
            .all(|e| e["type"] == "group" && e["run_id"] == run_id)
    );
    let kinds: Vec<(&str, Option<&str>)> = events
        .iter()
        .map(|e| {
            (
                e["event"]["kind"].as_str().unwrap(),
                e["event"]["agent_id"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("message", None),
            ("round", None),
            ("message", Some("carol")),
            ("round", None),
            ("message", Some("bob")),
            ("finished", None),
        ]
    );
    assert_eq!(events[1]["event"]["members"], json!(["carol"]));
    assert_eq!(events[3]["event"]["members"], json!(["bob"]));
    assert_eq!(events[4]["event"]["text"], "It is 42.");
    assert_eq!(events[5]["event"]["stop_reason"], "completed");
    assert_eq!(events[5]["event"]["rounds"], 2);

    // Bob's turn ran in his own linked session, recorded there too.
    let member_session = events[4]["event"]["session_id"].as_str().unwrap();
    let (status, detail) = group
        .server
        .get(&format!("/v1/sessions/{member_session}/events"))
        .await;
    assert_eq!(status, 200, "{detail}");
    let member_events = detail["events"].as_array().unwrap();
    assert!(
        member_events
            .iter()
            .any(|e| e["event"]["type"] == "run_started"
                && e["event"]["run_id"] == events[4]["event"]["member_run_id"])
    );
    assert!(
        member_events
            .iter()
            .any(|e| e["event"]["type"] == "assistant_message")
    );

    // The group view reads the same transcript.
    let (_, detail) = group.server.get(&format!("/v1/groups/{session}")).await;
    assert_eq!(detail["transcript"].as_array().unwrap().len(), 6);
    assert_eq!(detail["max_rounds"], 4);
    assert_eq!(detail["members"][1]["nickname"], "Bob");
    assert_eq!(detail["live"], false);
}

#[tokio::test]
async fn progress_streams_over_sse() {
    let group = setup().await;
    let session = group.create(None).await;
    group.alice.enqueue(text("Hello from Alice, @bob."));
    group.bob.enqueue(text("Hi."));
    let mut client = group
        .server
        .sse(
            &format!("/v1/groups/{session}/messages/stream"),
            Some(json!({"text": "@alice say hi"})),
            None,
        )
        .await;
    let events = client.rest().await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"session"));
    assert_eq!(names.last(), Some(&"group.finished"), "{names:?}");
    let speaking: Vec<&str> = events
        .iter()
        .filter(|e| e.name == "group.speaking")
        .map(|e| e.data["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(speaking, vec!["alice", "bob"]);
    let alice_text: String = events
        .iter()
        .filter(|e| e.name == "group.delta" && e.data["agent_id"] == "alice")
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(alice_text, "Hello from Alice, @bob.");
    let messages: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.name == "group.message")
        .map(|e| {
            let event = &e.data["event"]["event"];
            (
                event["agent_id"].as_str().unwrap_or("user").to_owned(),
                event["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        messages,
        vec![
            ("user".to_owned(), "@alice say hi".to_owned()),
            ("alice".to_owned(), "Hello from Alice, @bob.".to_owned()),
            ("bob".to_owned(), "Hi.".to_owned()),
        ]
    );
    let rounds = events.iter().filter(|e| e.name == "group.round").count();
    assert_eq!(rounds, 2);
}

#[tokio::test]
async fn bad_group_requests_are_refused() {
    let group = setup().await;
    let server = &group.server;
    for body in [
        json!({"members": ["alice"]}),
        json!({"members": ["alice", "nobody"]}),
        json!({"members": ["alice", "alice"]}),
        json!({"members": ["alice", "bob"], "max_rounds": 0}),
        json!({"members": ["alice", "bob"], "max_rounds": 51}),
        json!({"members": ["alice", "bob"], "colour": "red"}),
    ] {
        let (status, response) = server.post("/v1/groups", body.clone()).await;
        assert_eq!(status, 400, "{body} → {response}");
    }
    let members: Vec<String> = (0..17).map(|i| format!("a{i}")).collect();
    let (status, _) = server.post("/v1/groups", json!({"members": members})).await;
    assert_eq!(status, 400);
    // Nothing was created by the refused requests.
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        0,
        "{sessions}"
    );

    // A plain session is no group.
    server.mock.enqueue(text("plain"));
    let (status, plain) = server
        .post(
            "/v1/infer",
            json!({"model_id": "mock", "text": "hi", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{plain}");
    let plain_id = plain["session_id"].as_str().unwrap();
    let (status, _) = server
        .post(
            &format!("/v1/groups/{plain_id}/messages"),
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server.get(&format!("/v1/groups/{plain_id}")).await;
    assert_eq!(status, 400);
    let session = group.create(None).await;
    let (status, _) = server
        .post(
            &format!("/v1/groups/{session}/messages"),
            json!({"text": "  "}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            "/v1/groups/0190a5b2-0000-7000-8000-000000000000/messages",
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 404);
    // `/v1/infer` with several agents: single-run fields do not apply; members must match.
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["alice", "bob"], "model_id": "mock", "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["alice", "bob"], "session_id": session, "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["alice", "ghost"], "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post("/v1/infer", json!({"text": "hi", "max_rounds": 3}))
        .await;
    assert_eq!(status, 400);
    // A group session takes no single-agent run.
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"model_id": "mock", "session_id": session, "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["alice"], "session_id": session, "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(group.counts(), [0, 0, 0]);
}

#[tokio::test]
async fn a_second_message_while_one_runs_is_refused() {
    let group = setup().await;
    let session = group.create(None).await;
    group
        .alice
        .enqueue(text("slow").delay_headers(Duration::from_millis(1500)));
    let mut client = group
        .server
        .sse(
            &format!("/v1/groups/{session}/messages/stream"),
            Some(json!({"text": "@alice go"})),
            None,
        )
        .await;
    // Wait until Alice is speaking.
    loop {
        let event = client.next().await.expect("an event");
        if event.name == "group.speaking" {
            break;
        }
    }
    let (status, body) = group
        .server
        .post(
            &format!("/v1/groups/{session}/messages"),
            json!({"text": "@bob hi"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    let rest = client.rest().await;
    assert_eq!(rest.last().map(|e| e.name.as_str()), Some("group.finished"));
    assert_eq!(group.counts(), [1, 0, 0]);
}

#[tokio::test]
async fn a_console_can_follow_abort_and_replay_a_group() {
    let group = setup().await;
    let session = group.create(None).await;
    group
        .alice
        .enqueue(text("too late").delay_headers(Duration::from_secs(5)));
    let server_url = group.server.url.clone();
    let http = group.server.http.clone();
    let path = format!("{server_url}/v1/groups/{session}/messages");
    let waiting = tokio::spawn(async move {
        let response = http
            .post(path)
            .json(&json!({"text": "@alice take your time"}))
            .send()
            .await
            .unwrap();
        response.json::<Value>().await.unwrap()
    });
    // Wait until the exchange is live and Alice's request is in.
    for _ in 0..100 {
        let (_, detail) = group.server.get(&format!("/v1/groups/{session}")).await;
        if detail["live"] == true && group.alice.request_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut follower = group
        .server
        .sse(&format!("/v1/groups/{session}/stream"), None, None)
        .await;
    let first = follower.next().await.expect("the backlog");
    assert_eq!(first.name, "group.message");
    assert_eq!(
        first.data["event"]["event"]["text"],
        "@alice take your time"
    );
    let (status, body) = group
        .server
        .post(&format!("/v1/groups/{session}/abort"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["aborted"], true);
    let rest = follower.rest().await;
    let last = rest.last().expect("the end");
    assert_eq!(last.name, "group.finished");
    assert_eq!(last.data["event"]["event"]["stop_reason"], "cancelled");
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome["stop_reason"], "cancelled", "{outcome}");
    // Alice's cancelled turn is recorded, with no text and why.
    let alice = &outcome["messages"][1]["event"]["event"];
    assert_eq!(alice["agent_id"], "alice");
    assert_eq!(alice["text"], "");
    assert_eq!(alice["stop_reason"], "cancelled", "{alice}");

    // Reconnecting after the first event replays the rest from the log, then ends.
    let seq = first.data["seq"].as_u64().unwrap();
    let mut replay = group
        .server
        .sse(&format!("/v1/groups/{session}/stream"), None, Some(seq))
        .await;
    let replayed = replay.rest().await;
    let seqs: Vec<u64> = replayed
        .iter()
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.first(), Some(&(seq + 1)));
    assert_eq!(replayed.last().unwrap().name, "group.finished");
    // Not live any more: a new message is accepted.
    group.bob.enqueue(text("B"));
    let outcome = group.say(&session, "@bob now you").await;
    assert_eq!(outcome["stop_reason"], "completed");
}

#[tokio::test]
async fn a_failing_member_is_recorded_and_the_others_go_on() {
    let group = setup().await;
    let session = group.create(None).await;
    group.alice.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
    ));
    group.alice.enqueue(text("Back now."));
    group.bob.enqueue(text("Fine, and @alice?"));
    group.carol.enqueue(text("Fine."));
    let outcome = group.say(&session, "How are you?").await;
    assert_eq!(outcome["stop_reason"], "completed", "{outcome}");
    let messages = outcome["messages"].as_array().unwrap();
    let alice = messages
        .iter()
        .map(|m| &m["event"]["event"])
        .find(|e| e["agent_id"] == "alice")
        .expect("alice's entry");
    assert_eq!(alice["text"], "");
    assert_eq!(alice["stop_reason"], "error");
    assert!(
        alice["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad request")
    );
    // Bob's mention wakes Alice for round 2 (she did not speak in round 1).
    assert_eq!(outcome["rounds"], 2);
    assert_eq!(outcome["text"], "Back now.");
    assert_eq!(group.alice.request_count(), 2);
    // Her second turn is shown only what came after the turn that failed (her session already
    // holds the user's message).
    let requests = group.alice.requests();
    let second = conversation(&requests[1].body);
    let (role, last) = second.last().unwrap();
    assert_eq!(role, "user");
    assert!(last.contains("**Bob** (bob): Fine, and @alice?"), "{last}");
    assert!(last.contains("**Carol** (carol): Fine."), "{last}");
    assert!(!last.contains("How are you?"), "{last}");
}

#[tokio::test]
async fn an_exchange_left_open_by_a_stopped_server_is_closed_first() {
    use agentry_types::{GroupEvent, RunId, SessionEvent, SessionId};
    let group = setup().await;
    let session = group.create(None).await;
    let id = SessionId::parse(&session).unwrap();
    let stale = RunId::new();
    group
        .server
        .state
        .app
        .parts()
        .sessions
        .log()
        .append(
            id,
            vec![SessionEvent::Group {
                run_id: stale,
                event: GroupEvent::Round {
                    round: 1,
                    members: vec!["alice".into()],
                },
            }],
        )
        .await
        .unwrap();
    group.bob.enqueue(text("B"));
    group.say(&session, "@bob hi").await;
    let (_, body) = group
        .server
        .get(&format!("/v1/sessions/{session}/events"))
        .await;
    let second = &body["events"][1]["event"];
    assert_eq!(second["run_id"], json!(stale));
    assert_eq!(second["event"]["kind"], "finished");
    assert_eq!(second["event"]["stop_reason"], "interrupted");
    assert_eq!(body["events"][2]["event"]["event"]["text"], "@bob hi");
}

#[tokio::test]
async fn the_group_routes_are_documented() {
    let server = start().await;
    let (status, doc) = server.get("/openapi.json").await;
    assert_eq!(status, 200);
    for (path, method) in [
        ("/v1/groups", "post"),
        ("/v1/groups/{id}", "get"),
        ("/v1/groups/{id}/messages", "post"),
        ("/v1/groups/{id}/messages/stream", "post"),
        ("/v1/groups/{id}/stream", "get"),
        ("/v1/groups/{id}/abort", "post"),
    ] {
        let operation = &doc["paths"][path][method];
        assert!(operation.is_object(), "{method} {path} is not documented");
        assert_eq!(operation["tags"], json!(["groups"]), "{method} {path}");
    }
    let infer = &doc["components"]["schemas"]["InferRequest"]["properties"];
    assert!(infer["max_rounds"].is_object());
}

#[tokio::test]
async fn infer_stream_with_cancel_on_disconnect_cancels_the_exchange() {
    let group = setup().await;
    group
        .alice
        .enqueue(text("never heard").delay_headers(Duration::from_secs(5)));
    group
        .bob
        .enqueue(text("never heard").delay_headers(Duration::from_secs(5)));
    let mut client = group
        .server
        .sse(
            "/v1/infer/stream",
            Some(json!({"agent_ids": ["alice", "bob"], "text": "@all hello",
                        "cancel_on_disconnect": true})),
            None,
        )
        .await;
    let session = client.session.clone().expect("x-session-id");
    loop {
        let event = client.next().await.expect("an event");
        if event.name == "group.speaking" {
            break;
        }
    }
    drop(client);
    let mut last = Value::Null;
    for _ in 0..200 {
        let (_, detail) = group.server.get(&format!("/v1/groups/{session}")).await;
        if detail["live"] == false {
            last = detail["transcript"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last["event"]["event"]["kind"], "finished", "{last}");
    assert_eq!(last["event"]["event"]["stop_reason"], "cancelled");
}

/// The seed's API naming several agents: a group chat answered in the seed's shapes — each
/// member's turn carries its `agent_id` and nickname, turns grouped by member, a mention wakes
/// only the member named, the stream's messages carry the member too and end with the session
/// and `[DONE]`; one-agent fields are refused.
#[tokio::test]
async fn the_seeds_infer_naming_several_agents_is_a_group_chat() {
    let group = setup().await;
    let server = &group.server;
    group.alice.enqueue(text("Alice says hi."));
    group.bob.enqueue(text("Bob says hi."));
    group.carol.enqueue(text("Carol says hi."));
    let (status, answer) = server
        .post(
            "/linglong/v1/infer",
            json!({"agent_ids": ["alice", "bob", "carol"], "session_id": "new",
                   "messages": [{"role": "user", "content": "Good morning, team."}]}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["success"], true, "{answer}");
    let mut turns: Vec<(String, String, String)> = answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|turn| {
            assert_eq!(turn["role"], "assistant", "{turn}");
            (
                turn["agent_id"].as_str().unwrap().to_owned(),
                turn["name"].as_str().unwrap().to_owned(),
                turn["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    turns.sort();
    assert_eq!(
        turns,
        vec![
            ("alice".into(), "Alice".into(), "Alice says hi.".into()),
            ("bob".into(), "Bob".into(), "Bob says hi.".into()),
            ("carol".into(), "Carol".into(), "Carol says hi.".into()),
        ]
    );
    let session = answer["session_id"].as_str().unwrap().to_owned();
    let (status, _) = server.get(&format!("/v1/groups/{session}")).await;
    assert_eq!(status, 200);

    // Streamed, in the same group: a mention wakes only Bob.
    group.bob.enqueue(text("Only Bob."));
    let response = server
        .http
        .post(format!("{}/linglong/v1/infer/stream", server.url))
        .json(
            &json!({"agent_ids": ["alice", "bob", "carol"], "session_id": session,
                      "text": "@bob just you"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let data: Vec<&str> = body
        .split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| event.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let frames: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|frame| serde_json::from_str(frame).unwrap())
        .collect();
    assert_eq!(frames.last().unwrap()["session_id"], session.as_str());
    let said: String = frames
        .iter()
        .filter(|frame| frame["role"] == "assistant")
        .map(|frame| {
            assert_eq!(
                (frame["agent_id"].as_str(), frame["name"].as_str()),
                (Some("bob"), Some("Bob"))
            );
            frame["content"].as_str().unwrap_or_default()
        })
        .collect();
    assert_eq!(said, "Only Bob.");
    assert_eq!(group.counts(), [1, 2, 1]);

    // A member that fails says so in its own turn; the others' turns stand.
    group.alice.enqueue(text("Alice again."));
    group.bob.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bob's model refuses", "type": "invalid_request_error"}}),
    ));
    let (status, answer) = server
        .post(
            "/linglong/v1/infer",
            json!({"agent_ids": ["alice", "bob", "carol"], "session_id": session,
                   "text": "@alice @bob status?"}),
        )
        .await;
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["success"], false);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("bob's model refuses"),
        "{answer}"
    );
    let turns = answer["messages"].as_array().unwrap();
    let of = |agent: &str| {
        turns
            .iter()
            .find(|turn| turn["agent_id"] == agent)
            .map(|turn| turn["content"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(of("alice").as_deref(), Some("Alice again."));
    assert!(of("bob").unwrap().starts_with("Error:"), "{answer}");

    // One agent's fields, and `continue`, do not apply to a group.
    for body in [
        json!({"agent_ids": ["alice", "bob"], "text": "x", "model_id": "m-alice"}),
        json!({"agent_ids": ["alice", "bob"], "session_id": session, "continue": true}),
        json!({"agent_ids": ["alice", "ghost"], "text": "x"}),
    ] {
        let (status, answer) = server.post("/linglong/v1/infer", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
}
