//! `<file>path</file>` in user messages: text and images from the workspace, caps, and every
//! way out of the workspace refused.

use std::fs;

use agentry_core::file_refs::{FileRefError, FileRefLimits, expand_file_refs};
use agentry_types::{ContentPart, ImageSource, Message};
use anyhow::{Result, bail, ensure};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDRfake";

struct Fixture {
    _temp: tempfile::TempDir,
    workspace: std::path::PathBuf,
}

fn fixture() -> Result<Fixture> {
    let temp = tempfile::tempdir()?;
    let workspace = temp.path().join("workspace");
    fs::create_dir_all(workspace.join("src"))?;
    fs::write(workspace.join("src/main.rs"), "fn main() {}\n")?;
    fs::write(workspace.join("logo.png"), PNG)?;
    fs::write(workspace.join("big.txt"), "é".repeat(600))?;
    fs::write(temp.path().join("secret.txt"), "top secret")?;
    std::os::unix::fs::symlink(temp.path().join("secret.txt"), workspace.join("link.txt"))?;
    Ok(Fixture {
        _temp: temp,
        workspace,
    })
}

fn text_of(part: &ContentPart) -> Result<&str> {
    match part {
        ContentPart::Text { text } => Ok(text),
        other => bail!("expected text, got {other:?}"),
    }
}

#[test]
fn a_text_file_and_an_image_are_expanded_in_place() -> Result<()> {
    let fixture = fixture()?;
    let mut messages = vec![
        Message::system("<file>src/main.rs</file> stays: system prompts are not expanded"),
        Message::user("Fix <file>src/main.rs</file> to match <file>./logo.png</file>, please."),
    ];
    expand_file_refs(
        &mut messages,
        Some(&fixture.workspace),
        FileRefLimits::default(),
    )?;
    ensure!(matches!(&messages[0], Message::System { text } if text.starts_with("<file>src")));
    let Message::User { content } = &messages[1] else {
        bail!("expected the user message");
    };
    ensure!(content.len() == 2, "{content:?}");
    let text = text_of(&content[0])?;
    ensure!(
        text == "Fix <file path=\"src/main.rs\">\nfn main() {}\n</file> to match [image: logo.png], please.",
        "{text}"
    );
    let ContentPart::Image {
        source: ImageSource::Base64 { media_type, data },
    } = &content[1]
    else {
        bail!("expected the image, got {:?}", content[1]);
    };
    ensure!(media_type == "image/png");
    use base64::Engine as _;
    ensure!(base64::engine::general_purpose::STANDARD.decode(data)? == PNG);
    Ok(())
}

#[test]
fn a_large_file_is_cut_on_a_character_boundary_with_a_note() -> Result<()> {
    let fixture = fixture()?;
    let mut messages = vec![Message::user("<file>big.txt</file>")];
    let limits = FileRefLimits {
        max_text_bytes: 101,
        ..FileRefLimits::default()
    };
    expand_file_refs(&mut messages, Some(&fixture.workspace), limits)?;
    let Message::User { content } = &messages[0] else {
        bail!("expected the user message");
    };
    let text = text_of(&content[0])?;
    ensure!(
        text.contains(&"é".repeat(50)) && !text.contains(&"é".repeat(51)),
        "{text}"
    );
    ensure!(text.contains("[cut: the file has 1200 bytes; the first 101 are shown]"));
    Ok(())
}

#[test]
fn paths_leading_out_of_the_workspace_are_refused() -> Result<()> {
    let fixture = fixture()?;
    let outside = fixture.workspace.parent().map(|p| p.join("secret.txt"));
    let absolute = outside.map(|p| p.display().to_string()).unwrap_or_default();
    for path in [
        "../secret.txt",
        "src/../../secret.txt",
        absolute.as_str(),
        "/etc/passwd",
        "link.txt",
        "missing.txt",
        "src",
    ] {
        let mut messages = vec![Message::user(format!("read <file>{path}</file>"))];
        let before = messages.clone();
        let error = expand_file_refs(
            &mut messages,
            Some(&fixture.workspace),
            FileRefLimits::default(),
        );
        let Err(FileRefError::Refused {
            path: named,
            reason,
        }) = error
        else {
            bail!("{path}: expected a refusal, got {error:?}");
        };
        ensure!(named == path);
        ensure!(!reason.is_empty());
        ensure!(
            messages == before,
            "{path}: a refused message is left as it was"
        );
        ensure!(
            !format!("{messages:?}").contains("top secret"),
            "{path}: leaked"
        );
    }
    Ok(())
}

#[test]
fn too_many_files_in_one_message_are_refused() -> Result<()> {
    let fixture = fixture()?;
    let text = "<file>src/main.rs</file>".repeat(3);
    let mut messages = vec![Message::user(text)];
    let limits = FileRefLimits {
        max_files: 2,
        ..FileRefLimits::default()
    };
    ensure!(
        expand_file_refs(&mut messages, Some(&fixture.workspace), limits)
            == Err(FileRefError::TooMany { max: 2 })
    );
    Ok(())
}
