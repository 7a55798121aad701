//! HTTP transport: one pooled client, four timeouts, and the retry policy.
//!
//! Timeouts: connect (in the client), first byte (response headers), idle (gap between two body
//! chunks) and total (the whole call, retries included). Retries happen only before the first
//! output token of a call, on retryable errors (see [`crate::LlmError::is_retryable`]), with
//! exponential backoff and jitter, honouring the provider's `retry-after-ms` / `retry-after`.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use crate::error::{LlmError, TimeoutKind};

/// Timeouts and retries of a model call.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportConfig {
    /// Establishing the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// From sending the request to receiving the response headers.
    pub first_byte_timeout: Duration,
    /// The longest gap between two chunks of a streamed body.
    pub idle_timeout: Duration,
    /// The whole call, retries and backoff included; `None` for no limit.
    pub total_timeout: Option<Duration>,
    /// When and how to retry.
    pub retry: RetryPolicy,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
            total_timeout: Some(Duration::from_secs(30 * 60)),
            retry: RetryPolicy::default(),
        }
    }
}

/// Exponential backoff with jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// The first backoff.
    pub initial_backoff: Duration,
    /// The largest backoff.
    pub max_backoff: Duration,
    /// A provider asking for a longer wait than this is not retried: the error is returned.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// How long to wait before retry number `attempt` (0-based) after `error`, or `None` if
    /// it must not be retried.
    pub fn delay(&self, attempt: u32, error: &LlmError) -> Option<Duration> {
        if attempt >= self.max_retries || !error.is_retryable() {
            return None;
        }
        if let Some(wanted) = error.retry_after() {
            return (wanted <= self.max_retry_after).then_some(wanted);
        }
        let exponential = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(attempt))
            .min(self.max_backoff);
        // Up to 25% less, so that many clients do not retry in lockstep.
        let jitter = 1.0 - 0.25 * fastrand::f64();
        Some(exponential.mul_f64(jitter))
    }
}

/// Chooses the process's TLS provider (rustls with ring), which every HTTP client needs before
/// it is built; the provider is chosen once per process, so a second call does nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the shared, pooled HTTP client (rustls with the ring provider).
///
/// It never follows redirects: model providers and HTTP tools send secrets in headers (an
/// `x-api-key`, an `authorization`, any configured header), and a redirect would carry them to
/// wherever the `Location` points. A 3xx comes back as the response, and the caller reports it
/// as an error naming the target.
pub fn http_client(connect_timeout: Duration) -> Result<reqwest::Client, LlmError> {
    install_tls_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| LlmError::Configuration(format!("cannot build the HTTP client: {error}")))
}

/// Maps a reqwest error to a typed error.
pub(crate) fn request_error(error: &reqwest::Error, config: &TransportConfig) -> LlmError {
    if error.is_connect() {
        if error.is_timeout() {
            return LlmError::Timeout {
                kind: TimeoutKind::Connect,
                after: config.connect_timeout,
            };
        }
        return LlmError::Connection {
            message: error_chain(error),
        };
    }
    if error.is_timeout() {
        return LlmError::Timeout {
            kind: TimeoutKind::FirstByte,
            after: config.first_byte_timeout,
        };
    }
    LlmError::Connection {
        message: error_chain(error),
    }
}

/// The error and its sources, joined: reqwest's top-level message alone rarely says why.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Runs `future` until `deadline` (if any), reporting the total timeout.
pub(crate) async fn until_deadline<T>(
    deadline: Option<Instant>,
    total: Option<Duration>,
    future: impl Future<Output = Result<T, LlmError>>,
) -> Result<T, LlmError> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future)
            .await
            .unwrap_or_else(|_| {
                Err(LlmError::Timeout {
                    kind: TimeoutKind::Total,
                    after: total.unwrap_or_default(),
                })
            }),
        None => future.await,
    }
}

/// Resolves with the total-timeout error when `deadline` passes; never without one. Made once
/// for a whole streamed answer and polled again for each chunk (a timer made per chunk would be
/// registered with the runtime's timer and removed again for every chunk).
pub(crate) async fn past_deadline(deadline: Option<Instant>, total: Option<Duration>) -> LlmError {
    match deadline {
        Some(deadline) => {
            tokio::time::sleep_until(deadline).await;
            LlmError::Timeout {
                kind: TimeoutKind::Total,
                after: total.unwrap_or_default(),
            }
        }
        None => std::future::pending().await,
    }
}

/// The response body as a stream of chunks, with the idle timeout applied between chunks.
///
/// One timer serves the whole body: each chunk moves its deadline later, which the runtime does
/// without taking its timer lock (a `timeout` per chunk would register a timer and remove it
/// again for every chunk: at a thousand streams, tens of thousands of times a second).
pub(crate) fn body_chunks(
    response: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, LlmError>> + Send + 'static {
    let mut body = response.bytes_stream();
    async_stream::stream! {
        let idle_timer = tokio::time::sleep(idle);
        futures::pin_mut!(idle_timer);
        loop {
            idle_timer.as_mut().reset(Instant::now() + idle);
            let next = tokio::select! {
                biased;
                next = body.next() => next,
                () = &mut idle_timer => {
                    yield Err(LlmError::Timeout { kind: TimeoutKind::Idle, after: idle });
                    return;
                }
            };
            match next {
                None => return,
                Some(Ok(chunk)) => yield Ok(chunk),
                Some(Err(error)) => {
                    yield Err(LlmError::Connection { message: error_chain(&error) });
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let policy = RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(5),
        };
        let error = LlmError::Connection {
            message: "reset".into(),
        };
        for attempt in 0..10 {
            let delay = policy.delay(attempt, &error).unwrap();
            let full =
                Duration::from_millis(100 * 2u64.pow(attempt)).min(Duration::from_millis(1000));
            assert!(
                delay <= full && delay >= full.mul_f64(0.75),
                "{attempt}: {delay:?}"
            );
        }
        assert_eq!(policy.delay(10, &error), None);
        assert_eq!(policy.delay(0, &LlmError::Cancelled), None);
    }
}
