//! Images and audio for models that cannot take them: a vision model describes images and a
//! speech model transcribes audio for a text-only model, found by their labels or named by the
//! run; models labelled `vision` / `audio` get the parts as they are.

use agentry_core::{Input, RunError, RunRequest, Runtime};
use agentry_llm::{HttpModelClient, Protocol, ProviderConfig, RetryPolicy, TransportConfig};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{ContentPart, ImageSource, Message, RunStopReason};
use anyhow::{Result, bail, ensure};
use serde_json::Value;

use super::support::limits;

const IMAGE: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const AUDIO: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

fn client(mock: &MockProvider, model_name: &str) -> HttpModelClient {
    HttpModelClient::new(
        ProviderConfig::new(Protocol::OpenAi, model_name)
            .with_base_url(mock.openai_base_url())
            .with_transport(TransportConfig {
                retry: RetryPolicy::none(),
                ..TransportConfig::default()
            }),
    )
    .unwrap()
}

/// `main` (text only, or with `main_labels`), `eyes` labelled `read-image` and `ears` labelled
/// `speech`, all on the mock.
fn runtime(mock: &MockProvider, main_labels: &[&str]) -> Runtime {
    let mut builder = Runtime::builder();
    builder
        .model("main", client(mock, "text-model"))
        .model("eyes", client(mock, "vision-model"))
        .model("ears", client(mock, "whisper-1"))
        .model_labels("main", main_labels.iter().map(|l| l.to_string()).collect())
        .model_labels("eyes", vec!["vision".into(), "read-image".into()])
        .model_labels("ears", vec!["speech".into()])
        .default_model("main")
        .limits(limits());
    builder.build()
}

fn media_request() -> RunRequest {
    RunRequest {
        input: Some(Input::Content {
            content: vec![
                ContentPart::text("What is in these?"),
                ContentPart::Image {
                    source: ImageSource::Base64 {
                        media_type: "image/png".into(),
                        data: IMAGE.into(),
                    },
                },
                ContentPart::Audio {
                    format: "wav".into(),
                    data: AUDIO.into(),
                },
            ],
        }),
        ..RunRequest::default()
    }
}

fn transcript_reply(text: &str) -> Reply {
    Reply::raw(
        200,
        vec![("content-type".into(), "application/json".into())],
        serde_json::json!({ "text": text }).to_string(),
    )
}

/// The user message contents the model was sent, as JSON.
fn user_contents(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].clone())
        .collect()
}

#[tokio::test]
async fn a_text_only_model_reads_descriptions_and_transcripts() -> Result<()> {
    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "A red square with the word HELLO.",
    )));
    mock.enqueue(transcript_reply("please summarise the picture"));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It says HELLO.")));
    let runtime = runtime(&mock, &[]);
    let output = runtime.run(media_request()).await?;
    ensure!(output.stop_reason == RunStopReason::Completed, "{output:?}");
    ensure!(output.text == "It says HELLO.");

    let requests = mock.take_requests();
    ensure!(requests.len() == 3, "{requests:#?}");
    // The vision model is sent the image with the prompt.
    let describe = &requests[0];
    ensure!(describe.body["model"] == "vision-model");
    let content = &user_contents(&describe.body)[0];
    ensure!(content[1]["type"] == "image_url", "{content}");
    ensure!(
        content[1]["image_url"]["url"]
            .as_str()
            .is_some_and(|url| url.ends_with(IMAGE))
    );
    // The speech model gets the audio as an upload.
    let transcribe = &requests[1];
    ensure!(
        transcribe.path == "/v1/audio/transcriptions",
        "{}",
        transcribe.path
    );
    ensure!(
        transcribe
            .header("content-type")
            .is_some_and(|t| t.starts_with("multipart/form-data"))
    );
    let Value::String(form) = &transcribe.body else {
        bail!("the upload is not a form: {:?}", transcribe.body);
    };
    ensure!(form.contains("name=\"model\"\r\n\r\nwhisper-1"), "{form}");
    ensure!(form.contains("filename=\"audio.wav\""), "{form}");
    ensure!(form.contains("Content-Type: audio/wav"), "{form}");
    // The main model reads text in their place.
    let main = &requests[2];
    ensure!(main.body["model"] == "text-model");
    let text = user_contents(&main.body)[0].to_string();
    ensure!(
        !text.contains("image_url") && !text.contains("input_audio"),
        "{text}"
    );
    ensure!(
        text.contains(
            "[image, as the vision model eyes describes it: A red square with the word HELLO.]"
        ),
        "{text}"
    );
    ensure!(
        text.contains(
            "[audio, as the speech model ears transcribes it: please summarise the picture]"
        ),
        "{text}"
    );
    mock.check_protocol()
        .map_err(|v| anyhow::anyhow!("{v:?}"))?;

    // The conversation keeps the original parts …
    let Some(Message::User { content }) = output
        .state
        .messages
        .iter()
        .find(|m| matches!(m, Message::User { .. }))
    else {
        bail!("no user message");
    };
    ensure!(matches!(content[1], ContentPart::Image { .. }));
    ensure!(matches!(content[2], ContentPart::Audio { .. }));

    // … and the next turn does not describe or transcribe them again.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Still HELLO.")));
    let next = runtime
        .run(RunRequest::text("And now?").with_history(output.state.messages.clone()))
        .await?;
    ensure!(next.text == "Still HELLO.");
    let requests = mock.take_requests();
    ensure!(requests.len() == 1, "described again: {requests:#?}");
    ensure!(
        requests[0]
            .body
            .to_string()
            .contains("as the vision model eyes describes it")
    );
    Ok(())
}

#[tokio::test]
async fn models_labelled_vision_and_audio_get_the_parts_themselves() -> Result<()> {
    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("I see and hear.")));
    let runtime = runtime(&mock, &["vision", "audio"]);
    let output = runtime.run(media_request()).await?;
    ensure!(output.text == "I see and hear.");
    let requests = mock.take_requests();
    ensure!(requests.len() == 1, "{requests:#?}");
    let content = &user_contents(&requests[0].body)[0];
    ensure!(content[1]["type"] == "image_url", "{content}");
    ensure!(content[2]["type"] == "input_audio", "{content}");
    Ok(())
}

#[tokio::test]
async fn without_a_stand_in_the_parts_go_to_the_model() -> Result<()> {
    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let mut builder = Runtime::builder();
    builder
        .model("main", client(&mock, "text-model"))
        .limits(limits());
    let runtime = builder.build();
    runtime.run(media_request()).await?;
    let requests = mock.take_requests();
    ensure!(requests.len() == 1);
    ensure!(user_contents(&requests[0].body)[0][1]["type"] == "image_url");
    Ok(())
}

#[tokio::test]
async fn a_run_names_its_own_vision_model_and_models_are_found_by_label() -> Result<()> {
    let mock = MockProvider::start().await?;
    let mut builder = Runtime::builder();
    builder
        .model("main", client(&mock, "text-model"))
        .model("own-eyes", client(&mock, "other-vision"))
        .model("eyes", client(&mock, "vision-model"))
        .model_labels("eyes", vec!["read-image".into()])
        .model_labels("main", vec!["fast".into()])
        .limits(limits());
    let runtime = builder.build();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("A cat.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("A cat it is.")));
    let mut request = media_request();
    request.vision_model = Some("own-eyes".into());
    // The model is named by its label.
    request.model = Some("fast".into());
    let output = runtime.run(request).await?;
    ensure!(output.text == "A cat it is.", "{output:?}");
    let requests = mock.take_requests();
    ensure!(requests[0].body["model"] == "other-vision");
    ensure!(requests[1].body["model"] == "text-model");
    // No speech model: the audio goes as it is.
    ensure!(
        user_contents(&requests[1].body)[0]
            .to_string()
            .contains("input_audio")
    );

    let mut unknown = media_request();
    unknown.vision_model = Some("nobody".into());
    match runtime.stream(unknown) {
        Err(RunError::UnknownModel(id)) => ensure!(id == "nobody"),
        Err(other) => bail!("expected an unknown model, got {other}"),
        Ok(_) => bail!("a run with an unknown vision model started"),
    }
    Ok(())
}

#[tokio::test]
async fn a_failing_vision_model_fails_the_call_and_says_which_model() -> Result<()> {
    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::error(
        400,
        serde_json::json!({"error": {"message": "image too large", "type": "invalid_request_error"}}),
    ));
    let runtime = runtime(&mock, &[]);
    let mut request = media_request();
    request.input = Some(Input::Content {
        content: vec![
            ContentPart::text("What is this?"),
            ContentPart::Image {
                source: ImageSource::Url {
                    url: "https://example.com/cat.png".into(),
                },
            },
        ],
    });
    let output = runtime.run(request).await?;
    ensure!(output.stop_reason == RunStopReason::Error, "{output:?}");
    let message = output.error.map(|e| e.message).unwrap_or_default();
    ensure!(
        message.contains("the vision model \"eyes\"") && message.contains("image too large"),
        "{message}"
    );
    // Only the vision model was called.
    ensure!(mock.take_requests().len() == 1);
    Ok(())
}
