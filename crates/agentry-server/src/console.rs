//! The web console: plain JavaScript modules and CSS under `console/`, embedded in the binary at
//! compile time (no front-end build step) and served at `/` and `/console/…`.
//!
//! Every asset is served with its content type, a strong `ETag` (a hash of its bytes, so a
//! reload costs a 304), `Cache-Control: no-cache` (always revalidated: a new binary is seen at
//! once), `X-Content-Type-Options: nosniff`, and the page with a strict Content-Security-Policy
//! (`'self'` only: no inline script, nothing from elsewhere). The console's routes need no
//! authentication — the page shows a login form when the API asks for a key — and are not in
//! the OpenAPI document.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// What the console page may load: only its own assets, its own API, `data:`/`blob:` images
/// (attachments), and styles from its own stylesheet.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'; form-action 'self'";

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! assets {
    ($($path:literal => $content_type:literal,)*) => {
        &[$(Asset {
            path: $path,
            content_type: $content_type,
            body: include_str!(concat!("../console/", $path)),
        },)*]
    };
}

/// Every file of the console.
const ASSETS: &[Asset] = assets! {
    "index.html" => "text/html; charset=utf-8",
    "console.css" => "text/css; charset=utf-8",
    "favicon.svg" => "image/svg+xml",
    "js/app.js" => "text/javascript; charset=utf-8",
    "js/api.js" => "text/javascript; charset=utf-8",
    "js/dom.js" => "text/javascript; charset=utf-8",
    "js/markdown.js" => "text/javascript; charset=utf-8",
    "js/sidebar.js" => "text/javascript; charset=utf-8",
    "js/chat.js" => "text/javascript; charset=utf-8",
    "js/settings.js" => "text/javascript; charset=utf-8",
    "js/trace.js" => "text/javascript; charset=utf-8",
    "js/runs.js" => "text/javascript; charset=utf-8",
    "js/schedules.js" => "text/javascript; charset=utf-8",
};

/// Each asset's ETag (a hash of its bytes), in `ASSETS`' order: computed once, at the first
/// request, not on every one.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let digest = Sha256::digest(asset.body.as_bytes());
            let hex: String = digest[..12]
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            format!("\"{hex}\"")
        })
        .collect()
});

/// The console's routes: `/` (the page) and `/console/{path}` (its assets).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/console/{*path}", get(asset))
}

/// The paths of every embedded asset (for tests and checks).
pub fn asset_paths() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|asset| asset.path)
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

fn serve(path: &str, request: &HeaderMap) -> Response {
    let Some((index, asset)) = ASSETS
        .iter()
        .enumerate()
        .find(|(_, asset)| asset.path == path)
    else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such console file",
        )
            .into_response();
    };
    let etag = ETAGS.get(index).map_or("", String::as_str);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if asset.path == "index.html" {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
    }
    response
}
