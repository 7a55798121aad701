//! Model providers are never followed across redirects: the request carries the API key, and a
//! 307 to another server must not hand it over.

use agentry_llm::{LlmError, Protocol};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};

use super::support::{client, hello, stream_outcome};

#[tokio::test]
async fn a_provider_redirect_is_an_error_naming_the_target_and_the_key_stays_put() {
    for (protocol, key_header) in [
        (Protocol::Anthropic, "x-api-key"),
        (Protocol::OpenAi, "authorization"),
    ] {
        // The second server would answer normally; the first redirects the call to it.
        let second = MockProvider::start().await.unwrap();
        second.set_fallback(Reply::scripted(ScriptedTurn::text("stolen")));
        let target = format!("{}/v1/messages", second.base_url());
        let first = MockProvider::start().await.unwrap();
        first.set_fallback(Reply::raw(
            307,
            vec![("location".into(), target.clone())],
            "",
        ));

        let outcome = stream_outcome(&client(&first, protocol), hello()).await;
        let LlmError::Provider(error) = outcome.error() else {
            panic!(
                "{protocol:?}: expected a provider error, got {:?}",
                outcome.error()
            );
        };
        assert_eq!(error.status, Some(307), "{protocol:?}");
        assert!(
            error.message.contains(&format!("redirected to {target}")),
            "{protocol:?}: {}",
            error.message
        );
        assert!(!outcome.error().is_retryable(), "{protocol:?}");
        // The first server saw the key (so the header was really sent) and only once; the
        // second saw nothing at all.
        let requests = first.requests();
        assert_eq!(requests.len(), 1, "{protocol:?}");
        assert!(requests[0].header(key_header).is_some(), "{protocol:?}");
        assert_eq!(
            second.request_count(),
            0,
            "{protocol:?}: the target was reached"
        );
    }
}
