//! Webhooks: a background run that names a `webhook_url` has it told when the run stops —
//! `run.succeeded`, `run.failed`, `run.cancelled`, or `run.waiting` / `run.paused` when a person
//! is needed — by a POST signed the Standard Webhooks way: `webhook-id` (one per run, event and
//! URL, for good), `webhook-timestamp` and `webhook-signature` (`v1,` and the base64
//! HMAC-SHA256 of `id.timestamp.body` under the server's signing secret, which
//! [`App::rotate_webhook_secret`] makes and shows once).
//!
//! Deliveries go through the store's outbox ([`agentry_store::Store::enqueue_delivery`]): the
//! worker's loop claims due ones, sends them without following redirects, and retries a failed
//! one with exponential backoff up to a number of attempts; a restart resumes them with the same
//! ids. A URL must be `http(s)` without credentials, and may not reach loopback or private
//! addresses unless the server allows it (`--webhook-allow-private`): an IP literal is checked
//! when the run is submitted, a name when it is resolved for each attempt.

use std::time::{Duration, Instant};

use serde::Serialize;

use agentry_store::{AttemptOutcome, AttemptRecord, DeliveryRecord, RunState};
use agentry_types::RunId;

use crate::App;
use crate::clock::{millis, now_ms};
use crate::error::AppError;
use crate::queue::{RunView, WebhookSettings};
use crate::standard_webhooks::{check_webhook_url, is_private, new_secret, sign};

/// The secret's name in the store (sealed like every secret); a key's own is
/// `AGENTRY_WEBHOOK_SECRET.<key id>`.
const SECRET_NAME: &str = "AGENTRY_WEBHOOK_SECRET";

/// The name of the secret `key`'s deliveries are signed with (`None`: the server's).
fn secret_name(key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{SECRET_NAME}.{key}"),
        None => SECRET_NAME.to_owned(),
    }
}

/// Whether `name` is a secret only its own endpoint writes (a webhook signing secret, a
/// workflow trigger's): `/v1/env` may not overwrite or delete it.
pub fn is_reserved_secret(name: &str) -> bool {
    name == SECRET_NAME
        || name
            .strip_prefix(SECRET_NAME)
            .is_some_and(|rest| rest.starts_with('.'))
        || name.starts_with(crate::workflows::triggers::SECRET_PREFIX)
}

/// How long a claimed delivery is held before another process may try it.
const HOLD_MS: u64 = 60_000;

/// `POST /v1/webhook-secret`: the new signing secret, shown this once.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookSecret {
    /// `whsec_` and the base64 of 32 random bytes: verify `webhook-signature` with it.
    pub secret: String,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// 1, 2, 3…
    pub attempt: u32,
    /// When, Unix milliseconds.
    pub at: u64,
    /// The receiver's HTTP status.
    pub status: Option<u16>,
    /// Why it failed.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
}

/// A webhook delivery of a run.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// Its `webhook-id`.
    pub id: String,
    /// `run.succeeded`, `run.failed`, `run.cancelled`, `run.waiting` or `run.paused`.
    pub event: String,
    /// Where it goes.
    pub url: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it is tried next (pending), Unix milliseconds.
    pub next_attempt_at: Option<u64>,
    /// When it was delivered.
    pub delivered_at: Option<u64>,
    /// Every attempt.
    pub log: Vec<AttemptView>,
}

/// `GET /v1/runs/{run_id}/webhooks`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryList {
    /// The run's deliveries, oldest first.
    pub deliveries: Vec<DeliveryView>,
}

impl App {
    /// Makes a new signing secret (the old one stops signing at once) and answers it: it is not
    /// shown again.
    pub async fn rotate_webhook_secret(
        &self,
        caller: &crate::auth::Principal,
    ) -> Result<WebhookSecret, AppError> {
        let secret = new_secret()?;
        let key = if caller.is_admin() {
            None
        } else {
            caller.key_id.as_deref()
        };
        self.parts
            .store
            .put_secret(&secret_name(key), &secret)
            .await?;
        Ok(WebhookSecret { secret })
    }

    /// The secret deliveries of `owner`'s runs are signed with: the key's own, else the
    /// server's.
    async fn webhook_secret(&self, owner: Option<&str>) -> Result<Option<String>, AppError> {
        if let Some(key) = owner
            && let Some(own) = self
                .parts
                .store
                .reveal_secret(&secret_name(Some(key)))
                .await?
        {
            return Ok(Some(own));
        }
        Ok(self.parts.store.reveal_secret(SECRET_NAME).await?)
    }

    /// Checks a submitted run's webhook: the URL, and that a signing secret exists for the
    /// run's owner.
    pub(crate) async fn check_webhook(
        &self,
        url: &str,
        owner: Option<&str>,
    ) -> Result<(), AppError> {
        check_webhook_url(url, self.queue_settings().webhooks.allow_private)?;
        if self.webhook_secret(owner).await?.is_none() {
            return Err(AppError::bad_request(
                "no webhook signing secret yet: make one with `POST /v1/webhook-secret` (it is \
                 shown once) before submitting runs with a `webhook_url`",
            ));
        }
        Ok(())
    }

    /// After a background run stopped: its webhook (if it names one) hears of it.
    pub(crate) async fn tell_webhook(&self, run_id: RunId) {
        let record = match self.parts.store.run_record(run_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(run = %run_id, "reading a run for its webhook failed: {error}");
                return;
            }
        };
        let Some(url) = record.webhook_url.clone() else {
            return;
        };
        let event = match record.state {
            RunState::Queued | RunState::Running => return,
            state => format!("run.{}", state.as_str()),
        };
        // The key whose run it is: a receiver tells whose runs it hears of (and each key may
        // sign with a secret of its own).
        let owner = record.owner.clone();
        let payload = serde_json::json!({
            "type": event,
            "timestamp": now_ms(),
            "key_id": owner,
            "data": RunView::from(record),
        });
        self.enqueue_webhook(&run_id.to_string(), &event, &url, &payload)
            .await;
    }

    /// Puts a delivery of `event` about run `run` (a run's or a workflow run's id) in the
    /// outbox, under a new id unless one is there already, and wakes the sender.
    async fn enqueue_webhook(
        &self,
        run: &str,
        event: &str,
        url: &str,
        payload: &serde_json::Value,
    ) {
        let id = format!("msg_{}", RunId::new());
        match self
            .parts
            .store
            .enqueue_delivery(&id, run, event, url, payload)
            .await
        {
            Ok(_) => self.parts.queue.notify(),
            Err(error) => {
                tracing::warn!(run, "queueing a webhook delivery failed: {error}");
            }
        }
    }

    /// After a workflow run ended: its webhook (if it has one) hears of it, as
    /// `workflow.<state>` with the run's summary (not its steps: `GET
    /// /v1/workflow-runs/{id}` has them).
    pub(crate) async fn tell_workflow_webhook(&self, run: &crate::workflows::WorkflowRun) {
        let Some(url) = &run.webhook_url else {
            return;
        };
        let state = serde_json::to_value(run.state).unwrap_or_default();
        let event = format!("workflow.{}", state.as_str().unwrap_or("ended"));
        let payload = serde_json::json!({
            "type": event,
            "timestamp": now_ms(),
            "key_id": run.owner,
            "data": {
                "run_id": run.run_id,
                "workflow_id": run.workflow_id,
                "version": run.version,
                "state": state,
                "output": run.output,
                "error": run.error,
                "parent": run.parent,
                "created_at": run.created_at,
                "finished_at": run.finished_at,
            },
        });
        self.enqueue_webhook(&run.run_id, &event, url, &payload)
            .await;
    }

    /// Sends the deliveries due now (the worker's loop calls it).
    pub(crate) async fn deliver_due_webhooks(&self) {
        let claimed = match self.parts.store.claim_deliveries(16, HOLD_MS).await {
            Ok(claimed) => claimed,
            Err(error) => {
                tracing::warn!("claiming webhook deliveries failed: {error}");
                return;
            }
        };
        for delivery in claimed {
            let app = self.clone();
            tokio::spawn(async move { app.deliver(delivery).await });
        }
    }

    async fn deliver(&self, delivery: DeliveryRecord) {
        let settings = self.queue_settings().webhooks;
        let attempt = delivery.attempts + 1;
        let started = Instant::now();
        let at = now_ms();
        let result = self.send(&delivery, &settings).await;
        let duration_ms = millis(started.elapsed());
        let (status, error, delivered) = match result {
            Ok(status) if (200..300).contains(&status) => (Some(status), None, true),
            Ok(status) => (
                Some(status),
                Some(format!("the receiver answered {status}")),
                false,
            ),
            Err(error) => (None, Some(error), false),
        };
        let outcome = if delivered {
            AttemptOutcome::Delivered
        } else if attempt >= settings.max_attempts {
            AttemptOutcome::GaveUp
        } else {
            let doubled = settings
                .backoff
                .saturating_mul(1u32 << (attempt - 1).min(16))
                .min(Duration::from_secs(3600));
            AttemptOutcome::RetryAt(now_ms().saturating_add(millis(doubled)))
        };
        let record = AttemptRecord {
            attempt,
            at,
            status,
            error,
            duration_ms,
        };
        if let Err(error) = self
            .parts
            .store
            .record_attempt(&delivery.id, &record, outcome)
            .await
        {
            tracing::warn!(delivery = %delivery.id, "logging a webhook attempt failed: {error}");
        }
    }

    /// One attempt: the receiver's status, or why there was none.
    async fn send(
        &self,
        delivery: &DeliveryRecord,
        settings: &WebhookSettings,
    ) -> Result<u16, String> {
        let url = reqwest::Url::parse(&delivery.url).map_err(|error| error.to_string())?;
        // The addresses are checked here for a clear error, and again by the client's resolver
        // when it connects (a name could resolve elsewhere by then: DNS rebinding).
        if !settings.allow_private
            && let Some(host) = url.host_str()
        {
            let port = url.port_or_known_default().unwrap_or(443);
            let addresses = tokio::net::lookup_host((host, port))
                .await
                .map_err(|error| format!("cannot resolve {host}: {error}"))?;
            for address in addresses {
                if is_private(address.ip()) {
                    return Err(format!(
                        "{host} resolves to a private address ({}): refused",
                        address.ip()
                    ));
                }
            }
        }
        let owner = delivery.payload.get("key_id").and_then(|key| key.as_str());
        let secret = self
            .webhook_secret(owner)
            .await
            .map_err(|error| error.message)?
            .ok_or("no webhook signing secret")?;
        let body = serde_json::to_string(&delivery.payload).map_err(|error| error.to_string())?;
        let timestamp = now_ms() / 1000;
        let signature =
            sign(&secret, &delivery.id, timestamp, &body).map_err(|error| error.message)?;
        // The trace the delivery belongs to goes on to the receiver.
        let mut traced = reqwest::header::HeaderMap::new();
        agentry_llm::trace_context::inject(&mut traced);
        let response = self
            .parts
            .queue
            .webhook_client(settings.allow_private)?
            .post(url)
            .headers(traced)
            .timeout(settings.timeout)
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|error| error.to_string())?;
        Ok(response.status().as_u16())
    }

    /// A background run's webhook deliveries, with every attempt.
    pub async fn run_webhooks(&self, run_id: RunId) -> Result<DeliveryList, AppError> {
        self.background_runs().get(run_id).await?;
        self.deliveries(&run_id.to_string()).await
    }

    /// A workflow run's webhook deliveries, with every attempt.
    pub async fn workflow_run_webhooks(
        &self,
        caller: &crate::auth::Principal,
        run_id: &str,
    ) -> Result<DeliveryList, AppError> {
        self.workflows().run(caller, run_id).await?;
        self.deliveries(run_id).await
    }

    /// The deliveries of a run's or a workflow run's webhook.
    async fn deliveries(&self, run_id: &str) -> Result<DeliveryList, AppError> {
        let deliveries = self
            .parts
            .store
            .deliveries_of_run(run_id)
            .await?
            .into_iter()
            .map(|(delivery, attempts)| DeliveryView {
                next_attempt_at: (delivery.state == "pending").then_some(delivery.next_attempt_at),
                id: delivery.id,
                event: delivery.event,
                url: delivery.url,
                state: delivery.state,
                attempts: delivery.attempts,
                delivered_at: delivery.delivered_at,
                log: attempts
                    .into_iter()
                    .map(|attempt| AttemptView {
                        attempt: attempt.attempt,
                        at: attempt.at,
                        status: attempt.status,
                        error: attempt.error,
                        duration_ms: attempt.duration_ms,
                    })
                    .collect(),
            })
            .collect();
        Ok(DeliveryList { deliveries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that resolves to loopback when the delivery connects (DNS rebinding, the second
    /// security review's N3) reaches nothing: the client itself connects only to public
    /// addresses, whatever was checked before.
    #[tokio::test]
    async fn the_delivery_client_connects_to_no_private_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let queue = crate::queue::QueueState::default();
        let refused = queue
            .webhook_client(false)
            .unwrap()
            .post(format!("http://localhost:{port}/hook"))
            .body("{}")
            .send()
            .await;
        let error = refused.expect_err("a loopback address is never reached");
        let mut reasons = Vec::new();
        let mut cause: Option<&dyn std::error::Error> = Some(&error);
        while let Some(error) = cause {
            reasons.push(error.to_string());
            cause = error.source();
        }
        assert!(
            reasons
                .iter()
                .any(|reason| reason.contains("loopback, private or link-local")),
            "{reasons:?}"
        );
        // Nothing connected.
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "the listener was reached");
        // With `--webhook-allow-private` the same name is reached.
        let reached = tokio::spawn(async move { listener.accept().await.is_ok() });
        let allowed = queue
            .webhook_client(true)
            .unwrap()
            .post(format!("http://localhost:{port}/hook"))
            .timeout(Duration::from_millis(500))
            .body("{}")
            .send()
            .await;
        drop(allowed);
        assert!(reached.await.unwrap());
    }
}
