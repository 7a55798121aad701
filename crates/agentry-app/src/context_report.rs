//! What a session's next model call would contain, and how many tokens each part takes,
//! counted with the model's tokenizer (tiktoken for OpenAI models, the calibrated estimate
//! elsewhere) against its context window.

use serde::Serialize;

use agentry_core::context::{ContextPolicy, DEFAULT_THRESHOLD};
use agentry_core::session::replay;
use agentry_types::{Message, SessionEvent, SessionId};

use crate::App;
use crate::error::AppError;

/// One part of the next call.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextPart {
    /// `system`, `user`, `assistant`, `tool` (a message) or `tools` (the tool definitions). After
    /// a compaction the first `user` part holds the summary.
    pub kind: String,
    /// The message's position in the conversation (absent for `tools`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// Tokens it takes (calibrated).
    pub tokens: u64,
    /// For `tools`: how many tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// The start of its text, for people.
    pub preview: String,
}

/// What the next call would contain.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextReport {
    /// The model counted for.
    pub model: String,
    /// Its context window.
    pub window: u64,
    /// Whether the window is configured or known (false: a guess; configure `context_window`).
    pub window_known: bool,
    /// Requests above this many tokens are compacted first.
    pub compaction_threshold: u64,
    /// The tokenizer: `o200k_base`, `cl100k_base`, … or `estimate`.
    pub tokenizer: String,
    /// The factor estimates are multiplied by, learnt from the provider's reported usage.
    pub calibration: f64,
    /// Tokens of the whole call (the parts, plus the reply primer).
    pub total_tokens: u64,
    /// Whether it fits under the compaction threshold.
    pub fits: bool,
    /// The parts, in the order they are sent.
    pub parts: Vec<ContextPart>,
    /// Messages of the conversation (in the log) no longer sent verbatim: summarised or
    /// dropped by compaction (0 when nothing was compacted).
    pub compacted_messages: usize,
    /// The running summary that stands for them, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

fn preview(message: &Message) -> String {
    let text = match message {
        Message::System { text } => text.clone(),
        Message::User { content } => content
            .iter()
            .filter_map(|part| match part {
                agentry_types::ContentPart::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" "),
        Message::Assistant { content } => content
            .iter()
            .filter_map(|part| match part {
                agentry_types::AssistantPart::Text { text } => Some(text.clone()),
                agentry_types::AssistantPart::ToolCall(call) => {
                    Some(format!("[{}({})]", call.name, call.arguments))
                }
                agentry_types::AssistantPart::Thinking(_) => None,
            })
            .collect::<Vec<_>>()
            .join(" "),
        Message::Tool(result) => result.text_content(),
    };
    let mut preview: String = text.chars().take(120).collect();
    if text.chars().count() > 120 {
        preview.push('…');
    }
    preview
}

impl App {
    /// What the next model call of session `id` would contain, counted for `model` (default:
    /// the model of the session's latest run).
    pub async fn context_report(
        &self,
        id: SessionId,
        model: Option<String>,
    ) -> Result<ContextReport, AppError> {
        if self.parts.store.session(id).await?.is_none() {
            return Err(AppError::not_found(format!("no session {id}")));
        }
        let events = self
            .parts
            .sessions
            .log()
            .load(id)
            .await
            .map_err(|error| AppError::internal(format!("the session's log: {error}")))?;
        let last_run = events.iter().rev().find_map(|(_, event)| match event {
            SessionEvent::RunStarted { model, tools, .. } => Some((model.clone(), tools.clone())),
            _ => None,
        });
        let (model, tool_names) = match (model, last_run) {
            (Some(model), Some((_, tools))) => (model, tools),
            (Some(model), None) => (model, Vec::new()),
            (None, Some(run)) => run,
            (None, None) => {
                return Err(AppError::bad_request(
                    "the session has had no run yet: name the model to count for (?model=…)",
                ));
            }
        };
        let runtime = self.parts.sessions.runtime();
        let client = runtime
            .model_client(&model)
            .map_err(|_| AppError::bad_request(format!("no model {model:?} is registered")))?;
        let context = client.context();
        let counter = &context.counter;
        let replayed = replay(&events);
        // What the model is sent: the compacted view of the conversation.
        let messages =
            agentry_core::context::view(&replayed.messages, replayed.compaction.as_ref());
        let mut parts = Vec::with_capacity(messages.len() + 1);
        for (index, message) in messages.iter().enumerate() {
            parts.push(ContextPart {
                kind: message.role().to_owned(),
                index: Some(index),
                tokens: counter.calibrated(counter.count_message(message)),
                count: None,
                preview: preview(message),
            });
        }
        let tools: Vec<_> = runtime
            .tools()
            .specs()
            .into_iter()
            .filter(|spec| tool_names.contains(&spec.name))
            .collect();
        if !tools.is_empty() {
            parts.push(ContextPart {
                kind: "tools".into(),
                index: None,
                tokens: counter.calibrated(counter.count_tools(&tools)),
                count: Some(tools.len()),
                preview: tools
                    .iter()
                    .map(|tool| tool.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let total_tokens = agentry_core::context::request_tokens(counter, &messages, &tools);
        let policy = ContextPolicy {
            threshold: DEFAULT_THRESHOLD,
            ..ContextPolicy::new(context.window)
        };
        Ok(ContextReport {
            model,
            window: context.window,
            window_known: context.window_known,
            compaction_threshold: policy.budget(),
            tokenizer: counter.tokenizer_name().to_owned(),
            calibration: counter.calibration(),
            total_tokens,
            fits: total_tokens <= policy.budget(),
            parts,
            compacted_messages: replayed.compaction.as_ref().map_or(0, |c| {
                c.covered
                    .saturating_sub(agentry_core::context::system_prefix(&replayed.messages))
            }),
            summary: replayed.compaction.and_then(|c| c.summary),
        })
    }
}
