//! Fallback models: a [`ModelClient`] that tries its models in order.
//!
//! [`FallbackModelClient`] calls its first model; when that call fails *before yielding any
//! event* with an error another model might not have (a provider error, or anything the
//! transport counts as retryable: connection, timeout, a stream cut short), it makes the same
//! call to the next model, and so on. Once an event has reached the caller, a failure is
//! returned as it is, like the transport's own retries: a second model could repeat output the
//! caller has already acted on. Cancellation is never a reason to fall back.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use agentry_llm::{LlmError, ModelClient, ModelRequest, ModelStream};
use agentry_types::ModelResponse;

/// Models tried in order; see the module docs.
#[derive(Clone)]
pub struct FallbackModelClient {
    models: Arc<[(String, Arc<dyn ModelClient>)]>,
}

impl FallbackModelClient {
    /// The models, by id, in the order they are tried (the first is the primary). An empty
    /// list answers every call with a configuration error.
    pub fn new(models: Vec<(String, Arc<dyn ModelClient>)>) -> Self {
        Self {
            models: models.into(),
        }
    }

    /// The ids of the models, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.models.iter().map(|(id, _)| id.as_str()).collect()
    }
}

/// Whether a failure before any output is worth trying on the next model.
pub fn falls_back(error: &LlmError) -> bool {
    !matches!(error, LlmError::Cancelled)
        && (error.provider_error().is_some() || error.is_retryable())
}

fn no_models() -> LlmError {
    LlmError::Configuration("the fallback client has no models".into())
}

struct Attempt {
    models: Arc<[(String, Arc<dyn ModelClient>)]>,
    index: usize,
    current: Option<ModelStream>,
    produced: bool,
    request: ModelRequest,
    cancel: CancellationToken,
}

impl ModelClient for FallbackModelClient {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ModelStream {
        let Some((_, first)) = self.models.first() else {
            return Box::pin(futures::stream::once(async { Err(no_models()) }));
        };
        let attempt = Attempt {
            current: Some(first.stream(request.clone(), cancel.clone())),
            models: Arc::clone(&self.models),
            index: 0,
            produced: false,
            request,
            cancel,
        };
        Box::pin(futures::stream::unfold(attempt, |mut attempt| async move {
            loop {
                let current = attempt.current.as_mut()?;
                match current.next().await {
                    Some(Ok(event)) => {
                        attempt.produced = true;
                        return Some((Ok(event), attempt));
                    }
                    Some(Err(error)) => {
                        let next = attempt.index + 1;
                        if !attempt.produced
                            && falls_back(&error)
                            && !attempt.cancel.is_cancelled()
                            && let Some((id, client)) = attempt.models.get(next)
                        {
                            let failed = attempt
                                .models
                                .get(attempt.index)
                                .map(|(id, _)| id.as_str())
                                .unwrap_or_default();
                            tracing::warn!(
                                failed = %failed,
                                next = %id,
                                "a model call failed before any output; trying the next model: {error}"
                            );
                            attempt.current = Some(
                                client.stream(attempt.request.clone(), attempt.cancel.clone()),
                            );
                            attempt.index = next;
                            continue;
                        }
                        attempt.current = None;
                        return Some((Err(error), attempt));
                    }
                    None => return None,
                }
            }
        }))
    }

    /// The primary model's counter, and the smallest window of all the models: a call that
    /// falls back must fit the model it falls back to.
    fn context(&self) -> agentry_llm::ModelContext {
        let mut context = self
            .models
            .first()
            .map_or_else(agentry_llm::ModelContext::unknown, |(_, model)| {
                model.context()
            });
        for (_, model) in self.models.iter().skip(1) {
            let other = model.context();
            if other.window < context.window {
                context.window = other.window;
                context.window_known = other.window_known;
            }
        }
        context
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, LlmError>> {
        let models = Arc::clone(&self.models);
        Box::pin(async move {
            let mut last = no_models();
            for (index, (id, client)) in models.iter().enumerate() {
                match client.complete(request.clone(), cancel.clone()).await {
                    Ok(response) => return Ok(response),
                    Err(error)
                        if falls_back(&error)
                            && !cancel.is_cancelled()
                            && index + 1 < models.len() =>
                    {
                        tracing::warn!(failed = %id, "a model call failed; trying the next model: {error}");
                        last = error;
                    }
                    Err(error) => return Err(error),
                }
            }
            Err(last)
        })
    }
}
