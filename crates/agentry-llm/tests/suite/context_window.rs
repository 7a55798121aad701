//! A model's context window is read from its provider (vLLM-style `GET /models`, Ollama's
//! `POST /api/show`) once, cached, and never overrides a configured window.

use std::time::Duration;

use agentry_llm::{HttpModelClient, ModelClient, Protocol, ProviderConfig};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(5);

/// What vLLM's OpenAI-compatible server answers to `GET /v1/models`.
fn vllm_listing() -> serde_json::Value {
    json!({"object": "list", "data": [
        {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "created": 1732000000,
         "owned_by": "vllm", "root": "Qwen/Qwen2.5-7B-Instruct", "parent": null,
         "max_model_len": 32768,
         "permission": [{"id": "modelperm-1", "object": "model_permission",
                         "allow_sampling": true, "allow_view": true}]},
        {"id": "my-lora", "object": "model", "owned_by": "vllm",
         "root": "Qwen/Qwen2.5-7B-Instruct", "parent": "Qwen/Qwen2.5-7B-Instruct",
         "max_model_len": 16384},
    ]})
}

/// What Ollama answers to `POST /api/show` for a model whose Modelfile sets `num_ctx`.
fn ollama_show() -> serde_json::Value {
    json!({
        "modelfile": "FROM llama3.1:8b\nPARAMETER num_ctx 16384\n",
        "parameters": "num_ctx                        16384\nstop                           \"<|eot_id|>\"",
        "template": "{{ .Prompt }}",
        "details": {"format": "gguf", "family": "llama", "parameter_size": "8.0B",
                    "quantization_level": "Q4_K_M"},
        "model_info": {"general.architecture": "llama", "general.parameter_count": 8030261248u64,
                       "llama.context_length": 131072, "llama.embedding_length": 4096},
        "capabilities": ["completion", "tools"],
    })
}

fn client(config: ProviderConfig) -> HttpModelClient {
    HttpModelClient::new(config).expect("client")
}

#[tokio::test]
async fn context_window_read_from_a_vllm_style_model_listing() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_model_metadata(vllm_listing());
    let config = ProviderConfig::new(Protocol::OpenAi, "Qwen/Qwen2.5-7B-Instruct")
        .with_base_url(mock.openai_base_url());
    let model = client(config.clone());
    // Before asking: an unknown model gets the small fallback.
    assert_eq!(model.context().window, 8_192);
    assert!(!model.context().window_known);

    assert_eq!(model.discover_context_window(TIMEOUT).await, Some(32_768));
    assert_eq!(model.context().window, 32_768);
    assert!(model.context().window_known);
    assert_eq!(mock.metadata_requests(), 1);

    // A rebuilt client for the same model (a runtime reload) asks nobody again.
    let rebuilt = client(config);
    assert_eq!(rebuilt.discover_context_window(TIMEOUT).await, Some(32_768));
    assert_eq!(rebuilt.context().window, 32_768);
    assert_eq!(mock.metadata_requests(), 1, "the answer is cached");

    // Another model of the same server: its own entry.
    let lora = client(
        ProviderConfig::new(Protocol::OpenAi, "my-lora").with_base_url(mock.openai_base_url()),
    );
    assert_eq!(lora.discover_context_window(TIMEOUT).await, Some(16_384));

    // The lookup takes no queued reply: model calls still get theirs.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("hi")));
    let response = agentry_llm::collect_response(model.stream(
        agentry_llm::ModelRequest::new(vec![agentry_types::Message::user("hello")]),
        agentry_llm::CancellationToken::new(),
    ))
    .await
    .unwrap();
    assert_eq!(response.text(), "hi");
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn context_window_read_from_an_ollama_style_model_listing() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_model_metadata(ollama_show());
    let model = client(
        ProviderConfig::new(Protocol::Ollama, "llama3.1-16k").with_base_url(mock.ollama_base_url()),
    );
    // Before asking: Ollama's default num_ctx.
    assert_eq!(model.context().window, 4_096);
    // The num_ctx the model runs with, not its trained 131072.
    assert_eq!(model.discover_context_window(TIMEOUT).await, Some(16_384));
    assert_eq!(model.context().window, 16_384);
    assert_eq!(mock.metadata_requests(), 1);

    // Without a num_ctx, Ollama runs at its default, never more than the trained length.
    let plain = MockProvider::start().await.unwrap();
    let mut show = ollama_show();
    show["parameters"] = json!("stop \"<|eot_id|>\"");
    show["model_info"]["llama.context_length"] = json!(2048);
    plain.set_model_metadata(show);
    let small = client(
        ProviderConfig::new(Protocol::Ollama, "tiny").with_base_url(plain.ollama_base_url()),
    );
    assert_eq!(small.discover_context_window(TIMEOUT).await, Some(2_048));
    assert_eq!(small.context().window, 2_048);
}

#[tokio::test]
async fn a_configured_context_window_wins_and_nothing_is_asked() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_model_metadata(vllm_listing());
    let model = client(
        ProviderConfig::new(Protocol::OpenAi, "Qwen/Qwen2.5-7B-Instruct")
            .with_base_url(mock.openai_base_url())
            .with_context_window(10_000),
    );
    assert_eq!(model.discover_context_window(TIMEOUT).await, None);
    assert_eq!(model.context().window, 10_000);
    assert_eq!(mock.metadata_requests(), 0);
}

#[tokio::test]
async fn a_failed_or_empty_lookup_keeps_the_known_window() {
    // No metadata: the server answers 404.
    let mock = MockProvider::start().await.unwrap();
    let ollama = client(
        ProviderConfig::new(Protocol::Ollama, "llama3.2").with_base_url(mock.ollama_base_url()),
    );
    assert_eq!(ollama.discover_context_window(TIMEOUT).await, None);
    assert_eq!(ollama.context().window, 4_096);
    let unknown = client(
        ProviderConfig::new(Protocol::OpenAi, "local").with_base_url(mock.openai_base_url()),
    );
    assert_eq!(unknown.discover_context_window(TIMEOUT).await, None);
    assert_eq!(unknown.context().window, 8_192);
    assert!(!unknown.context().window_known);
    assert_eq!(mock.metadata_requests(), 2);

    // A listing without the model, or with nonsense where the window should be.
    let listing = MockProvider::start().await.unwrap();
    listing.set_model_metadata(json!({"data": [
        {"id": "other", "max_model_len": 32768},
        {"id": "broken", "max_model_len": "many", "context_length": -5},
    ]}));
    for name in ["absent", "broken"] {
        let model = client(
            ProviderConfig::new(Protocol::OpenAi, name).with_base_url(listing.openai_base_url()),
        );
        assert_eq!(model.discover_context_window(TIMEOUT).await, None, "{name}");
        assert_eq!(model.context().window, 8_192, "{name}");
    }

    // Nobody listening: falls back promptly.
    let gone = client(
        ProviderConfig::new(Protocol::OpenAi, "local").with_base_url("http://127.0.0.1:9/v1"),
    );
    assert_eq!(gone.discover_context_window(TIMEOUT).await, None);
    assert_eq!(gone.context().window, 8_192);
}
