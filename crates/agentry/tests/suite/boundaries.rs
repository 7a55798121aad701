//! The layering, checked: `cargo metadata` for what each crate depends on, and a scan of the
//! sources where metadata cannot tell (which crate names `rmcp`, whether the binary reaches into
//! the HTTP crate). See `ARCHITECTURE.md` and `docs/style.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The workspace root (two folders above this crate).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// Each workspace crate's normal (not dev, not build) dependencies, by crate name.
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dependency| dependency["kind"].is_null())
                .map(|dependency| dependency["name"].as_str().unwrap().to_owned())
                .collect();
            (package["name"].as_str().unwrap().to_owned(), dependencies)
        })
        .collect()
}

/// The workspace crates a crate depends on normally.
fn ours(dependencies: &BTreeSet<String>) -> BTreeSet<&str> {
    dependencies
        .iter()
        .map(String::as_str)
        .filter(|name| name.starts_with("agentry"))
        .collect()
}

/// Every `.rs` file under `folder`, with its text.
fn sources(folder: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![folder.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                found.push((path, text));
            }
        }
    }
    found
}

#[test]
fn the_layers_depend_only_downwards() {
    let crates = normal_dependencies();
    let of = |name: &str| {
        crates
            .get(name)
            .unwrap_or_else(|| panic!("no crate {name} in the workspace"))
    };

    // The HTTP crate is an adapter over the application: the app layer and the wire vocabulary.
    assert_eq!(
        ours(of("agentry-server")),
        BTreeSet::from(["agentry-app", "agentry-types"]),
        "agentry-server may depend only on agentry-app and agentry-types"
    );

    // The application sits on the engine and its peers, never on a front-end.
    let app = ours(of("agentry-app"));
    for front_end in ["agentry-server", "agentry"] {
        assert!(
            !app.contains(front_end),
            "agentry-app depends on {front_end}"
        );
    }

    // The engine links no database driver and no HTTP server, knows no front-end, no store and
    // no application, and leaves sandboxes, fetching and searching to the built-in tools.
    let core = of("agentry-core");
    for forbidden in [
        "sqlx",
        "axum",
        "hyper",
        "tower-http",
        "utoipa",
        "reqwest",
        "grep-regex",
        "grep-searcher",
        "html2text",
        "agentry-sandbox",
        "agentry-tools",
        "agentry-store",
        "agentry-mcp",
        "agentry-app",
        "agentry-server",
    ] {
        assert!(
            !core.contains(forbidden),
            "agentry-core depends on {forbidden}"
        );
    }

    // The lower floors know nothing above them.
    for (lower, above) in [
        (
            "agentry-types",
            vec!["agentry-llm", "agentry-core", "agentry-store"],
        ),
        (
            "agentry-llm",
            vec!["agentry-core", "agentry-store", "agentry-app"],
        ),
        (
            "agentry-store",
            vec!["agentry-core", "agentry-app", "agentry-server"],
        ),
        (
            "agentry-mcp",
            vec!["agentry-core", "agentry-app", "agentry-server"],
        ),
        (
            "agentry-sandbox",
            vec!["agentry-core", "agentry-app", "agentry-server"],
        ),
    ] {
        let dependencies = of(lower);
        for name in above {
            assert!(!dependencies.contains(name), "{lower} depends on {name}");
        }
    }

    // Only the MCP crate links rmcp.
    for (name, dependencies) in &crates {
        if name != "agentry-mcp" {
            assert!(!dependencies.contains("rmcp"), "{name} depends on rmcp");
        }
    }
}

#[test]
fn only_the_mcp_crate_names_rmcp_and_the_binary_uses_the_http_crate_only_to_serve() {
    let crates = root().join("crates");
    // Spelt in two pieces so this file does not name it.
    let rmcp = format!("{}::", "rmcp");
    for (path, text) in sources(&crates) {
        let inside_mcp = path.starts_with(crates.join("agentry-mcp"));
        if !inside_mcp {
            assert!(
                !text.contains(&rmcp),
                "{} names rmcp: only agentry-mcp may",
                path.display()
            );
        }
    }
    // The binary reaches the HTTP crate for `agentry serve` only, through its public API.
    let cli = crates.join("agentry/src");
    for (path, text) in sources(&cli) {
        let serve = path.ends_with("cli/serve.rs");
        for (index, line) in text.lines().enumerate() {
            if !line.contains("agentry_server") {
                continue;
            }
            assert!(
                serve,
                "{}:{}: only cli/serve.rs may use agentry_server: {line}",
                path.display(),
                index + 1
            );
            assert!(
                !line.contains("routes"),
                "{}:{}: the binary names the server's routes: {line}",
                path.display(),
                index + 1
            );
        }
    }
}

#[test]
fn no_static_holds_live_state_in_the_application_or_the_http_crate() {
    let crates = root().join("crates");
    for folder in ["agentry-app/src", "agentry-server/src"] {
        for (path, text) in sources(&crates.join(folder)) {
            for (index, line) in text.lines().enumerate() {
                let line = line.trim_start();
                let is_static = line.starts_with("static ") || line.contains(" static ");
                // Caches computed once (a document, ETags) are fine; anything that changes is not.
                let live = ["Mutex", "RwLock", "RefCell", "Atomic", "broadcast"]
                    .iter()
                    .any(|kind| line.contains(kind));
                assert!(
                    !(is_static && live && !line.starts_with("//")),
                    "{}:{}: a static holding live state: {line}",
                    path.display(),
                    index + 1
                );
            }
        }
    }
}

/// `ARCHITECTURE.md` stays a short code map that names only what exists: under 40 KB, every
/// repository path it writes in backticks (a token starting `crates/`, `e2e/`, `scripts/`,
/// `docs/`, `.ci/` or `examples/`, any `….rs`, and a `….md` or `….toml` under a folder) is a file
/// or folder of the repository, and every crate it names (`agentry-…`) is a folder of `crates/`.
/// A rename that leaves the map behind fails here instead of misleading its next reader. Code
/// spans must not wrap across lines; fenced blocks (the crate diagram) are not read.
#[test]
fn architecture_md_is_a_short_code_map_whose_paths_exist() {
    let repository = root();
    let text = std::fs::read_to_string(repository.join("ARCHITECTURE.md")).unwrap();
    assert!(
        text.len() < 40_000,
        "ARCHITECTURE.md is {} bytes: a code map stays under 40,000 (what changes rarely; the \
         detail belongs in the modules' docs)",
        text.len()
    );
    let mut missing = BTreeSet::new();
    let mut unbalanced = Vec::new();
    let mut in_fence = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if !line.matches('`').count().is_multiple_of(2) {
            unbalanced.push(index + 1);
            continue;
        }
        // The code spans: every other piece between backticks.
        for token in line.split('`').skip(1).step_by(2) {
            if token.is_empty()
                || token.starts_with('/')
                || token.starts_with("http")
                || [" ", "{", "*", "<", "::"]
                    .iter()
                    .any(|odd| token.contains(*odd))
            {
                continue;
            }
            if token.starts_with("agentry-")
                && token
                    .chars()
                    .all(|character| character.is_ascii_lowercase() || character == '-')
            {
                if !repository.join("crates").join(token).is_dir() {
                    missing.insert(format!("crate {token} (no crates/{token})"));
                }
                continue;
            }
            let is_path = ["crates/", "e2e/", "scripts/", "docs/", ".ci/", "examples/"]
                .iter()
                .any(|prefix| token.starts_with(*prefix))
                || token.ends_with(".rs")
                || (token.contains('/') && (token.ends_with(".md") || token.ends_with(".toml")));
            if is_path && !repository.join(token.trim_end_matches('/')).exists() {
                missing.insert(token.to_owned());
            }
        }
    }
    assert!(
        unbalanced.is_empty(),
        "ARCHITECTURE.md: lines {unbalanced:?} have an odd number of backticks (a code span must \
         not wrap across lines)"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names {} path(s) or crate(s) that do not exist:\n  {}",
        missing.len(),
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}
