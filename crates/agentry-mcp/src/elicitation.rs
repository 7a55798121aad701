//! Elicitation: an MCP server asking a person for input in the middle of a tool call.
//!
//! A call made with [`CallOptions::elicitation`](crate::CallOptions) registers a route for the
//! time it is in flight. When its server sends `elicitation/create`, the request goes to the
//! routes of that server's calls in flight (stdio gives no way to tell which call asked, so
//! with several in flight each of them sees it, and the first answer wins); the caller shows it
//! to a person and answers through the [`ElicitationResponder`]. While a request waits, the
//! calls it went to do not time out for want of progress (their hard cap still holds). With no
//! call in flight that takes elicitations (a direct call, or none at all), the request is
//! declined with [`ELICITATION_DECLINED`](crate::ELICITATION_DECLINED).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// What a server asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ElicitationKind {
    /// A form: the answer is an object matching `requested_schema` (a flat object schema of
    /// strings, numbers, booleans and enums).
    Form {
        /// The JSON Schema the answer must match.
        requested_schema: Value,
    },
    /// A page the person must visit (to sign in, pay…): the answer says whether they did.
    Url {
        /// The page.
        url: String,
        /// The server's id for this request (empty when the protocol has none).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        elicitation_id: String,
    },
}

/// A person's answer to an elicitation.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitationAnswer {
    /// They gave what was asked: for a form, the object (checked against the schema by the
    /// caller); for a URL, nothing (`Value::Null`).
    Accept(Value),
    /// They declined to answer; the tool goes on without it.
    Decline,
    /// They cancelled the whole operation.
    Cancel,
}

/// The one answer an elicitation gets. Clones share it: the first `answer` wins. When every
/// clone is dropped unanswered, the server is told the request was cancelled.
#[derive(Debug, Clone)]
pub struct ElicitationResponder(Arc<Mutex<Option<oneshot::Sender<ElicitationAnswer>>>>);

impl ElicitationResponder {
    fn new() -> (Self, oneshot::Receiver<ElicitationAnswer>) {
        let (sender, receiver) = oneshot::channel();
        (Self(Arc::new(Mutex::new(Some(sender)))), receiver)
    }

    /// Answers the request. `false` when it was answered already (or the server gave up).
    pub fn answer(&self, answer: ElicitationAnswer) -> bool {
        let sender = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        sender.is_some_and(|sender| sender.send(answer).is_ok())
    }

    /// Whether the request still waits for an answer.
    pub fn is_open(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|sender| !sender.is_closed())
    }
}

/// One elicitation request, as a call's route receives it.
#[derive(Debug, Clone)]
pub struct ElicitationRequest {
    /// The server asking.
    pub server: String,
    /// What it asks, in words for a person.
    pub message: String,
    /// A form or a URL.
    pub kind: ElicitationKind,
    /// Where the answer goes.
    pub responder: ElicitationResponder,
}

/// What a call in flight listens with.
#[derive(Debug, Clone)]
struct Route {
    requests: mpsc::UnboundedSender<ElicitationRequest>,
    /// How many requests sent to this call wait for an answer.
    waiting: Arc<AtomicUsize>,
    /// Told when a request of this call is answered, so its idle deadline starts afresh.
    answered: mpsc::UnboundedSender<()>,
}

/// The elicitation routes of one server's calls in flight.
#[derive(Debug, Default)]
pub(crate) struct ElicitationRoutes {
    next: AtomicU64,
    routes: Mutex<BTreeMap<u64, Route>>,
}

/// A call's registration; dropping it removes the route.
pub(crate) struct RouteGuard {
    routes: Arc<ElicitationRoutes>,
    key: u64,
    /// How many requests to this call wait (its idle deadline is held while any does).
    pub(crate) waiting: Arc<AtomicUsize>,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

impl ElicitationRoutes {
    /// Registers a call in flight whose elicitations go to `requests`.
    pub(crate) fn register(
        self: &Arc<Self>,
        requests: mpsc::UnboundedSender<ElicitationRequest>,
        answered: mpsc::UnboundedSender<()>,
    ) -> RouteGuard {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let waiting = Arc::new(AtomicUsize::new(0));
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
                Route {
                    requests,
                    waiting: Arc::clone(&waiting),
                    answered,
                },
            );
        RouteGuard {
            routes: Arc::clone(self),
            key,
            waiting,
        }
    }

    /// Hands a request to every call in flight that takes elicitations and waits for the
    /// answer. `None` when no call takes it (the caller declines it then).
    pub(crate) async fn ask(
        &self,
        server: &str,
        message: String,
        kind: ElicitationKind,
        cancelled: tokio_util::sync::CancellationToken,
    ) -> Option<ElicitationAnswer> {
        let (responder, answer) = ElicitationResponder::new();
        let request = ElicitationRequest {
            server: server.to_owned(),
            message,
            kind,
            responder,
        };
        let reached: Vec<Route> = {
            let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            routes
                .values()
                .filter(|route| {
                    route.waiting.fetch_add(1, Ordering::SeqCst);
                    let sent = route.requests.send(request.clone()).is_ok();
                    if !sent {
                        route.waiting.fetch_sub(1, Ordering::SeqCst);
                    }
                    sent
                })
                .cloned()
                .collect()
        };
        // The routes hold the only clones that may answer now.
        drop(request);
        if reached.is_empty() {
            return None;
        }
        let answer = tokio::select! {
            answer = answer => answer.unwrap_or(ElicitationAnswer::Cancel),
            () = cancelled.cancelled() => ElicitationAnswer::Cancel,
        };
        for route in &reached {
            route.waiting.fetch_sub(1, Ordering::SeqCst);
            let _ = route.answered.send(());
        }
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> ElicitationKind {
        ElicitationKind::Form {
            requested_schema: serde_json::json!({"type": "object"}),
        }
    }

    #[tokio::test]
    async fn a_request_reaches_every_call_in_flight_and_the_first_answer_wins() {
        let routes = Arc::new(ElicitationRoutes::default());
        let (first_tx, mut first_rx) = mpsc::unbounded_channel();
        let (second_tx, mut second_rx) = mpsc::unbounded_channel();
        let (answered_tx, mut answered_rx) = mpsc::unbounded_channel();
        let first = routes.register(first_tx, answered_tx.clone());
        let second = routes.register(second_tx, answered_tx);
        let asking = {
            let routes = Arc::clone(&routes);
            tokio::spawn(async move {
                routes
                    .ask(
                        "s",
                        "your name?".into(),
                        form(),
                        tokio_util::sync::CancellationToken::new(),
                    )
                    .await
            })
        };
        let a = first_rx.recv().await.expect("first route");
        let b = second_rx.recv().await.expect("second route");
        assert_eq!(a.message, "your name?");
        assert_eq!(first.waiting.load(Ordering::SeqCst), 1);
        assert!(b.responder.is_open());
        assert!(b.responder.answer(ElicitationAnswer::Accept(
            serde_json::json!({"name": "Ada"})
        )));
        assert!(!a.responder.answer(ElicitationAnswer::Decline));
        let answer = asking.await.expect("task").expect("reached a route");
        assert_eq!(
            answer,
            ElicitationAnswer::Accept(serde_json::json!({"name": "Ada"}))
        );
        assert_eq!(first.waiting.load(Ordering::SeqCst), 0);
        assert_eq!(second.waiting.load(Ordering::SeqCst), 0);
        answered_rx.recv().await.expect("told of the answer");
    }

    #[tokio::test]
    async fn without_a_call_in_flight_nobody_is_asked_and_dropped_requests_cancel() {
        let routes = Arc::new(ElicitationRoutes::default());
        let none = routes
            .ask(
                "s",
                "?".into(),
                form(),
                tokio_util::sync::CancellationToken::new(),
            )
            .await;
        assert_eq!(none, None);

        let (tx, mut rx) = mpsc::unbounded_channel();
        let (answered_tx, _answered_rx) = mpsc::unbounded_channel();
        let guard = routes.register(tx, answered_tx);
        let asking = {
            let routes = Arc::clone(&routes);
            tokio::spawn(async move {
                routes
                    .ask(
                        "s",
                        "?".into(),
                        form(),
                        tokio_util::sync::CancellationToken::new(),
                    )
                    .await
            })
        };
        let request = rx.recv().await.expect("request");
        // The caller lets the request go unanswered (its call ended): the server hears "cancel".
        drop(request);
        drop(rx);
        drop(guard);
        assert_eq!(asking.await.expect("task"), Some(ElicitationAnswer::Cancel));
    }
}
