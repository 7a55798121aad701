//! The Standard Webhooks rules that run deliveries (the webhooks module) and workflow triggers
//! share: where a delivery may go, signatures (`v1,` and the
//! base64 HMAC-SHA256 of `id.timestamp.body`) and `whsec_` secrets.

use std::net::IpAddr;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::AppError;

/// Loopback, private, link-local and other non-public addresses, judged as the sandboxes'
/// network proxy and `fetch` judge them.
pub fn is_private(ip: IpAddr) -> bool {
    !agentry_sandbox::is_public_address(ip)
}

/// Checks a webhook URL as submitted: `http(s)` without credentials, and no loopback or
/// private address (an IP literal, `localhost`) unless `allow_private` (a name is checked again
/// when it is resolved for each attempt).
pub fn check_webhook_url(url: &str, allow_private: bool) -> Result<(), AppError> {
    if url.len() > 2048 {
        return Err(AppError::bad_request(
            "`webhook_url` has at most 2048 characters",
        ));
    }
    let parsed = reqwest::Url::parse(url)
        .map_err(|error| AppError::bad_request(format!("`webhook_url` is not a URL: {error}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(AppError::bad_request("`webhook_url` must be http or https"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(AppError::bad_request(
            "`webhook_url` may not carry credentials: the signature authenticates the server",
        ));
    }
    let private = match parsed.host() {
        None => return Err(AppError::bad_request("`webhook_url` has no host")),
        Some(url::Host::Ipv4(ip)) => is_private(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => is_private(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
    };
    if private && !allow_private {
        return Err(AppError::bad_request(
            "`webhook_url` reaches a loopback or private address: allow it with \
             `agentry serve --webhook-allow-private`",
        ));
    }
    Ok(())
}

/// The Standard Webhooks signature of a message: `v1,` and the base64 HMAC-SHA256 of
/// `id.timestamp.body` under the secret's key (the base64 after `whsec_`).
pub fn sign(secret: &str, id: &str, timestamp: u64, body: &str) -> Result<String, AppError> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .map_err(|_| AppError::internal("the webhook secret is not base64"))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)
        .map_err(|_| AppError::internal("the webhook secret is unusable"))?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Ok(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// A new Standard Webhooks secret: `whsec_` and 32 random bytes in base64.
pub fn new_secret() -> Result<String, AppError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|error| AppError::internal(format!("no randomness: {error}")))?;
    Ok(format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}
