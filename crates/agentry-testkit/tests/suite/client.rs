//! The HTTP client the tests talk to the mock with.

use std::time::Duration;

/// A plain reqwest client (no proxy, default pooling), with the rustls provider installed.
pub(super) fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build reqwest client")
}

/// Reads a response body chunk by chunk, returning the bytes seen, the number of non-empty
/// reads, and whether the body ended cleanly (`Ok`) or with an error.
pub(super) async fn read_chunks(
    mut response: reqwest::Response,
) -> (Vec<u8>, usize, Result<(), reqwest::Error>) {
    let mut bytes = Vec::new();
    let mut reads = 0;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if !chunk.is_empty() {
                    reads += 1;
                    bytes.extend_from_slice(&chunk);
                }
            }
            Ok(None) => return (bytes, reads, Ok(())),
            Err(error) => return (bytes, reads, Err(error)),
        }
    }
}
