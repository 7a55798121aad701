//! An OTLP/HTTP receiver for tests and benchmarks: a loopback server that answers `200` to
//! every export and keeps what it was sent — each body parsed as JSON when it is JSON
//! (`OTEL_EXPORTER_OTLP_PROTOCOL=http/json`), and the total bytes either way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::error::TestkitError;

/// The largest export body read (bigger ones end the connection).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A running receiver; it stops when the runtime it was started on does.
#[derive(Debug, Clone)]
pub struct OtlpReceiver {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
    bytes: Arc<AtomicU64>,
}

impl OtlpReceiver {
    /// Starts a receiver on a free loopback port.
    pub async fn start() -> Result<Self, TestkitError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(TestkitError::Bind)?;
        let port = listener.local_addr().map_err(TestkitError::Bind)?.port();
        let receiver = Self {
            port,
            bodies: Arc::default(),
            bytes: Arc::default(),
        };
        let kept = receiver.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(kept.clone().serve(socket));
            }
        });
        Ok(receiver)
    }

    /// The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it (traces go to `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The JSON bodies received so far, in order (others are `null`).
    pub fn json_bodies(&self) -> Vec<Value> {
        self.bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The bytes of every body received so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads requests from one connection (keep-alive) and answers each.
    async fn serve(self, socket: tokio::net::TcpStream) {
        let mut reader = BufReader::new(socket);
        loop {
            let mut length = 0usize;
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                let header = line.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            if length > MAX_BODY {
                return;
            }
            let mut body = vec![0_u8; length];
            if reader.read_exact(&mut body).await.is_err() {
                return;
            }
            self.bytes.fetch_add(length as u64, Ordering::Relaxed);
            self.bodies
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
            let answer =
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
            if reader.get_mut().write_all(answer).await.is_err() {
                return;
            }
        }
    }
}
