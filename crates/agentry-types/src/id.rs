//! Time-ordered, opaque, validated identifiers.
//!
//! Ids are UUIDv7 (millisecond timestamp first, then randomness), written in the canonical
//! hyphenated lowercase form. They sort by creation time, never collide under concurrency, and
//! parsing accepts nothing else, so an id taken from a client can never smuggle in a path.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {kind} id {value:?}: expected a UUIDv7 such as 01890a5d-ac96-774b-bcce-b302099a8057"
)]
pub struct IdError {
    /// Which kind of id was expected (`session`, `run`).
    pub kind: &'static str,
    /// The rejected input, truncated to 64 characters.
    pub value: String,
}

macro_rules! time_ordered_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh id for the current instant.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Parses and validates an id received from outside.
            pub fn parse(value: &str) -> Result<Self, IdError> {
                let invalid = || IdError {
                    kind: $kind,
                    value: value.chars().take(64).collect(),
                };
                // Only the canonical 36-character hyphenated form is accepted.
                if value.len() != 36 {
                    return Err(invalid());
                }
                let uuid = Uuid::try_parse(value).map_err(|_| invalid())?;
                if uuid.get_version_num() != 7 || uuid.hyphenated().to_string() != value {
                    return Err(invalid());
                }
                Ok(Self(uuid))
            }

            /// Milliseconds since the Unix epoch at which the id was made.
            pub fn timestamp_millis(&self) -> u64 {
                let (secs, nanos) = self
                    .0
                    .get_timestamp()
                    .map(|ts| ts.to_unix())
                    .unwrap_or((0, 0));
                secs * 1000 + u64::from(nanos) / 1_000_000
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(&self.0.hyphenated())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

time_ordered_id!(
    /// Identifies a session: one conversation and its event log.
    SessionId,
    "session"
);
time_ordered_id!(
    /// Identifies one run: a request processed to its final answer inside a session.
    RunId,
    "run"
);

/// A short random suffix for ids that providers leave out (Ollama tool calls, for example).
///
/// Deterministic callers derive ids from content instead; this is for uniqueness only.
pub fn random_suffix() -> String {
    Uuid::now_v7().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_by_time() {
        let a = SessionId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = SessionId::new();
        assert!(a < b);
        assert_eq!(SessionId::parse(&a.to_string()).unwrap(), a);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<SessionId>(&json).unwrap(), a);
        assert!(b.timestamp_millis() >= a.timestamp_millis());
    }

    #[test]
    fn rejects_anything_but_canonical_v7() {
        for bad in [
            "",
            "../../etc/passwd",
            "1700000000",
            "01890A5D-AC96-774B-BCCE-B302099A8057",
            "01890a5dac96774bbccEb302099a8057",
            "67e55044-10b1-426f-9247-bb680e5fe0c8", // v4
            "01890a5d-ac96-774b-bcce-b302099a8057/..",
        ] {
            let err = SessionId::parse(bad).unwrap_err();
            assert_eq!(err.kind, "session");
        }
        assert!(serde_json::from_str::<RunId>("\"nope\"").is_err());
    }
}
