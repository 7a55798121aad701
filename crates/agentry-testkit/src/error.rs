//! The crate's error type: everything that can go wrong loading fixtures or starting the mock.

use std::path::PathBuf;

/// Errors from loading fixtures and starting the mock provider.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// A fixture file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or directory that failed.
        path: PathBuf,
        /// The underlying IO error.
        #[source]
        source: std::io::Error,
    },
    /// A fixture file is not valid JSON or does not have the fixture shape.
    #[error("fixture {path} is malformed: {source}")]
    FixtureJson {
        /// The fixture file.
        path: PathBuf,
        /// The underlying parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A fixture file parsed but its contents are inconsistent.
    #[error("fixture {path} is invalid: {reason}")]
    InvalidFixture {
        /// The fixture file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No fixture with that name exists under the fixtures directory.
    #[error("no fixture named {name:?} under {dir}")]
    FixtureNotFound {
        /// The requested name, e.g. `anthropic/messages_thinking_stream`.
        name: String,
        /// The directory that was searched.
        dir: PathBuf,
    },
    /// The mock server could not bind its loopback socket.
    #[error("cannot bind the mock provider socket: {0}")]
    Bind(#[source] std::io::Error),
}
