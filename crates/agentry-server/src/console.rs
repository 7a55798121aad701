//! The web console: plain JavaScript modules and CSS under `console/`, embedded in the binary at
//! compile time (no front-end build step) and served at `/` and `/console/…`.
//!
//! Every asset is served with its content type, a strong `ETag` (a hash of its bytes, so a
//! reload costs a 304), `Cache-Control: no-cache` (always revalidated: a new binary is seen at
//! once), `X-Content-Type-Options: nosniff`, and the page with a strict Content-Security-Policy
//! (`'self'` only: no inline script, nothing from elsewhere; `<style>` elements only with the
//! page's per-response nonce). The console's routes need no
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
/// and audio (attachments, recordings), styles from its own stylesheets, and `<style>` elements carrying the page's
/// nonce (the terminal panel's renderer, xterm.js, makes such elements for its theme; the page
/// stamps the nonce on them as they are created). `{nonce}` is replaced per response.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'nonce-{nonce}'; img-src 'self' data: blob:; media-src 'self' data: blob:; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// Where the page carries its nonce (`<meta name="csp-nonce" content="…">`).
const NONCE_SLOT: &str = "{{CSP_NONCE}}";

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
    "js/sandboxes.js" => "text/javascript; charset=utf-8",
    "js/terminal.js" => "text/javascript; charset=utf-8",
    "js/recorder.js" => "text/javascript; charset=utf-8",
    "js/files.js" => "text/javascript; charset=utf-8",
    "js/resize.js" => "text/javascript; charset=utf-8",
    "js/nonce.js" => "text/javascript; charset=utf-8",
    "js/rich.js" => "text/javascript; charset=utf-8",
    "js/workflows.js" => "text/javascript; charset=utf-8",
    "js/workflow-editor.js" => "text/javascript; charset=utf-8",
    "js/usage.js" => "text/javascript; charset=utf-8",
    "vendor/katex/katex.min.js" => "text/javascript; charset=utf-8",
    "vendor/mermaid/mermaid.min.js" => "text/javascript; charset=utf-8",
    "vendor/xterm/xterm.mjs" => "text/javascript; charset=utf-8",
    "vendor/xterm/addon-fit.mjs" => "text/javascript; charset=utf-8",
    "vendor/xterm/xterm.css" => "text/css; charset=utf-8",
    "vendor/uplot/uPlot.esm.js" => "text/javascript; charset=utf-8",
    "vendor/uplot/uPlot.min.css" => "text/css; charset=utf-8",
    "vendor/json-schema/json-schema.mjs" => "text/javascript; charset=utf-8",
    "vendor/yaml/yaml.mjs" => "text/javascript; charset=utf-8",
};

/// Each asset's ETag (a hash of its bytes), in `ASSETS`' order: computed once, at the first
/// request, not on every one.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let digest = Sha256::digest(asset.body.as_bytes());
            format!("\"{}\"", hex(&digest[..12]))
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
    if asset.path == "index.html" {
        return page(asset);
    }
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
    always_revalidated(headers);
    response
}

/// What every console response carries: revalidate on every use (a new binary is seen at
/// once), and no content sniffing.
fn always_revalidated(headers: &mut HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// Bytes as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The page, with a fresh nonce in its CSP and in its `csp-nonce` meta element (so never a
/// 304: each response differs).
fn page(asset: &Asset) -> Response {
    let mut bytes = [0u8; 18];
    if getrandom::fill(&mut bytes).is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no randomness for the page's nonce",
        )
            .into_response();
    }
    let nonce = hex(&bytes);
    let body = asset.body.replace(NONCE_SLOT, &nonce);
    let policy = CONTENT_SECURITY_POLICY.replace("{nonce}", &nonce);
    let mut response = ([(header::CONTENT_TYPE, asset.content_type)], body).into_response();
    let headers = response.headers_mut();
    always_revalidated(headers);
    if let Ok(policy) = HeaderValue::from_str(&policy) {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}
