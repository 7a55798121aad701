//! The driver's side of context compaction: before a model call, whether the request still fits
//! the window (see [`crate::context`] for the rules), the call to the summary model, and the
//! event that records what was done.

use std::sync::Arc;

use agentry_llm::ModelClient;
use agentry_types::{AssistantPart, SessionEvent};
use tokio_util::sync::CancellationToken;

use crate::context::{
    ContextError, apply, plan, request_tokens, split_memories, summary_request, view,
};
use crate::engine::RunState;

/// Compacts `state`'s conversation when its next request would pass the threshold (or always,
/// with `force`, after the provider said the context is too long). Returns the event to record,
/// or `None` when nothing changed.
pub(crate) async fn compact(
    state: &mut RunState,
    model: &dyn ModelClient,
    summarizer: Option<&Arc<dyn ModelClient>>,
    force: bool,
    cancel: &CancellationToken,
) -> Result<Option<SessionEvent>, ContextError> {
    let Some(policy) = state.context.clone() else {
        return Ok(None);
    };
    let counter = model.context().counter;
    let Some(plan) = plan(
        &state.messages,
        &state.tools,
        &counter,
        &policy,
        state.compaction.as_ref(),
        force,
    )?
    else {
        return Ok(None);
    };
    let newly = &state.messages[plan.newly_covered.clone()];
    let previous = state.compaction.as_ref().and_then(|c| c.summary.clone());
    let mut summary_error = None;
    let mut memories = Vec::new();
    let summary = match (policy.summary_model.as_ref(), summarizer) {
        (Some(_), Some(client)) => {
            let request = summary_request(previous.as_deref(), newly, policy.summary_tokens);
            match client.complete(request, cancel.child_token()).await {
                Ok(response) => {
                    let text: String = response
                        .content
                        .iter()
                        .filter_map(|part| match part {
                            AssistantPart::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect();
                    let (text, found) = split_memories(&text);
                    memories = found;
                    if text.is_empty() {
                        summary_error = Some("the summary model answered with no text".to_owned());
                        None
                    } else {
                        Some(text)
                    }
                }
                Err(error) => {
                    summary_error = Some(error.to_string());
                    None
                }
            }
        }
        (Some(id), None) => {
            summary_error = Some(format!("the summary model {id:?} is not registered"));
            None
        }
        (None, _) => None,
    };
    if let Some(error) = &summary_error {
        tracing::warn!(run_id = %state.run_id, "compaction without a summary: {error}");
    }
    let summarised = summary.is_some();
    let dropped_messages =
        (!summarised && !plan.newly_covered.is_empty()).then(|| agentry_types::DroppedMessages {
            count: plan.newly_covered.len(),
            start: plan.newly_covered.start,
            end: plan.newly_covered.end,
        });
    if let Some(dropped) = &dropped_messages {
        tracing::info!(
            run_id = %state.run_id,
            count = dropped.count,
            start = dropped.start,
            end = dropped.end,
            "compaction dropped messages without a summary"
        );
    }
    let compaction = apply(state.compaction.as_ref(), &plan, summary);
    let tokens_after = request_tokens(
        &counter,
        &view(&state.messages, Some(&compaction)),
        &state.tools,
    );
    state.compaction = Some(compaction.clone());
    Ok(Some(SessionEvent::ContextCompacted {
        run_id: state.run_id,
        covered: compaction.covered,
        summary: compaction.summary,
        dropped: compaction.dropped,
        dropped_messages,
        newly_covered: plan.newly_covered.len(),
        tokens_before: plan.tokens_before,
        tokens_after,
        summary_model: policy.summary_model.filter(|_| summarised),
        forced: force,
        summary_error,
        memories: memories
            .into_iter()
            .map(|memory| agentry_types::CompactionMemory {
                kind: memory.kind,
                text: memory.text,
            })
            .collect(),
        agent_id: state.agent_id.clone(),
        user: state.user.clone(),
    }))
}
