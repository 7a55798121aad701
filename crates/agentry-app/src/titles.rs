//! Session titles: the first line a new session is titled with ([`first_line`]), and the one
//! generator of the titles a model writes that every front-end uses (`POST
//! /v1/sessions/{id}/title`, `agentry sessions title`).

use agentry_core::session::replay;
use agentry_core::{Input, RunRequest, Runtime};
use agentry_store::Store;
use agentry_types::{AssistantPart, ContentPart, Message, SessionId};

use crate::error::{AppError, Failure};

/// What the model is asked.
const INSTRUCTION: &str =
    "Write a title of at most six words for this conversation. Answer with the title only.";

/// Messages of the conversation's start the title is written from.
const EXCERPT_MESSAGES: usize = 4;

/// The longest excerpt sent (characters).
const EXCERPT_CHARS: usize = 4000;

/// The longest title kept (characters).
const MAX_TITLE_CHARS: usize = 120;

/// Asks `model` (default: the model labelled `summary`, else the runtime's default model) for a
/// title of `session`, written from the start of its conversation (forks included), within
/// `grant` (the caller's: the model, named or not, must be one it may use). A session with no
/// messages is a bad request; a model that fails or answers nothing is an upstream failure
/// (`model_error`).
pub async fn generate_title(
    store: &Store,
    runtime: &Runtime,
    session: SessionId,
    model: Option<String>,
    grant: Option<agentry_core::access::Grant>,
) -> Result<String, AppError> {
    let events = store
        .events(session, 0, usize::MAX)
        .await?
        .into_iter()
        .map(|stored| {
            serde_json::from_value(stored.payload)
                .map(|event| (stored.seq, event))
                .map_err(|error| {
                    AppError::internal(format!("event {} is unreadable: {error}", stored.seq))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let excerpt = excerpt(&replay(&events).messages);
    if excerpt.is_empty() {
        return Err(AppError::bad_request(
            "the session has no messages to title",
        ));
    }
    // The model named, else the one labelled `summary`, else the default.
    let model = model.or_else(|| {
        runtime
            .labelled(agentry_core::media::SUMMARY)
            .map(str::to_owned)
    });
    let request = RunRequest {
        model,
        system: Some(INSTRUCTION.into()),
        tools: Some(Vec::new()),
        grant,
        ..RunRequest::text(excerpt)
    };
    let output = runtime.run(request).await?;
    if let Some(error) = output.error {
        return Err(AppError::new(
            Failure::Upstream,
            "model_error",
            error.message,
        ));
    }
    let title: String = output
        .text
        .trim()
        .trim_matches('"')
        .trim()
        .chars()
        .take(MAX_TITLE_CHARS)
        .collect();
    if title.is_empty() {
        return Err(AppError::new(
            Failure::Upstream,
            "model_error",
            "the model returned an empty title",
        ));
    }
    Ok(title)
}

/// A new session's title until one is written (and the words its memories are chosen by): the
/// first 80 characters of a request's input text, a template's name for a template input.
pub fn first_line(request: &RunRequest) -> Option<String> {
    match &request.input {
        Some(Input::Text { text }) => Some(text.chars().take(80).collect()),
        Some(Input::Content { content }) => content.iter().find_map(|part| match part {
            ContentPart::Text { text } => Some(text.chars().take(80).collect()),
            _ => None,
        }),
        Some(Input::Template { template, .. }) => Some(template.clone()),
        None => None,
    }
}

/// The conversation's first user and assistant messages as `role: text` lines (images and
/// tool calls left out), cut to [`EXCERPT_CHARS`].
fn excerpt(messages: &[Message]) -> String {
    messages
        .iter()
        .filter_map(|message| {
            let (role, text) = match message {
                Message::User { content } => (
                    "user",
                    content
                        .iter()
                        .filter_map(|part| match part {
                            ContentPart::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                Message::Assistant { content } => (
                    "assistant",
                    content
                        .iter()
                        .filter_map(|part| match part {
                            AssistantPart::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                _ => return None,
            };
            (!text.trim().is_empty()).then(|| format!("{role}: {text}"))
        })
        .take(EXCERPT_MESSAGES)
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(EXCERPT_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_excerpt_is_the_conversations_start_as_text() {
        let messages = vec![
            Message::system("be brief"),
            Message::user("Plan the release"),
            Message::Assistant {
                content: vec![AssistantPart::Text {
                    text: "Tuesday works.".into(),
                }],
            },
            Message::user("And the notes?"),
            Message::user("Also the blog"),
            Message::user("A fifth one"),
        ];
        assert_eq!(
            excerpt(&messages),
            "user: Plan the release\nassistant: Tuesday works.\nuser: And the notes?\nuser: Also the blog"
        );
        assert_eq!(excerpt(&[Message::system("only")]), "");
    }
}
