//! Capability labels on models, and images and audio through the API: a text-only model gets
//! descriptions from a vision model and transcripts from a speech model (found by label, or
//! the agent's own), in Agentry's and the seed's request shapes; `summary` writes titles.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start};

const IMAGE: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const AUDIO: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

async fn add_model(server: &Server, id: &str, model_name: &str, labels: Value) -> Value {
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": id, "protocol": "openai", "base_url": server.mock.openai_base_url(),
                   "model_name": model_name, "labels": labels}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body
}

fn transcript(text: &str) -> Reply {
    Reply::raw(
        200,
        vec![("content-type".into(), "application/json".into())],
        json!({ "text": text }).to_string(),
    )
}

/// The user messages' content the mock was sent in request `index`, as text.
fn user_text(server: &Server, index: usize) -> String {
    let requests = server.mock.requests();
    requests[index].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test]
async fn labels_are_saved_listed_and_checked() {
    let server = start().await;
    let eyes = add_model(&server, "eyes", "vision-m", json!(["vision", "read-image"])).await;
    assert_eq!(eyes["labels"], json!(["vision", "read-image"]));
    // One string, separated by commas (also the full-width one) or spaces, duplicates dropped.
    let ears = add_model(&server, "ears", "whisper-1", json!("speech， fast,speech")).await;
    assert_eq!(ears["labels"], json!(["speech", "fast"]));
    let (_, list) = server.get("/v1/models").await;
    let listed: Vec<&Value> = list["models"].as_array().unwrap().iter().collect();
    assert!(
        listed
            .iter()
            .any(|m| m["id"] == "eyes" && m["labels"] == json!(["vision", "read-image"]))
    );
    for bad in [json!(["two words"]), json!([7]), json!(["x".repeat(65)])] {
        let (status, body) = server
            .post(
                "/v1/models",
                json!({"id": "bad", "protocol": "openai", "model_name": "m", "labels": bad}),
            )
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = server.get("/v1/models/bad").await;
    assert_eq!(status, 404);

    // The seed's registration: labels as its console sends them, and `model_type: vlm`.
    let (status, body) = server
        .post(
            "/linglong/v1/models",
            json!({"model_id": "seed-eyes", "api_base": server.mock.openai_base_url(),
                   "model_name": "qwen-vl", "model_type": "vlm", "labels": "read-image, ocr"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, seed) = server.get("/linglong/v1/models").await;
    let entry = seed["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model_id"] == "seed-eyes")
        .unwrap()
        .clone();
    assert_eq!(entry["labels"], json!(["read-image", "ocr", "vlm"]));
    assert_eq!(entry["model_type"], "vlm");
    let mock_entry = seed["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model_id"] == "mock")
        .unwrap()
        .clone();
    assert_eq!(mock_entry["model_type"], "llm");
}

#[tokio::test]
async fn a_text_only_model_gets_descriptions_and_transcripts_by_label() {
    let server = start().await;
    add_model(&server, "eyes", "vision-m", json!(["vision", "read-image"])).await;
    add_model(&server, "ears", "whisper-1", json!(["speech"])).await;

    // The seed's request: an image and audio on a user message, to the text-only `mock`.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "A receipt for 12 euros.",
    )));
    server.mock.enqueue(transcript("how much did I pay"));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("You paid 12 euros.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": [{"role": "user", "content": "Look.",
                   "images": [format!("data:image/png;base64,{IMAGE}")],
                   "audio": format!("data:audio/webm;codecs=opus;base64,{AUDIO}")}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], true, "{body}");
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    assert_eq!(requests[0].body["model"], "vision-m");
    assert_eq!(requests[1].path, "/v1/audio/transcriptions");
    let form = requests[1].body.as_str().unwrap();
    assert!(form.contains("filename=\"audio.webm\""), "{form}");
    assert_eq!(requests[2].body["model"], "m");
    let sent = user_text(&server, 2);
    assert!(
        sent.contains("as the vision model eyes describes it: A receipt for 12 euros."),
        "{sent}"
    );
    assert!(
        sent.contains("as the speech model ears transcribes it: how much did I pay"),
        "{sent}"
    );
    assert!(
        !sent.contains("image_url") && !sent.contains("input_audio"),
        "{sent}"
    );

    // A model labelled `audio` is sent the audio itself (Agentry's shape, an `input_audio`
    // part), and the image still goes through the vision model.
    add_model(&server, "listener", "gpt-audio", json!(["audio"])).await;
    server.mock.take_requests();
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("A dog.")));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Heard you.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"model_id": "listener", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Listen and look."},
                {"type": "image_url", "image_url": {"url": "https://example.com/dog.png"}},
                {"type": "input_audio", "input_audio": {"data": AUDIO, "format": "wav"}}
            ]}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(requests[0].body["model"], "vision-m");
    let sent = user_text(&server, 1);
    assert!(
        sent.contains("input_audio") && sent.contains("A dog."),
        "{sent}"
    );
    server.mock.check_protocol().unwrap();

    // Bad audio is refused before anything runs.
    for part in [
        json!({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}),
        json!({"type": "input_audio", "input_audio": {"data": AUDIO}}),
        json!({"type": "input_audio", "input_audio": {"data": AUDIO, "format": "w/av"}}),
    ] {
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"model_id": "mock", "messages": [{"role": "user", "content": [part]}]}),
            )
            .await;
        assert_eq!(status, 400, "{body}");
    }
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"model_id": "mock", "messages": [{"role": "user", "content": "x", "audio": "data:text/plain;base64,AAAA"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(server.mock.requests().len(), 2);
}

#[tokio::test]
async fn an_agent_names_its_own_vision_model() {
    let server = start().await;
    add_model(&server, "eyes", "vision-m", json!(["read-image"])).await;
    add_model(&server, "sharp-eyes", "vision-xl", json!(["vision"])).await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "reader", "model_id": "mock", "vision_model_id": "nobody"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nobody"),
        "{body}"
    );
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "reader", "model_id": "mock", "vision_model_id": "sharp-eyes"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["vision_model_id"], "sharp-eyes");

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("A chart going up.")));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Sales grew.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "reader", "messages": [{"role": "user", "content": "Read this.",
                   "images": [format!("data:image/png;base64,{IMAGE}")]}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let requests = server.mock.requests();
    assert_eq!(requests[0].body["model"], "vision-xl");
    assert!(
        user_text(&server, 1)
            .contains("as the vision model sharp-eyes describes it: A chart going up.")
    );
}

#[tokio::test]
async fn the_summary_model_writes_titles() {
    let server = start().await;
    add_model(&server, "brief", "summariser", json!(["summary"])).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "Hello"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Greetings")));
    let (status, titled) = server
        .post(
            &format!("/linglong/v1/sessions/{session}/generate-title"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{titled}");
    assert_eq!(titled["title"], "Greetings");
    let requests = server.mock.requests();
    assert_eq!(requests.last().unwrap().body["model"], "summariser");
}
