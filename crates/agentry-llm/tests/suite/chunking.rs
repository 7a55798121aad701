//! Any split of any recorded stream into chunks gives the same assembled result: byte offsets
//! may fall inside an SSE line, a JSON string or a UTF-8 character.

use agentry_llm::{LlmError, decode_stream};
use agentry_testkit::{Chunking, Fixture, MockProvider, Reply};
use agentry_types::{ModelEvent, ModelResponse};
use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;

use super::support::{client, hello, protocol_of, stream_outcome};

/// The assembled result and the concatenated live text of a decode.
#[derive(Debug, PartialEq)]
struct Assembled {
    result: Result<ModelResponse, String>,
    text: String,
    thinking: String,
    arguments: String,
}

fn streaming_fixtures() -> Vec<Fixture> {
    Fixture::all()
        .expect("fixtures load")
        .into_iter()
        .filter(|fixture| fixture.status == 200 && fixture.is_streaming())
        .collect()
}

fn decode(fixture: &Fixture, cuts: &[usize]) -> Assembled {
    let body = fixture.body.as_bytes();
    let mut offsets: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
    offsets.sort_unstable();
    offsets.dedup();
    let mut chunks = Vec::new();
    let mut start = 0;
    for offset in offsets.into_iter().chain([body.len()]) {
        chunks.push(Ok::<_, LlmError>(Bytes::copy_from_slice(
            &body[start..offset],
        )));
        start = offset;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let events = decode_stream(protocol_of(fixture), futures::stream::iter(chunks));
        futures::pin_mut!(events);
        let mut assembled = Assembled {
            result: Err("no end".into()),
            text: String::new(),
            thinking: String::new(),
            arguments: String::new(),
        };
        while let Some(event) = events.next().await {
            match event {
                Ok(ModelEvent::TextDelta { text }) => assembled.text.push_str(&text),
                Ok(ModelEvent::ThinkingDelta { text }) => assembled.thinking.push_str(&text),
                Ok(ModelEvent::ToolCallDelta { arguments, .. }) => {
                    assembled.arguments.push_str(&arguments)
                }
                Ok(ModelEvent::ToolCall { .. }) => {}
                Ok(ModelEvent::Completed { response }) => assembled.result = Ok(response),
                Err(error) => assembled.result = Err(format!("{error:?}")),
            }
        }
        assembled
    })
}

#[test]
fn there_are_streaming_fixtures_of_every_protocol() {
    let fixtures = streaming_fixtures();
    for provider in ["anthropic", "ollama", "openai", "openai_compat", "local"] {
        assert!(
            fixtures.iter().any(|f| f.provider == provider),
            "no streaming fixture for {provider}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_split_gives_the_same_result(
        fixture_index in 0usize..64,
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let fixtures = streaming_fixtures();
        let fixture = &fixtures[fixture_index % fixtures.len()];
        let whole = decode(fixture, &[]);
        let split = decode(fixture, &cuts);
        prop_assert_eq!(split, whole, "fixture {}", fixture.name);
    }
}

#[test]
fn byte_by_byte_equals_whole_for_every_stream() {
    for fixture in streaming_fixtures() {
        let every_byte: Vec<usize> = (0..fixture.body.len()).collect();
        assert_eq!(
            decode(&fixture, &every_byte),
            decode(&fixture, &[]),
            "fixture {}",
            fixture.name
        );
    }
}

/// The same over real HTTP: the mock cuts the body at random offsets and sends the pieces as
/// separate writes.
#[tokio::test]
async fn split_over_http_equals_whole() {
    for fixture in streaming_fixtures() {
        let protocol = protocol_of(&fixture);
        let mock = MockProvider::start().await.expect("mock");
        mock.enqueue(Reply::fixture(fixture.clone()));
        mock.enqueue(
            Reply::fixture(fixture.clone()).chunked(Chunking::Random { seed: 7, max: 13 }),
        );
        let client = client(&mock, protocol);
        let whole = stream_outcome(&client, hello()).await;
        let split = stream_outcome(&client, hello()).await;
        assert_eq!(
            format!("{:?}", split.result),
            format!("{:?}", whole.result),
            "fixture {}",
            fixture.name
        );
        assert_eq!(split.streamed_text(), whole.streamed_text());
    }
}
