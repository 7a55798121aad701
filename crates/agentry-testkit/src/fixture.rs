//! Recorded provider exchanges: loading `<provider>/<name>.json` files from the shared fixtures
//! directory into [`Fixture`] values that the mock can replay byte for byte.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};

use crate::error::TestkitError;

/// Environment variable that overrides where fixtures are looked up.
pub const FIXTURES_DIR_ENV: &str = "AGENTRY_FIXTURES_DIR";

/// The directory holding `<provider>/<name>.json` fixtures.
///
/// `AGENTRY_FIXTURES_DIR` wins when set and non-empty; otherwise it is
/// `<workspace root>/../shared/fixtures/providers`, where the workspace root is two directories
/// above this crate's manifest.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os(FIXTURES_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/providers"),
    }
}

/// One recorded exchange with a model provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Fixture {
    /// `<provider>/<file stem>`, e.g. `anthropic/messages_thinking_stream`.
    pub name: String,
    /// The provider directory the fixture lives in, e.g. `anthropic`.
    pub provider: String,
    /// Where the recording comes from.
    pub source: String,
    /// How faithful the body is to the wire (`raw`, `reserialized`, `issue-paste`, ...).
    pub fidelity: String,
    /// What the exchange exercises.
    pub notes: String,
    /// The request that produced the response, when it was recorded.
    pub request: Option<FixtureRequest>,
    /// The response status code.
    pub status: u16,
    /// The response headers, in file order, names as recorded.
    pub headers: Vec<(String, String)>,
    /// The response body text (SSE and NDJSON kept as text).
    pub body: String,
}

/// The request half of a recorded exchange.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FixtureRequest {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// The full request URI as sent to the provider.
    pub uri: String,
    /// The request body: a JSON object, or a string when only a description was kept.
    #[serde(default)]
    pub body: serde_json::Value,
}

/// The on-disk shape of a fixture file.
#[derive(Deserialize)]
struct FixtureFile {
    #[serde(default)]
    source: String,
    #[serde(default)]
    fidelity: String,
    #[serde(default)]
    notes: String,
    #[serde(default)]
    request: Option<FixtureRequest>,
    response_status: u16,
    #[serde(default, deserialize_with = "header_pairs")]
    response_headers: Vec<(String, String)>,
    response_body: String,
}

impl Fixture {
    /// Loads one fixture file. Its name is `<parent directory>/<file stem>`.
    pub fn load(path: &Path) -> Result<Fixture, TestkitError> {
        let text = std::fs::read_to_string(path).map_err(|source| TestkitError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file: FixtureFile =
            serde_json::from_str(&text).map_err(|source| TestkitError::FixtureJson {
                path: path.to_path_buf(),
                source,
            })?;
        let invalid = |reason: &str| TestkitError::InvalidFixture {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| invalid("file name is not UTF-8"))?;
        let provider = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|s| s.to_str())
            .ok_or_else(|| invalid("fixture must live in a <provider>/ directory"))?;
        if !(100..=999).contains(&file.response_status) {
            return Err(invalid("response_status is not a valid HTTP status"));
        }
        Ok(Fixture {
            name: format!("{provider}/{stem}"),
            provider: provider.to_owned(),
            source: file.source,
            fidelity: file.fidelity,
            notes: file.notes,
            request: file.request,
            status: file.response_status,
            headers: file.response_headers,
            body: file.response_body,
        })
    }

    /// Loads every `*.json` fixture in the provider directories under [`fixtures_dir`],
    /// sorted by name.
    pub fn all() -> Result<Vec<Fixture>, TestkitError> {
        let dir = fixtures_dir();
        let mut fixtures = Vec::new();
        for provider_dir in sorted_entries(&dir)? {
            if !provider_dir.is_dir() {
                continue;
            }
            for file in sorted_entries(&provider_dir)? {
                if file.is_file() && file.extension().is_some_and(|ext| ext == "json") {
                    fixtures.push(Fixture::load(&file)?);
                }
            }
        }
        fixtures.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(fixtures)
    }

    /// Loads the fixture called `name`, e.g. `"anthropic/messages_thinking_stream"`.
    pub fn named(name: &str) -> Result<Fixture, TestkitError> {
        let dir = fixtures_dir();
        let path = dir.join(format!("{name}.json"));
        if !path.is_file() {
            return Err(TestkitError::FixtureNotFound {
                name: name.to_owned(),
                dir,
            });
        }
        Fixture::load(&path)
    }

    /// The first response header called `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the response is a stream: `text/event-stream` (SSE) or `application/x-ndjson`.
    pub fn is_streaming(&self) -> bool {
        self.header("content-type").is_some_and(|ct| {
            let media = ct.split(';').next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("text/event-stream")
                || media.eq_ignore_ascii_case("application/x-ndjson")
        })
    }
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, TestkitError> {
    let io_error = |source| TestkitError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths = std::fs::read_dir(dir)
        .map_err(io_error)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_error)?;
    paths.sort();
    Ok(paths)
}

/// Deserializes a JSON object of string values into name/value pairs, keeping file order.
fn header_pairs<'de, D>(deserializer: D) -> Result<Vec<(String, String)>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct PairsVisitor;

    impl<'de> Visitor<'de> for PairsVisitor {
        type Value = Vec<(String, String)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of header names to string values")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
            while let Some(pair) = map.next_entry::<String, String>()? {
                pairs.push(pair);
            }
            Ok(pairs)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
    }

    deserializer.deserialize_any(PairsVisitor)
}
