//! Runs as the application starts them: what a run request says in a line (a new session's
//! title, the words its memories are chosen by).

use agentry_core::{Input, RunRequest};
use agentry_types::ContentPart;

/// The first 80 characters of a request's input text (a template's name for a template input).
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
