//! tus 1.0 (core, creation, termination, checksum) at `/linglong/v1/workspace/tus`, over the
//! app's [`agentry_app::tus`]: `OPTIONS` says what is served ([`gate`]), `POST` creates an upload
//! (`Upload-Length`, `Upload-Metadata` naming `session_id` and `target_path`), `HEAD` answers
//! its offset, `PATCH` (`application/offset+octet-stream` at `Upload-Offset`, with an optional
//! `Upload-Checksum`) appends, `DELETE` removes it. Every answer carries `Tus-Resumable`; a
//! request without the version it speaks is a 412 ([`gate`]).

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{head, post};

use agentry_app::error::AppError;
use agentry_app::tus::TUS_CHECKSUMS;
use agentry_app::workspace_files::WorkspaceLimits;
use base64::Engine as _;

use super::SeedError;
use crate::authorization::Caller;
use crate::state::AppState;

/// The protocol version served.
const TUS_VERSION: &str = "1.0.0";

/// The extensions served.
const TUS_EXTENSIONS: &str = "creation,termination,checksum";

/// Where uploads are created; an upload is `<this>/<id>`.
const TUS_PATH: &str = "/linglong/v1/workspace/tus";

/// The tus routes, under `/linglong/v1`.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/workspace/tus", post(create)).route(
        "/workspace/tus/{id}",
        head(offset).patch(patch).delete(terminate),
    )
}

/// An answer with `Tus-Resumable` (and more headers).
fn answer(status: StatusCode, headers: &[(&'static str, String)]) -> Response {
    let mut response = (status, Body::empty()).into_response();
    let map = response.headers_mut();
    map.insert("tus-resumable", HeaderValue::from_static(TUS_VERSION));
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            map.insert(*name, value);
        }
    }
    response
}

/// An error, with `Tus-Resumable`; a checksum mismatch is tus's 460.
fn failed(error: AppError) -> Response {
    let mismatch = error.code == "checksum_mismatch";
    let mut response = SeedError::from(error).into_response();
    if mismatch && let Ok(status) = StatusCode::from_u16(460) {
        *response.status_mut() = status;
    }
    response
        .headers_mut()
        .insert("tus-resumable", HeaderValue::from_static(TUS_VERSION));
    response
}

/// A header as a number.
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn not_a_number(name: &str) -> Response {
    failed(AppError::bad_request(format!("{name} must be a number")))
}

fn text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// What every tus request passes first, as a middleware outside the CORS layer (which would
/// otherwise answer every `OPTIONS` as a preflight): discovery (`OPTIONS` on the tus paths that
/// is not a browser's preflight, which names `Access-Control-Request-Method`) is answered here,
/// and any other request that does not speak tus 1.0.0 (`Tus-Resumable`) is a 412.
pub(crate) async fn gate(request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with(TUS_PATH) {
        return next.run(request).await;
    }
    let headers = request.headers();
    if request.method() == Method::OPTIONS {
        if headers.contains_key("access-control-request-method") {
            return next.run(request).await;
        }
        return discover();
    }
    if headers.get("tus-resumable").and_then(|v| v.to_str().ok()) != Some(TUS_VERSION) {
        return answer(
            StatusCode::PRECONDITION_FAILED,
            &[("tus-version", TUS_VERSION.to_owned())],
        );
    }
    next.run(request).await
}

fn discover() -> Response {
    let limits = WorkspaceLimits::default();
    answer(
        StatusCode::NO_CONTENT,
        &[
            ("tus-version", TUS_VERSION.to_owned()),
            ("tus-extension", TUS_EXTENSIONS.to_owned()),
            ("tus-max-size", limits.max_upload_bytes.to_string()),
            ("tus-checksum-algorithm", TUS_CHECKSUMS.to_owned()),
        ],
    )
}

/// An app outcome as a tus answer.
fn respond(outcome: Result<Response, AppError>) -> Response {
    outcome.unwrap_or_else(failed)
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
) -> Response {
    let Some(length) = number(&headers, "upload-length") else {
        return not_a_number("Upload-Length");
    };
    let metadata = match parse_metadata(&text(&headers, "upload-metadata").unwrap_or_default()) {
        Ok(metadata) => metadata,
        Err(error) => return failed(error),
    };
    respond(
        state
            .app
            .tus_create(&caller, length, &metadata, WorkspaceLimits::default())
            .await
            .map(|upload| {
                answer(
                    StatusCode::CREATED,
                    &[("location", format!("{TUS_PATH}/{}", upload.upload_id))],
                )
            }),
    )
}

async fn offset(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    respond(
        state
            .app
            .tus_offset(&caller, &id)
            .await
            .map(|(offset, length)| {
                answer(
                    StatusCode::OK,
                    &[
                        ("upload-offset", offset.to_string()),
                        ("upload-length", length.to_string()),
                        ("cache-control", "no-store".to_owned()),
                    ],
                )
            }),
    )
}

async fn patch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if text(&headers, "content-type").as_deref() != Some("application/offset+octet-stream") {
        return answer(StatusCode::UNSUPPORTED_MEDIA_TYPE, &[]);
    }
    let Some(offset) = number(&headers, "upload-offset") else {
        return not_a_number("Upload-Offset");
    };
    let checksum = text(&headers, "upload-checksum");
    respond(
        state
            .app
            .tus_patch(&caller, &id, offset, checksum, body.into_data_stream())
            .await
            .map(|offset| {
                answer(
                    StatusCode::NO_CONTENT,
                    &[("upload-offset", offset.to_string())],
                )
            }),
    )
}

async fn terminate(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    respond(
        state
            .app
            .tus_terminate(&caller, &id)
            .await
            .map(|()| answer(StatusCode::NO_CONTENT, &[])),
    )
}

/// `Upload-Metadata`: comma-separated `key base64(value)` pairs (a key may come alone).
fn parse_metadata(header: &str) -> Result<Vec<(String, String)>, AppError> {
    let mut pairs = Vec::new();
    for item in header
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let mut parts = item.split(' ').filter(|part| !part.is_empty());
        let key = parts.next().unwrap_or_default();
        let value = match parts.next() {
            Some(encoded) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| {
                        AppError::bad_request(format!("Upload-Metadata: {key} is not base64"))
                    })?;
                String::from_utf8(bytes).map_err(|_| {
                    AppError::bad_request(format!("Upload-Metadata: {key} is not UTF-8"))
                })?
            }
            None => String::new(),
        };
        if parts.next().is_some() || key.is_empty() {
            return Err(AppError::bad_request(format!(
                "Upload-Metadata: {item:?} is not `key base64value`"
            )));
        }
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_pairs_are_decoded_and_bad_ones_refused() {
        let pairs = parse_metadata("filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential")
            .unwrap();
        assert_eq!(
            pairs,
            vec![
                (
                    "filename".to_owned(),
                    "world_domination_plan.pdf".to_owned()
                ),
                ("is_confidential".to_owned(), String::new()),
            ]
        );
        assert!(parse_metadata("filename !!!").is_err());
        assert!(parse_metadata("a b c").is_err());
    }
}
