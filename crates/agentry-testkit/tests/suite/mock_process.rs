//! `agentry-mock`, the mock provider as a process: its first line names its URLs; its control
//! API queues scripted turns (served in order, paced when asked), records requests, resets; it
//! exits when its stdin closes.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// One chat completion request to the mock.
async fn complete(
    http: &reqwest::Client,
    openai: &str,
    body: Value,
) -> reqwest::Result<reqwest::Response> {
    http.post(format!("{openai}/chat/completions"))
        .json(&body)
        .send()
        .await
}

#[tokio::test]
async fn the_mock_process_is_scripted_over_its_control_api() -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry-mock"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next_line()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no line"))?;
    let urls: Value = serde_json::from_str(&first)?;
    let control = urls["control_url"].as_str().unwrap().to_owned();
    let openai = urls["openai_base_url"].as_str().unwrap().to_owned();
    let http = super::client::http_client();

    let queued: Value = http
        .post(format!("{control}/enqueue"))
        .json(&json!({"turns": [
            {"text": "first answer", "pace_ms": 30, "chunk_bytes": 64},
            {"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}, "id": "call_9"}]},
            {"status": 429, "error": {"error": {"message": "slow down"}}},
        ]}))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(queued, json!({"queued": 3, "pending": 3}));

    // A paced, streamed answer takes several writes.
    let started = Instant::now();
    let streamed = http
        .post(format!("{openai}/chat/completions"))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await?
        .text()
        .await?;
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "{:?}",
        started.elapsed()
    );
    let text: String = streamed
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "first answer");
    let called: Value = complete(
        &http,
        &openai,
        json!({"model": "m", "messages": [{"role": "user", "content": "call"}]}),
    )
    .await?
    .json()
    .await?;
    let call = &called["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(
        (call["id"].as_str(), call["function"]["name"].as_str()),
        (Some("call_9"), Some("lookup"))
    );
    let empty = json!({"model": "m", "messages": []});
    let refused = complete(&http, &openai, empty.clone()).await?;
    assert_eq!(refused.status().as_u16(), 429);

    let recorded: Value = http
        .get(format!("{control}/requests"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(recorded["count"], 3);
    assert_eq!(
        recorded["requests"][1]["body"]["messages"][0]["content"],
        "call"
    );

    // A fallback answers when nothing is queued; reset forgets it and the requests.
    let set = http
        .post(format!("{control}/fallback"))
        .json(&json!({"text": "always this"}))
        .send()
        .await?;
    assert_eq!(set.status().as_u16(), 204);
    let fallback: Value = complete(&http, &openai, empty.clone())
        .await?
        .json()
        .await?;
    assert_eq!(fallback["choices"][0]["message"]["content"], "always this");
    http.post(format!("{control}/reset")).send().await?;
    let recorded: Value = http
        .get(format!("{control}/requests"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(recorded["count"], 0);
    let nothing = complete(&http, &openai, empty).await?;
    assert_eq!(nothing.status().as_u16(), 500);
    // A bad script is refused.
    let bad = http
        .post(format!("{control}/enqueue"))
        .json(&json!({"turns": [{"txt": "typo"}]}))
        .send()
        .await?;
    assert!(bad.status().is_client_error());

    // Closing stdin stops it.
    drop(child.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
    assert!(status.success());
    Ok(())
}
