//! The workspace tools: each tool's behaviour, confinement to the workspace (traversal,
//! symbolic and hard links, NUL bytes), caps, `fetch` under its network policy, and a run in
//! which the model writes and reads a file.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentry_core::RunRequest;
use agentry_core::tool::{ToolContext, ToolError, ToolOutput, ToolRegistry};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_tools::{FetchConfig, NetworkPolicy, WorkspaceToolsConfig, workspace_tools};
use agentry_types::{ImageSource, RunStopReason, ToolResultPart};
use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use serde_json::{Value, json};

use super::support::{PROTOCOLS, builder, limits, result_texts, run_collect};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A temporary folder holding `workspace/` and `outside/` (one filesystem, for hard links),
/// with the workspace tools registered.
struct Fixture {
    _temp: tempfile::TempDir,
    workspace: PathBuf,
    outside: PathBuf,
    registry: ToolRegistry,
}

impl Fixture {
    fn new() -> Result<Self> {
        Self::with_config(WorkspaceToolsConfig::default())
    }

    fn with_config(config: WorkspaceToolsConfig) -> Result<Self> {
        let temp = tempfile::tempdir()?;
        let workspace = temp.path().join("workspace");
        let outside = temp.path().join("outside");
        fs::create_dir(&workspace)?;
        fs::create_dir(&outside)?;
        fs::write(outside.join("secret.txt"), "TOP SECRET\n")?;
        let mut registry = ToolRegistry::default();
        for tool in workspace_tools(config) {
            registry.register_arc(tool)?;
        }
        Ok(Self {
            _temp: temp,
            workspace,
            outside,
            registry,
        })
    }

    async fn call(&self, name: &str, arguments: Value) -> Result<ToolOutput, ToolError> {
        self.call_narrowed(name, arguments, Vec::new()).await
    }

    /// A call in a run whose `fetch` is narrowed by `network` (an agent's setting).
    async fn call_narrowed(
        &self,
        name: &str,
        arguments: Value,
        network: Vec<NetworkPolicy>,
    ) -> Result<ToolOutput, ToolError> {
        let mut context = ToolContext::detached("call").with_workspace(&self.workspace);
        context.network = network;
        self.registry
            .invoke(name, arguments, context, TIMEOUT)
            .await
    }

    /// The call's text, failing the test when the call fails.
    async fn text(&self, name: &str, arguments: Value) -> Result<String> {
        let output = self
            .call(name, arguments.clone())
            .await
            .with_context(|| format!("{name} {arguments}"))?;
        Ok(text_of(&output))
    }

    /// The call's error message, failing the test when the call succeeds.
    async fn error(&self, name: &str, arguments: Value) -> Result<ToolError> {
        match self.call(name, arguments.clone()).await {
            Ok(output) => bail!(
                "{name} {arguments} should have failed, returned {:?}",
                text_of(&output)
            ),
            Err(error) => Ok(error),
        }
    }

    fn write(&self, relative: &str, content: &str) -> Result<()> {
        let path = self.workspace.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, content)?;
        Ok(())
    }

    fn secret_unchanged(&self) -> Result<()> {
        let secret = fs::read_to_string(self.outside.join("secret.txt"))?;
        ensure!(
            secret == "TOP SECRET\n",
            "the outside file changed: {secret:?}"
        );
        Ok(())
    }
}

fn text_of(output: &ToolOutput) -> String {
    output
        .content
        .iter()
        .filter_map(|part| match part {
            ToolResultPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn message(error: &ToolError) -> String {
    error.to_string()
}

fn numbered_lines(count: usize) -> String {
    (1..=count).map(|n| format!("line {n}\n")).collect()
}

#[tokio::test]
async fn read_file_returns_text_and_line_ranges() -> Result<()> {
    let fixture = Fixture::new()?;
    fixture.write("notes.txt", &numbered_lines(10))?;

    let whole = fixture
        .text("read_file", json!({"path": "notes.txt"}))
        .await?;
    assert_eq!(
        whole,
        numbered_lines(10),
        "a whole file comes back as it is"
    );

    let part = fixture
        .text(
            "read_file",
            json!({"path": "./notes.txt", "offset": 3, "limit": 2}),
        )
        .await?;
    assert!(part.starts_with("line 3\nline 4\n"), "{part}");
    assert!(!part.contains("line 5"), "{part}");
    assert!(
        part.contains("showed lines 3–4 of 10; read on with offset=5"),
        "{part}"
    );

    let past = fixture
        .error("read_file", json!({"path": "notes.txt", "offset": 11}))
        .await?;
    assert!(matches!(past, ToolError::InvalidArguments(_)), "{past:?}");
    assert!(message(&past).contains("has 10 lines"), "{past}");

    let missing = fixture
        .error("read_file", json!({"path": "nope.txt"}))
        .await?;
    assert!(
        message(&missing).contains("no such file or folder"),
        "{missing}"
    );
    let folder = fixture.error("read_file", json!({"path": "."})).await?;
    assert!(message(&folder).contains("is a folder"), "{folder}");
    Ok(())
}

#[tokio::test]
async fn read_file_caps_its_output_with_a_note() -> Result<()> {
    let fixture = Fixture::with_config(WorkspaceToolsConfig {
        max_read_bytes: 100,
        ..WorkspaceToolsConfig::default()
    })?;
    fixture.write("long.txt", &numbered_lines(100))?;
    let text = fixture
        .text("read_file", json!({"path": "long.txt"}))
        .await?;
    let (shown, note) = text.split_once("[…").context("a truncation note")?;
    assert!(shown.len() <= 100, "{} bytes shown", shown.len());
    assert!(shown.starts_with("line 1\n"), "{text}");
    assert!(note.contains("of 100 (cut at the 100-byte cap)"), "{note}");
    assert!(note.contains("read on with offset="), "{note}");

    // One line longer than the cap shows its start.
    fixture.write("wide.txt", &"x".repeat(1000))?;
    let wide = fixture
        .text("read_file", json!({"path": "wide.txt"}))
        .await?;
    assert!(wide.starts_with(&"x".repeat(100)), "{wide}");
    assert!(!wide.starts_with(&"x".repeat(101)), "{wide}");
    assert!(wide.contains("cut at the 100-byte cap"), "{wide}");
    Ok(())
}

#[tokio::test]
async fn read_file_returns_images_as_image_parts_and_skips_binary() -> Result<()> {
    let fixture = Fixture::new()?;
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend_from_slice(&[0, 0, 0, 13, b'I', b'H', b'D', b'R', 1, 2, 3]);
    fs::write(fixture.workspace.join("pixel.png"), &png)?;
    let output = fixture
        .call("read_file", json!({"path": "pixel.png"}))
        .await?;
    let image = output
        .content
        .iter()
        .find_map(|part| match part {
            ToolResultPart::Image {
                source: ImageSource::Base64 { media_type, data },
            } => Some((media_type.clone(), data.clone())),
            _ => None,
        })
        .context("an image part")?;
    assert_eq!(image.0, "image/png");
    assert_eq!(
        base64::engine::general_purpose::STANDARD.decode(image.1)?,
        png
    );

    fs::write(fixture.workspace.join("blob.bin"), [1u8, 0, 2, 0, 3])?;
    let binary = fixture
        .text("read_file", json!({"path": "blob.bin"}))
        .await?;
    assert!(binary.contains("binary file (5 bytes)"), "{binary}");
    Ok(())
}

#[tokio::test]
async fn write_file_creates_folders_and_replaces_atomically() -> Result<()> {
    let fixture = Fixture::new()?;
    let created = fixture
        .text(
            "write_file",
            json!({"path": "a/b/c.txt", "content": "hello\n"}),
        )
        .await?;
    assert_eq!(created, "wrote 6 bytes to a/b/c.txt (created)");
    let path = fixture.workspace.join("a/b/c.txt");
    assert_eq!(fs::read_to_string(&path)?, "hello\n");

    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    let replaced = fixture
        .text("write_file", json!({"path": "a/b/c.txt", "content": "bye"}))
        .await?;
    assert_eq!(replaced, "wrote 3 bytes to a/b/c.txt (replaced)");
    assert_eq!(fs::read_to_string(&path)?, "bye");
    assert_eq!(
        fs::metadata(&path)?.permissions().mode() & 0o777,
        0o600,
        "a replaced file keeps its permissions"
    );
    // No temporary file is left beside it.
    let names: Vec<String> = fs::read_dir(fixture.workspace.join("a/b"))?
        .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    assert_eq!(names, vec!["c.txt".to_owned()]);

    let folder = fixture
        .error("write_file", json!({"path": "a/b", "content": "x"}))
        .await?;
    assert!(message(&folder).contains("is a folder"), "{folder}");
    Ok(())
}

#[tokio::test]
async fn edit_file_replaces_exact_text_and_explains_bad_matches() -> Result<()> {
    let fixture = Fixture::new()?;
    fixture.write("main.rs", "fn a() {}\nfn b() {}\nfn a() {}\n")?;

    let done = fixture
        .text(
            "edit_file",
            json!({"path": "main.rs", "old_text": "fn b() {}", "new_text": "fn c() {}"}),
        )
        .await?;
    assert_eq!(done, "replaced 1 occurrence in main.rs");
    assert_eq!(
        fs::read_to_string(fixture.workspace.join("main.rs"))?,
        "fn a() {}\nfn c() {}\nfn a() {}\n"
    );

    let missing = fixture
        .error(
            "edit_file",
            json!({"path": "main.rs", "old_text": "fn z() {}", "new_text": "x"}),
        )
        .await?;
    assert!(
        message(&missing).contains("old_text was not found in main.rs"),
        "{missing}"
    );
    assert!(message(&missing).contains("exactly"), "{missing}");

    let ambiguous = fixture
        .error(
            "edit_file",
            json!({"path": "main.rs", "old_text": "fn a() {}", "new_text": "fn d() {}"}),
        )
        .await?;
    let text = message(&ambiguous);
    assert!(
        text.contains("occurs 2 times in main.rs (at lines 1, 3)"),
        "{text}"
    );
    assert!(text.contains("more surrounding lines"), "{text}");
    assert!(text.contains("replace_all"), "{text}");
    // Nothing was changed by the failed edits.
    assert_eq!(
        fs::read_to_string(fixture.workspace.join("main.rs"))?,
        "fn a() {}\nfn c() {}\nfn a() {}\n"
    );

    let all = fixture
        .text(
            "edit_file",
            json!({"path": "main.rs", "old_text": "fn a() {}", "new_text": "fn d() {}", "replace_all": true}),
        )
        .await?;
    assert_eq!(all, "replaced 2 occurrences in main.rs");
    assert_eq!(
        fs::read_to_string(fixture.workspace.join("main.rs"))?,
        "fn d() {}\nfn c() {}\nfn d() {}\n"
    );

    let empty = fixture
        .error(
            "edit_file",
            json!({"path": "main.rs", "old_text": "", "new_text": "x"}),
        )
        .await?;
    assert!(matches!(empty, ToolError::InvalidArguments(_)), "{empty:?}");
    Ok(())
}

#[tokio::test]
async fn list_dir_shows_kinds_sizes_and_honours_gitignore() -> Result<()> {
    let fixture = Fixture::new()?;
    fixture.write(".gitignore", "target/\n*.log\n")?;
    fixture.write("README.md", "hello")?;
    fixture.write("src/lib.rs", "pub fn x() {}\n")?;
    fixture.write("src/deep/mod.rs", "")?;
    fixture.write("target/out.bin", "xx")?;
    fixture.write("debug.log", "log")?;
    fixture.write(".git/HEAD", "ref")?;
    std::os::unix::fs::symlink("README.md", fixture.workspace.join("readme-link"))?;

    let top = fixture.text("list_dir", json!({})).await?;
    let lines: Vec<&str> = top.lines().collect();
    assert_eq!(
        lines,
        vec![
            ".gitignore (14 bytes)",
            "README.md (5 bytes)",
            "readme-link -> README.md",
            "src/",
        ],
        "{top}"
    );

    let recursive = fixture
        .text("list_dir", json!({"path": "src", "recursive": true}))
        .await?;
    assert_eq!(
        recursive.lines().collect::<Vec<_>>(),
        vec![
            "src/deep/",
            "src/deep/mod.rs (0 bytes)",
            "src/lib.rs (14 bytes)"
        ],
        "{recursive}"
    );

    let everything = fixture
        .text("list_dir", json!({"recursive": true, "gitignore": false}))
        .await?;
    assert!(
        everything.contains("target/out.bin (2 bytes)"),
        "{everything}"
    );
    assert!(everything.contains("debug.log"), "{everything}");
    assert!(!everything.contains(".git/"), "{everything}");

    let capped = fixture
        .text("list_dir", json!({"recursive": true, "max_entries": 2}))
        .await?;
    assert_eq!(capped.lines().count(), 3, "{capped}");
    assert!(capped.contains("stopped at 2 entries"), "{capped}");

    let file = fixture
        .error("list_dir", json!({"path": "README.md"}))
        .await?;
    assert!(message(&file).contains("is not a folder"), "{file}");
    Ok(())
}

#[tokio::test]
async fn search_finds_lines_honours_gitignore_and_caps() -> Result<()> {
    let fixture = Fixture::new()?;
    fixture.write(".gitignore", "vendor/\n")?;
    fixture.write("src/a.rs", "fn alpha() {}\nlet beta = 1;\n")?;
    fixture.write("src/b.py", "def alpha(): pass\n")?;
    fixture.write("vendor/c.rs", "fn alpha() {}\n")?;
    fs::write(fixture.workspace.join("blob.bin"), b"alpha\0binary")?;

    let found = fixture
        .text("search", json!({"pattern": "alph[a]"}))
        .await?;
    assert_eq!(
        found.lines().collect::<Vec<_>>(),
        vec!["src/a.rs:1: fn alpha() {}", "src/b.py:1: def alpha(): pass"],
        "{found}"
    );

    let with_ignored = fixture
        .text("search", json!({"pattern": "alpha", "gitignore": false}))
        .await?;
    assert!(
        with_ignored.contains("vendor/c.rs:1: fn alpha() {}"),
        "{with_ignored}"
    );

    let globbed = fixture
        .text("search", json!({"pattern": "alpha", "glob": "*.py"}))
        .await?;
    assert_eq!(globbed, "src/b.py:1: def alpha(): pass");

    let literal = fixture
        .text(
            "search",
            json!({"pattern": "ALPHA() {}", "literal": true, "case_insensitive": true, "path": "src"}),
        )
        .await?;
    assert_eq!(literal, "src/a.rs:1: fn alpha() {}");

    let capped = fixture
        .text(
            "search",
            json!({"pattern": "a", "max_results": 2, "gitignore": false}),
        )
        .await?;
    let lines: Vec<&str> = capped.lines().collect();
    assert_eq!(lines.len(), 3, "{capped}");
    assert!(lines[2].contains("stopped at 2 matches"), "{capped}");

    let none = fixture.text("search", json!({"pattern": "zeta"})).await?;
    assert!(none.contains("no matches"), "{none}");

    let invalid = fixture
        .error("search", json!({"pattern": "(unclosed"}))
        .await?;
    assert!(
        matches!(invalid, ToolError::InvalidArguments(_)),
        "{invalid:?}"
    );
    Ok(())
}

/// Every way of naming a file outside the workspace, for every tool that takes a path.
#[tokio::test]
async fn traversal_attempts_are_refused() -> Result<()> {
    let fixture = Fixture::new()?;
    let outside_secret = fixture.outside.join("secret.txt");
    let outside_absolute = outside_secret.to_string_lossy().into_owned();
    for path in [
        "../outside/secret.txt",
        "a/../../outside/secret.txt",
        "/etc/passwd",
        outside_absolute.as_str(),
    ] {
        for (tool, arguments) in [
            ("read_file", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "pwned"})),
            (
                "edit_file",
                json!({"path": path, "old_text": "TOP", "new_text": "pwned"}),
            ),
            ("list_dir", json!({"path": path})),
            ("search", json!({"pattern": "SECRET", "path": path})),
        ] {
            let error = fixture.error(tool, arguments).await?;
            assert!(
                matches!(error, ToolError::InvalidArguments(_)),
                "{tool} {path}: {error:?}"
            );
            let text = message(&error);
            assert!(
                text.contains("outside the workspace") || text.contains("relative"),
                "{tool} {path}: {text}"
            );
        }
    }
    fixture.secret_unchanged()?;

    // An absolute path inside the workspace is fine.
    fixture.write("inside.txt", "ok")?;
    let inside = fixture.workspace.join("inside.txt");
    let text = fixture
        .text("read_file", json!({"path": inside.to_string_lossy()}))
        .await?;
    assert_eq!(text, "ok");
    Ok(())
}

#[tokio::test]
async fn a_symlink_pointing_outside_is_refused() -> Result<()> {
    let fixture = Fixture::new()?;
    let link = fixture.workspace.join("link.txt");
    std::os::unix::fs::symlink(fixture.outside.join("secret.txt"), &link)?;
    let relative_link = fixture.workspace.join("relative.txt");
    std::os::unix::fs::symlink("../outside/secret.txt", &relative_link)?;

    for path in ["link.txt", "relative.txt"] {
        let read = fixture.error("read_file", json!({"path": path})).await?;
        assert!(
            message(&read).contains("refused: the path leads outside the workspace"),
            "{read}"
        );
        let write = fixture
            .error("write_file", json!({"path": path, "content": "pwned"}))
            .await?;
        assert!(
            message(&write).contains("leads outside the workspace"),
            "{write}"
        );
        let edit = fixture
            .error(
                "edit_file",
                json!({"path": path, "old_text": "TOP", "new_text": "pwned"}),
            )
            .await?;
        assert!(message(&edit).contains("outside the workspace"), "{edit}");
    }
    let searched = fixture.text("search", json!({"pattern": "SECRET"})).await?;
    assert!(!searched.contains("TOP SECRET"), "{searched}");
    fixture.secret_unchanged()?;
    // The links are still links (a write did not replace them either).
    assert!(fs::symlink_metadata(&link)?.file_type().is_symlink());

    // A link that stays inside works.
    fixture.write("notes.txt", "inside\n")?;
    std::os::unix::fs::symlink("notes.txt", fixture.workspace.join("alias.txt"))?;
    let alias = fixture
        .text("read_file", json!({"path": "alias.txt"}))
        .await?;
    assert_eq!(alias, "inside\n");
    Ok(())
}

#[tokio::test]
async fn a_symlinked_folder_pointing_outside_is_refused() -> Result<()> {
    let fixture = Fixture::new()?;
    std::os::unix::fs::symlink(&fixture.outside, fixture.workspace.join("escape"))?;

    let read = fixture
        .error("read_file", json!({"path": "escape/secret.txt"}))
        .await?;
    assert!(message(&read).contains("outside the workspace"), "{read}");
    let write = fixture
        .error(
            "write_file",
            json!({"path": "escape/new.txt", "content": "pwned"}),
        )
        .await?;
    assert!(message(&write).contains("outside the workspace"), "{write}");
    assert!(!fixture.outside.join("new.txt").exists());
    let nested = fixture
        .error(
            "write_file",
            json!({"path": "escape/deeper/new.txt", "content": "pwned"}),
        )
        .await?;
    assert!(
        message(&nested).contains("outside the workspace"),
        "{nested}"
    );
    assert!(!fixture.outside.join("deeper").exists());
    let overwrite = fixture
        .error(
            "write_file",
            json!({"path": "escape/secret.txt", "content": "pwned"}),
        )
        .await?;
    assert!(
        message(&overwrite).contains("outside the workspace"),
        "{overwrite}"
    );
    let listed = fixture.error("list_dir", json!({"path": "escape"})).await?;
    assert!(
        message(&listed).contains("outside the workspace"),
        "{listed}"
    );
    let searched = fixture
        .error("search", json!({"pattern": "SECRET", "path": "escape"}))
        .await?;
    assert!(
        message(&searched).contains("outside the workspace"),
        "{searched}"
    );
    // A search of the whole workspace does not follow the link.
    let everywhere = fixture.text("search", json!({"pattern": "SECRET"})).await?;
    assert!(everywhere.contains("no matches"), "{everywhere}");
    fixture.secret_unchanged()?;
    Ok(())
}

#[tokio::test]
async fn a_hard_link_to_an_outside_file_is_refused() -> Result<()> {
    let fixture = Fixture::new()?;
    fs::hard_link(
        fixture.outside.join("secret.txt"),
        fixture.workspace.join("hard.txt"),
    )?;
    let read = fixture
        .error("read_file", json!({"path": "hard.txt"}))
        .await?;
    assert!(message(&read).contains("has 2 hard links"), "{read}");
    let write = fixture
        .error(
            "write_file",
            json!({"path": "hard.txt", "content": "pwned"}),
        )
        .await?;
    assert!(message(&write).contains("hard links"), "{write}");
    let edit = fixture
        .error(
            "edit_file",
            json!({"path": "hard.txt", "old_text": "TOP", "new_text": "pwned"}),
        )
        .await?;
    assert!(message(&edit).contains("hard links"), "{edit}");
    let searched = fixture.text("search", json!({"pattern": "SECRET"})).await?;
    assert!(!searched.contains("TOP SECRET"), "{searched}");
    fixture.secret_unchanged()?;
    Ok(())
}

#[tokio::test]
async fn nul_bytes_and_a_missing_workspace_are_refused() -> Result<()> {
    let fixture = Fixture::new()?;
    for (tool, arguments) in [
        ("read_file", json!({"path": "a\u{0}b"})),
        ("write_file", json!({"path": "a\u{0}/../x", "content": "x"})),
        ("list_dir", json!({"path": "\u{0}"})),
    ] {
        let error = fixture.error(tool, arguments).await?;
        assert!(
            matches!(&error, ToolError::InvalidArguments(text) if text.contains("NUL byte")),
            "{tool}: {error:?}"
        );
    }

    let context = ToolContext::detached("call");
    let error = fixture
        .registry
        .invoke("read_file", json!({"path": "x"}), context, TIMEOUT)
        .await;
    match error {
        Err(ToolError::Failed(text)) => {
            assert!(text.contains("this run has no workspace"), "{text}");
        }
        other => bail!("expected a failure, got {other:?}"),
    }
    Ok(())
}

/// A local HTTP server on `ip` with an HTML page, a large text body and redirects
/// (`/redirect?to=URL` answers `302` to any URL); every request is counted.
async fn web_server_on(ip: &str) -> Result<(String, Arc<AtomicUsize>)> {
    use axum::Router;
    use axum::extract::Query;
    use axum::http::header::{CONTENT_TYPE, LOCATION};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;

    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let app = Router::new()
        .route(
            "/page",
            get(|| async {
                (
                    [(CONTENT_TYPE, "text/html; charset=utf-8")],
                    "<html><head><title>T</title><script>var hidden = 1;</script></head>\
                     <body><h1>Greetings</h1><p>Hello <b>world</b>.</p></body></html>",
                )
            }),
        )
        .route(
            "/big",
            get(|| async { ([(CONTENT_TYPE, "text/plain")], "x".repeat(10_000)) }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "nothing here") }),
        )
        .route(
            "/to-localhost",
            get(|headers: HeaderMap| async move {
                let host = headers
                    .get("host")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .replace("127.0.0.1", "localhost");
                (
                    StatusCode::FOUND,
                    [(LOCATION, format!("http://{host}/page"))],
                )
            }),
        )
        .route(
            "/to-page",
            get(|| async { (StatusCode::FOUND, [(LOCATION, "/page")]) }),
        )
        .route(
            "/redirect",
            get(
                |Query(query): Query<std::collections::HashMap<String, String>>| async move {
                    let to = query.get("to").cloned().unwrap_or_default();
                    (StatusCode::FOUND, [(LOCATION, to)])
                },
            ),
        )
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                counter.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            },
        ));
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{address}"), hits))
}

/// [`web_server_on`] loopback's usual address.
async fn web_server() -> Result<String> {
    Ok(web_server_on("127.0.0.1").await?.0)
}

fn fetch_fixture(policy: NetworkPolicy, max_bytes: usize) -> Result<Fixture> {
    fetch_fixture_with(policy, Vec::new(), max_bytes)
}

/// `fetch` under `policy`, the hosts `private_hosts` reachable at non-public addresses.
fn fetch_fixture_with(
    policy: NetworkPolicy,
    private_hosts: Vec<String>,
    max_bytes: usize,
) -> Result<Fixture> {
    Fixture::with_config(WorkspaceToolsConfig {
        fetch: Some(FetchConfig {
            policy,
            private_hosts,
            max_bytes,
            ..FetchConfig::default()
        }),
        ..WorkspaceToolsConfig::default()
    })
}

#[tokio::test]
async fn fetch_reduces_html_to_text_under_an_allow_list() -> Result<()> {
    let base = web_server().await?;
    // The test server is on loopback: the operator names it as a private host.
    let fixture = fetch_fixture_with(
        NetworkPolicy::Allow(vec!["127.0.0.1".into()]),
        vec!["127.0.0.1".into()],
        1000,
    )?;

    let page = fixture
        .text("fetch", json!({"url": format!("{base}/page")}))
        .await?;
    assert!(page.starts_with(&format!("{base}/page\n\n")), "{page}");
    assert!(page.contains("Greetings"), "{page}");
    assert!(page.contains("Hello") && page.contains("world"), "{page}");
    assert!(!page.contains("<h1>") && !page.contains("<b>"), "{page}");
    assert!(!page.contains("hidden"), "scripts are dropped: {page}");

    // A relative redirect to an allowed host is followed.
    let redirected = fixture
        .text("fetch", json!({"url": format!("{base}/to-page")}))
        .await?;
    assert!(redirected.contains("Greetings"), "{redirected}");

    let big = fixture
        .text("fetch", json!({"url": format!("{base}/big")}))
        .await?;
    assert!(
        big.contains(&format!(
            "{}\n[… truncated: showed 1000 of 10000 bytes]",
            "x".repeat(1000)
        )),
        "{big}"
    );
    assert!(!big.contains(&"x".repeat(1001)));

    let missing = fixture
        .error("fetch", json!({"url": format!("{base}/missing")}))
        .await?;
    assert!(
        message(&missing).contains("HTTP 404 Not Found: nothing here"),
        "{missing}"
    );

    // The policy holds for every hop: a redirect to a name off the list is refused.
    let hop = fixture
        .error("fetch", json!({"url": format!("{base}/to-localhost")}))
        .await?;
    assert!(
        message(&hop).contains("localhost is not on the server's network allow-list"),
        "{hop}"
    );

    let scheme = fixture
        .error("fetch", json!({"url": "file:///etc/passwd"}))
        .await?;
    assert!(
        matches!(scheme, ToolError::InvalidArguments(_)),
        "{scheme:?}"
    );
    Ok(())
}

#[tokio::test]
async fn fetch_is_off_by_default_and_says_how_to_turn_it_on() -> Result<()> {
    let base = web_server().await?;
    assert_eq!(FetchConfig::default().policy, NetworkPolicy::Off);
    let fixture = Fixture::new()?;
    for url in [format!("{base}/page"), "https://example.com/".to_owned()] {
        let error = fixture.error("fetch", json!({"url": url})).await?;
        let text = message(&error);
        assert!(text.contains("refused: fetching is off"), "{url}: {text}");
        assert!(
            text.contains("--allow-domain") && text.contains("--fetch-network public"),
            "the refusal names the settings: {text}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn fetch_refuses_loopback_private_and_link_local_addresses() -> Result<()> {
    let base = web_server().await?;
    let port = base.rsplit(':').next().context("a port")?.to_owned();
    let targets = [
        format!("http://127.0.0.1:{port}/page"),
        "http://10.0.0.1/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://[::1]:{port}/page"),
    ];
    // Public hosts only; and an allow-list that names each of these hosts, without naming any
    // as a private host.
    let listed = NetworkPolicy::Allow(vec![
        "127.0.0.1".into(),
        "10.0.0.1".into(),
        "169.254.169.254".into(),
        "::1".into(),
        "localhost".into(),
    ]);
    for policy in [NetworkPolicy::Public, listed] {
        let fixture = fetch_fixture(policy.clone(), 1000)?;
        for url in &targets {
            let started = std::time::Instant::now();
            let error = fixture.error("fetch", json!({"url": url})).await?;
            let text = message(&error);
            assert!(
                text.starts_with("refused:")
                    && text.contains("loopback, private or link-local address")
                    && text.contains("--allow-private"),
                "{policy:?} {url}: {text}"
            );
            // Refused before any connection is tried (10.0.0.1 would hang).
            assert!(started.elapsed() < Duration::from_secs(2), "{url}");
        }
        // A name is refused after resolving: it resolves only to loopback here.
        let error = fixture
            .error(
                "fetch",
                json!({"url": format!("http://localhost:{port}/page")}),
            )
            .await?;
        assert!(message(&error).contains("refused"), "{policy:?}: {error}");
    }
    let listed = fetch_fixture(NetworkPolicy::Allow(vec!["localhost".into()]), 1000)?;
    let error = listed
        .error(
            "fetch",
            json!({"url": format!("http://localhost:{port}/page")}),
        )
        .await?;
    assert!(
        message(&error).contains("refused: localhost is a loopback, private or link-local"),
        "a listed name at a loopback address is refused: {error}"
    );

    // Private access is per host: the host named is reachable, its neighbours are not.
    let one = fetch_fixture_with(NetworkPolicy::Public, vec!["127.0.0.1".into()], 1000)?;
    let page = one
        .text("fetch", json!({"url": format!("{base}/page")}))
        .await?;
    assert!(page.contains("Greetings"), "{page}");
    for url in [
        "http://10.0.0.1/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://localhost:{port}/page"),
    ] {
        let error = one.error("fetch", json!({"url": url})).await?;
        assert!(message(&error).starts_with("refused:"), "{url}: {error}");
    }

    let any = fetch_fixture(NetworkPolicy::Any, 1000)?;
    let page = any
        .text("fetch", json!({"url": format!("{base}/page")}))
        .await?;
    assert!(page.contains("Greetings"), "{page}");

    let off_list = fetch_fixture(NetworkPolicy::Allow(vec!["example.com".into()]), 1000)?;
    let error = off_list
        .error("fetch", json!({"url": format!("{base}/page")}))
        .await?;
    assert!(
        message(&error).contains("127.0.0.1 is not on the server's network allow-list"),
        "{error}"
    );

    // The policy is configuration: it reads and writes as JSON.
    let policy: NetworkPolicy = serde_json::from_value(json!({"allow": ["example.com"]}))?;
    assert_eq!(policy, NetworkPolicy::Allow(vec!["example.com".into()]));
    assert_eq!(
        serde_json::from_value::<NetworkPolicy>(json!("off"))?,
        NetworkPolicy::Off
    );
    Ok(())
}

#[tokio::test]
async fn fetch_refuses_a_redirect_to_a_private_address() -> Result<()> {
    // The first hop is a server at 127.0.0.2, the one private host the operator names; the
    // redirect targets are a second server at 127.0.0.1 (counting its requests), the cloud
    // metadata address and a name resolving to loopback.
    let (first, _) = web_server_on("127.0.0.2").await?;
    let (second, second_hits) = web_server_on("127.0.0.1").await?;
    let port = second.rsplit(':').next().context("a port")?.to_owned();
    let targets = [
        format!("{second}/page"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://localhost:{port}/page"),
    ];
    let listed = NetworkPolicy::Allow(vec![
        "127.0.0.2".into(),
        "127.0.0.1".into(),
        "169.254.169.254".into(),
        "localhost".into(),
    ]);
    for policy in [NetworkPolicy::Public, listed] {
        let fixture = fetch_fixture_with(policy.clone(), vec!["127.0.0.2".into()], 1000)?;
        // The first hop itself is allowed, and so is a redirect that stays on it.
        let page = fixture
            .text("fetch", json!({"url": format!("{first}/to-page")}))
            .await?;
        assert!(page.contains("Greetings"), "{policy:?}: {page}");
        for target in &targets {
            let url = format!("{first}/redirect?to={target}");
            let error = fixture.error("fetch", json!({"url": url})).await?;
            let text = message(&error);
            assert!(
                text.contains(&format!("redirected to {target}"))
                    && text.contains("refused:")
                    && text.contains("loopback, private or link-local"),
                "{policy:?} {target}: {text}"
            );
        }
    }
    assert_eq!(
        second_hits.load(Ordering::SeqCst),
        0,
        "no redirect reached the second server"
    );
    Ok(())
}

#[tokio::test]
async fn a_runs_network_setting_narrows_fetch_and_never_widens_it() -> Result<()> {
    let base = web_server().await?;
    let page = json!({"url": format!("{base}/page")});
    let fixture = fetch_fixture_with(
        NetworkPolicy::Allow(vec!["127.0.0.1".into(), "example.com".into()]),
        vec!["127.0.0.1".into()],
        1000,
    )?;
    // Allowed by the operator and by the agent.
    let output = fixture
        .call_narrowed(
            "fetch",
            page.clone(),
            vec![NetworkPolicy::Allow(vec!["127.0.0.1".into()])],
        )
        .await?;
    assert!(text_of(&output).contains("Greetings"));

    let cases = [
        (
            NetworkPolicy::Allow(vec!["docs.rs".into()]),
            "127.0.0.1 is not on this agent's network allow-list",
        ),
        (NetworkPolicy::Off, "fetching is off for this agent"),
        // Public addresses only: the operator's private host is not.
        (NetworkPolicy::Public, "loopback, private or link-local"),
    ];
    for (narrowing, expected) in cases {
        let error = fixture
            .call_narrowed("fetch", page.clone(), vec![narrowing.clone()])
            .await
            .err()
            .with_context(|| format!("{narrowing:?} should refuse"))?;
        assert!(message(&error).contains(expected), "{narrowing:?}: {error}");
    }

    // An agent cannot widen: `any` over an operator's allow-list is still that list, and over
    // fetching turned off is still off.
    let error = fixture
        .call_narrowed(
            "fetch",
            json!({"url": "http://10.0.0.1/"}),
            vec![NetworkPolicy::Any],
        )
        .await
        .err()
        .context("10.0.0.1 is not on the operator's list")?;
    assert!(
        message(&error).contains("not on the server's network allow-list"),
        "{error}"
    );
    let off = Fixture::new()?;
    let error = off
        .call_narrowed("fetch", page, vec![NetworkPolicy::Any])
        .await
        .err()
        .context("fetch is off")?;
    assert!(message(&error).contains("fetching is off"), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_model_writes_then_reads_a_file_in_its_workspace() -> Result<()> {
    for protocol in PROTOCOLS {
        let workspace = tempfile::tempdir()?;
        let mock = MockProvider::start().await?;
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "write_file",
            json!({"path": "notes/todo.md", "content": "- ship it\n"}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "read_file",
            json!({"path": "notes/todo.md"}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
        let mut builder = builder(&mock, protocol);
        for tool in workspace_tools(WorkspaceToolsConfig::default()) {
            builder.tool_arc(tool)?;
        }
        builder.limits(limits());
        let request = RunRequest::text("write a todo").with_workspace(workspace.path());
        let (events, output) = run_collect(&builder.build(), request).await;
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        assert_eq!(output.state.workspace.as_deref(), Some(workspace.path()));

        let results = result_texts(&events);
        assert_eq!(
            results,
            vec![
                (
                    "wrote 10 bytes to notes/todo.md (created)".to_owned(),
                    false
                ),
                ("- ship it\n".to_owned(), false),
            ],
            "{protocol:?}"
        );
        assert_eq!(
            fs::read_to_string(workspace.path().join("notes/todo.md"))?,
            "- ship it\n"
        );
        // The model saw the file's content in its next request.
        assert!(mock.requests()[2].body.to_string().contains("ship it"));
        if let Err(violations) = mock.check_protocol() {
            bail!("{protocol:?}: {violations:?}");
        }
    }
    Ok(())
}

#[test]
fn the_workspace_is_part_of_the_request_and_the_run_state() -> Result<()> {
    let request = RunRequest::text("hi").with_workspace("/data/workspaces/s1");
    let value = serde_json::to_value(&request)?;
    assert_eq!(value["workspace"], json!("/data/workspaces/s1"));
    let back: RunRequest = serde_json::from_value(value)?;
    assert_eq!(back, request);
    // Absent, it is left out.
    let plain = serde_json::to_value(RunRequest::text("hi"))?;
    assert!(plain.get("workspace").is_none());
    Ok(())
}
