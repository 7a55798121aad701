//! Starting a workflow from outside: each workflow may have a trigger URL,
//! `POST /hooks/workflows/{id}`, whose JSON body becomes a run's input. It is authenticated by
//! the workflow's trigger secret (made with `POST /v1/workflows/{id}/trigger`, shown once): a
//! Standard Webhooks signature (`webhook-id`, `webhook-timestamp` within five minutes,
//! `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`), as senders
//! such as Svix, Stripe-style relays or our own webhooks make it, or the secret itself as a
//! bearer token for scripts. A delivery is idempotent: the same `webhook-id` (or, with a bearer
//! token, `Idempotency-Key`) starts one run however often it arrives, so a sender's retries
//! never start a second one.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::WorkflowRun;
use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};

/// How far a signed delivery's timestamp may be from now: older ones are replays.
const TOLERANCE_SECS: u64 = 300;
/// The longest idempotency key taken.
const MAX_KEY: usize = 256;

/// A workflow's new trigger secret, shown once.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TriggerSecret {
    /// Where deliveries go, on this server: `/hooks/workflows/{id}`.
    pub path: String,
    /// The secret (`whsec_…`): it signs deliveries, or is sent as a bearer token.
    pub secret: String,
}

/// What a delivery's headers carry.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    /// `webhook-id`.
    pub webhook_id: Option<String>,
    /// `webhook-timestamp` (Unix seconds).
    pub timestamp: Option<String>,
    /// `webhook-signature` (space-separated `v1,<base64>` entries).
    pub signature: Option<String>,
    /// `Authorization: Bearer <secret>`.
    pub bearer: Option<String>,
    /// `Idempotency-Key` (with a bearer token).
    pub idempotency_key: Option<String>,
}

/// What every trigger's secret name starts with (`/v1/env` may not write such names).
pub const SECRET_PREFIX: &str = "workflow-trigger.";

/// The secret's name in the store (sealed like every secret): bounded whatever the id.
fn secret_name(workflow: &str) -> String {
    let digest = Sha256::digest(workflow.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("{SECRET_PREFIX}{hex}")
}

fn unauthorized(why: &str) -> AppError {
    AppError::new(Failure::Unauthenticated, "unauthorized", why)
}

/// Checks a delivery against `secret`; the key that makes it idempotent, if any.
fn authenticate(
    secret: &str,
    delivery: &Delivery,
    body: &str,
    now_secs: u64,
) -> Result<Option<String>, AppError> {
    if let Some(signatures) = &delivery.signature {
        let (Some(id), Some(timestamp)) = (&delivery.webhook_id, &delivery.timestamp) else {
            return Err(unauthorized(
                "a signed delivery needs `webhook-id` and `webhook-timestamp`",
            ));
        };
        let sent: u64 = timestamp
            .parse()
            .map_err(|_| unauthorized("`webhook-timestamp` is not Unix seconds"))?;
        if sent.abs_diff(now_secs) > TOLERANCE_SECS {
            return Err(unauthorized(
                "`webhook-timestamp` is more than five minutes away from now",
            ));
        }
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.trim_start_matches("whsec_"))
            .map_err(|_| AppError::internal("the trigger secret is not base64"))?;
        let signed = signatures.split_whitespace().any(|entry| {
            let Some(encoded) = entry.strip_prefix("v1,") else {
                return false;
            };
            let Ok(given) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
                return false;
            };
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
                return false;
            };
            mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
            // Constant-time.
            mac.verify_slice(&given).is_ok()
        });
        if !signed {
            return Err(unauthorized("the delivery's signature does not match"));
        }
        return Ok(Some(format!("id:{id}")));
    }
    if let Some(bearer) = &delivery.bearer {
        // Hashes compared, so the time taken says nothing about the secret.
        if Sha256::digest(bearer.as_bytes()) != Sha256::digest(secret.as_bytes()) {
            return Err(unauthorized(
                "the bearer token is not this workflow's trigger secret",
            ));
        }
        return Ok(delivery
            .idempotency_key
            .as_ref()
            .map(|key| format!("key:{key}")));
    }
    Err(unauthorized(
        "sign the delivery (`webhook-signature`) or send the trigger secret as a bearer token",
    ))
}

/// The run id a delivery key stands for: the same key, the same run.
fn run_id_of(workflow: &str, key: &str) -> String {
    super::derived_run_id(&["trigger", workflow, key])
}

impl App {
    /// Makes (or remakes: the old one stops working at once) the trigger secret of workflow
    /// `id`, answered once.
    pub async fn create_workflow_trigger(&self, id: &str) -> Result<TriggerSecret, AppError> {
        self.workflows().get(id).await?;
        let secret = crate::standard_webhooks::new_secret()?;
        self.parts
            .store
            .put_secret(&secret_name(id), &secret)
            .await?;
        Ok(TriggerSecret {
            path: format!("/hooks/workflows/{id}"),
            secret,
        })
    }

    /// Removes workflow `id`'s trigger: its URL answers 401 from now on.
    pub async fn delete_workflow_trigger(&self, id: &str) -> Result<(), AppError> {
        self.workflows().get(id).await?;
        if !self.parts.store.delete_secret(&secret_name(id)).await? {
            return Err(AppError::not_found(format!(
                "workflow {id:?} has no trigger"
            )));
        }
        Ok(())
    }

    /// Starts workflow `id` for a delivery of `body` (its input: a JSON object; empty for
    /// `{}`). `(run, true)` when it started a run; `(run, false)` when the delivery was seen
    /// before and `run` is the one it started then. 401 for anything not authenticated,
    /// whether or not the workflow or its trigger exists.
    pub async fn trigger_workflow(
        &self,
        id: &str,
        delivery: &Delivery,
        body: &[u8],
    ) -> Result<(WorkflowRun, bool), AppError> {
        let missing = || unauthorized("no trigger for this workflow, or not authenticated");
        if crate::config::check_name("workflow", id).is_err() {
            return Err(missing());
        }
        let Some(secret) = self.parts.store.reveal_secret(&secret_name(id)).await? else {
            return Err(missing());
        };
        let body = std::str::from_utf8(body)
            .map_err(|_| AppError::bad_request("the body is not UTF-8"))?;
        let now_secs = crate::clock::now_ms() / 1000;
        let key = authenticate(&secret, delivery, body, now_secs)?;
        if key.as_ref().is_some_and(|key| key.len() > MAX_KEY) {
            return Err(AppError::bad_request(format!(
                "the delivery's id or idempotency key is longer than {MAX_KEY} bytes"
            )));
        }
        let input: serde_json::Value = if body.trim().is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(body)
                .map_err(|error| AppError::bad_request(format!("the body is not JSON: {error}")))?
        };
        let run_id = key.as_ref().map(|key| run_id_of(id, key));
        if let Some(run_id) = &run_id
            && let Some(run) = self.workflows().stored_run(run_id).await?
        {
            return Ok((run, false));
        }
        match self
            .workflows()
            .start_run(&Principal::operator(), id, input, None, run_id.clone())
            .await
        {
            Ok(run) => Ok((run, true)),
            // The same delivery, twice at once: the other started it.
            Err(error) if error.failure == Failure::Conflict => match &run_id {
                Some(run_id) => self
                    .workflows()
                    .stored_run(run_id)
                    .await?
                    .map(|run| (run, false))
                    .ok_or(error),
                None => Err(error),
            },
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn signed(id: &str, timestamp: u64, body: &str) -> Delivery {
        Delivery {
            webhook_id: Some(id.into()),
            timestamp: Some(timestamp.to_string()),
            signature: Some(format!(
                "v1,bm90IGl0 {}",
                crate::standard_webhooks::sign(SECRET, id, timestamp, body).unwrap()
            )),
            ..Delivery::default()
        }
    }

    #[test]
    fn signatures_timestamps_and_bearer_tokens_are_checked() {
        let now = 1_700_000_000;
        let good = signed("msg_1", now, "{\"a\":1}");
        assert_eq!(
            authenticate(SECRET, &good, "{\"a\":1}", now + 10).unwrap(),
            Some("id:msg_1".into())
        );
        // Another body, an old timestamp, another secret, no signature at all.
        assert!(authenticate(SECRET, &good, "{\"a\":2}", now).is_err());
        assert!(authenticate(SECRET, &good, "{\"a\":1}", now + 301).is_err());
        assert!(authenticate("whsec_b3RoZXI=", &good, "{\"a\":1}", now).is_err());
        assert!(authenticate(SECRET, &Delivery::default(), "", now).is_err());
        let mut unsigned_id = good.clone();
        unsigned_id.webhook_id = None;
        assert!(authenticate(SECRET, &unsigned_id, "{\"a\":1}", now).is_err());
        // The secret as a bearer token, with or without an idempotency key.
        let bearer = Delivery {
            bearer: Some(SECRET.into()),
            idempotency_key: Some("k1".into()),
            ..Delivery::default()
        };
        assert_eq!(
            authenticate(SECRET, &bearer, "", now).unwrap(),
            Some("key:k1".into())
        );
        let wrong = Delivery {
            bearer: Some("whsec_wrong".into()),
            ..Delivery::default()
        };
        assert!(authenticate(SECRET, &wrong, "", now).is_err());
        // One delivery key, one run id; another key or workflow, another.
        assert_eq!(run_id_of("w", "id:a"), run_id_of("w", "id:a"));
        assert_ne!(run_id_of("w", "id:a"), run_id_of("w", "id:b"));
        assert_ne!(run_id_of("w", "id:a"), run_id_of("v", "id:a"));
        assert!(uuid::Uuid::parse_str(&run_id_of("w", "id:a")).is_ok());
    }
}
