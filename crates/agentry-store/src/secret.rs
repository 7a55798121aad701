//! Secrets at rest: the key, its file, and the sealed form stored in the database.
//!
//! Each value is sealed with XChaCha20-Poly1305 under a 32-byte key that never enters the
//! database. The stored blob is `version (1 byte) ‖ nonce (24 random bytes) ‖ ciphertext+tag`,
//! and the secret's name is authenticated as associated data, so a blob copied onto another
//! name does not open. Version 1 seals the value alone; version 2 seals it with the hosts it may
//! be sent to (JSON `{"value", "hosts"}`), so the binding cannot be changed without the key.

use std::fmt;
use std::io::Write;
use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::StoreError;

/// A value alone.
const SEALED_VERSION: u8 = 1;
/// A value with the hosts it may be sent to.
const SEALED_BOUND_VERSION: u8 = 2;
const NONCE_LEN: usize = 24;
const KEY_LEN: usize = 32;

/// The 32-byte key that encrypts secrets at rest. Its `Debug` form never shows it.
#[derive(Clone)]
pub struct SecretKey([u8; KEY_LEN]);

impl SecretKey {
    /// A key from its bytes (from a key manager, an environment variable, a test).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Self, StoreError> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes)
            .map_err(|e| StoreError::Crypto(format!("no randomness for a key: {e}")))?;
        Ok(Self(bytes))
    }

    /// A random key for this process only. Uses the operating system's generator; should that
    /// fail, falls back to the standard library's randomly seeded hasher keys.
    pub(crate) fn ephemeral() -> Self {
        Self::generate().unwrap_or_else(|_| {
            use std::hash::{BuildHasher, Hasher};
            let mut bytes = [0u8; KEY_LEN];
            for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                hasher.write_usize(i);
                hasher.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos()),
                );
                chunk.copy_from_slice(&hasher.finish().to_le_bytes());
            }
            Self(bytes)
        })
    }

    /// Reads the key from `path`, or creates it there: 32 random bytes in a file only the owner
    /// can read (mode 0600 on Unix).
    ///
    /// Creation is atomic: the key is written to a temporary file beside it and linked into
    /// place, so concurrent callers all end up with the same key. This does blocking file IO;
    /// async callers run it on a blocking thread.
    pub fn load_or_create(path: &Path) -> Result<Self, StoreError> {
        match Self::load(path) {
            Ok(Some(key)) => return Ok(key),
            Ok(None) => {}
            Err(error) => return Err(error),
        }
        let key = Self::generate()?;
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or_else(|| Path::new("."));
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix)
            .map_err(|e| StoreError::Crypto(format!("no randomness: {e}")))?;
        let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        let temp = dir.join(format!(".secret.key.{suffix}.tmp"));
        let written = write_private(&temp, &key.0);
        let linked = written.and_then(|()| std::fs::hard_link(&temp, path));
        // The temporary name goes whatever happened; only the linked name stays.
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => {
                tracing::info!(path = %path.display(), "created a new secret key");
                Ok(key)
            }
            // Someone else created it first: theirs wins.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path)?
                .ok_or_else(|| StoreError::Crypto("the key file vanished while created".into())),
            Err(error) => Err(StoreError::io(
                format!("cannot create the secret key file {}", path.display()),
                error,
            )),
        }
    }

    fn load(path: &Path) -> Result<Option<Self>, StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(StoreError::io(
                    format!("cannot read the secret key file {}", path.display()),
                    error,
                ));
            }
        };
        let bytes: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            StoreError::Crypto(format!(
                "the secret key file {} holds {} bytes, expected {KEY_LEN}",
                path.display(),
                bytes.len()
            ))
        })?;
        warn_if_shared(path);
        Ok(Some(Self(bytes)))
    }

    fn cipher(&self) -> Result<XChaCha20Poly1305, StoreError> {
        XChaCha20Poly1305::new_from_slice(&self.0)
            .map_err(|e| StoreError::Crypto(format!("unusable key: {e}")))
    }

    /// Seals `value` for the secret called `name`, bound to `hosts` when given.
    pub(crate) fn seal(
        &self,
        name: &str,
        value: &str,
        hosts: Option<&[String]>,
    ) -> Result<Vec<u8>, StoreError> {
        let (version, plain) = match hosts {
            None => (SEALED_VERSION, value.as_bytes().to_vec()),
            Some(hosts) => (
                SEALED_BOUND_VERSION,
                serde_json::to_vec(&BoundPlain {
                    value: value.to_owned(),
                    hosts: hosts.to_vec(),
                })
                .map_err(|e| StoreError::Crypto(format!("cannot encode secret {name:?}: {e}")))?,
            ),
        };
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|e| StoreError::Crypto(format!("no randomness for a nonce: {e}")))?;
        let aad = associated_data(version, name);
        let sealed = self
            .cipher()?
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::Crypto(format!("cannot encrypt secret {name:?}")))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(version);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// A 32-byte key for `purpose`, derived from this one (HMAC-SHA256 of the purpose): every
    /// process holding the same key file derives the same one, and it reveals nothing of this
    /// key or of the keys for other purposes.
    pub(crate) fn derive(&self, purpose: &str) -> Result<[u8; 32], StoreError> {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0)
            .map_err(|e| StoreError::Crypto(format!("unusable key: {e}")))?;
        mac.update(b"agentry.derive:");
        mac.update(purpose.as_bytes());
        Ok(mac.finalize().into_bytes().into())
    }

    /// Opens a blob made by [`SecretKey::seal`] for the same name.
    pub(crate) fn open(&self, name: &str, blob: &[u8]) -> Result<OpenedSecret, StoreError> {
        let (version, rest) = blob
            .split_first()
            .ok_or_else(|| StoreError::Crypto(format!("secret {name:?} is empty")))?;
        if !matches!(*version, SEALED_VERSION | SEALED_BOUND_VERSION) || rest.len() < NONCE_LEN {
            return Err(StoreError::Crypto(format!(
                "secret {name:?} is not in a format this build knows"
            )));
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce
            .try_into()
            .map_err(|_| StoreError::Crypto(format!("secret {name:?} has a short nonce")))?;
        let aad = associated_data(*version, name);
        let plain = self
            .cipher()?
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                StoreError::Crypto(format!(
                    "cannot decrypt secret {name:?}: the secret key is not the one it was stored \
                     with, or the stored value was altered"
                ))
            })?;
        if *version == SEALED_BOUND_VERSION {
            let bound: BoundPlain = serde_json::from_slice(&plain).map_err(|_| {
                StoreError::Crypto(format!(
                    "secret {name:?} is not in a format this build knows"
                ))
            })?;
            return Ok(OpenedSecret {
                value: bound.value,
                hosts: Some(bound.hosts),
            });
        }
        let value = String::from_utf8(plain)
            .map_err(|_| StoreError::Crypto(format!("secret {name:?} is not UTF-8")))?;
        Ok(OpenedSecret { value, hosts: None })
    }
}

/// What a version-2 blob seals.
#[derive(serde::Serialize, serde::Deserialize)]
struct BoundPlain {
    value: String,
    hosts: Vec<String>,
}

/// A secret's value and, when it is bound, the hosts it may be sent to (as they were stored;
/// the application checks and matches them).
#[derive(Clone, PartialEq, Eq)]
pub struct OpenedSecret {
    /// The value.
    pub value: String,
    /// The hosts it may be sent to; `None` when it is not bound.
    pub hosts: Option<Vec<String>>,
}

impl fmt::Debug for OpenedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedSecret")
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

/// The associated data of a secret's blob: its name, and for a bound one its version too, so a
/// bound blob relabelled as unbound (its hosts then read as part of the value) does not open.
fn associated_data(version: u8, name: &str) -> Vec<u8> {
    let mut aad = match version {
        SEALED_VERSION => b"agentry.secret:".to_vec(),
        _ => format!("agentry.secret.v{version}:").into_bytes(),
    };
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// Values shorter than this are shown only as `…`: at this length the four-character tail
/// is a quarter of the value, and no shorter value shows more than nothing.
const MASK_MIN_CHARS: usize = 16;

/// Characters of the tail that a masked value shows.
const MASK_TAIL_CHARS: usize = 4;

/// The masked form of a secret value: `…` and its last 4 characters, or only `…` when the
/// value is shorter than 16 characters, so the mask never shows more than a quarter of the
/// value and never its beginning (which often names the provider and narrows a search).
pub(crate) fn mask(value: &str) -> String {
    let chars: Vec<char> = value.chars().collect();
    if chars.len() < MASK_MIN_CHARS {
        return "…".to_owned();
    }
    let tail: String = chars.iter().skip(chars.len() - MASK_TAIL_CHARS).collect();
    format!("…{tail}")
}

/// Creates `path` (which must not exist) readable by its owner only, and writes `bytes`.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(unix)]
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the secret key file is readable by others; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_binding() {
        let key = SecretKey::from_bytes([7; 32]);
        let blob = key.seal("openai", "sk-secret-value", None).unwrap();
        let opened = key.open("openai", &blob).unwrap();
        assert_eq!(opened.value, "sk-secret-value");
        assert_eq!(opened.hosts, None);
        // Bound to the name.
        assert!(matches!(
            key.open("anthropic", &blob),
            Err(StoreError::Crypto(_))
        ));
        // Bound to the key.
        let other = SecretKey::from_bytes([8; 32]);
        assert!(matches!(
            other.open("openai", &blob),
            Err(StoreError::Crypto(_))
        ));
        // Fresh nonce every time.
        assert_ne!(blob, key.seal("openai", "sk-secret-value", None).unwrap());
        assert!(matches!(
            key.open("openai", &[]),
            Err(StoreError::Crypto(_))
        ));
    }

    #[test]
    fn a_bound_blob_opens_with_its_hosts_and_an_altered_one_does_not() {
        let key = SecretKey::from_bytes([7; 32]);
        let hosts = vec!["api.example.com".to_owned()];
        let blob = key.seal("openai", "sk-secret-value", Some(&hosts)).unwrap();
        assert_eq!(blob[0], SEALED_BOUND_VERSION);
        let opened = key.open("openai", &blob).unwrap();
        assert_eq!(opened.value, "sk-secret-value");
        assert_eq!(opened.hosts, Some(hosts));
        assert!(!format!("{opened:?}").contains("sk-secret-value"));
        // Relabelled as unbound, or with a byte changed, it does not open.
        let mut relabelled = blob.clone();
        relabelled[0] = SEALED_VERSION;
        assert!(key.open("openai", &relabelled).is_err());
        let mut altered = blob;
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(key.open("openai", &altered).is_err());
    }

    #[test]
    fn masks() {
        assert_eq!(mask("sk-abcdefghijwxyz"), "…wxyz");
        assert_eq!(mask("short"), "…");
        assert_eq!(mask("sk-abcdefghwxyz"), "…");
        assert_eq!(mask("twelve_chars"), "…");
        assert_eq!(mask("ключ-абвгдежзийк"), "…зийк");
        // Never the head, and never more than a quarter of the value.
        for len in 0..64 {
            let value: String = "abcdefghijklmnopqrstuvwxyz0123456789"
                .chars()
                .cycle()
                .take(len)
                .collect();
            let shown = mask(&value).chars().filter(|c| *c != '…').count();
            assert!(shown * 4 <= len, "{len} chars show {shown}");
            if len > 0 {
                assert!(!mask(&value).starts_with('a'), "{len} chars show the head");
            }
        }
    }

    #[test]
    fn debug_is_redacted() {
        let key = SecretKey::from_bytes([42; 32]);
        assert_eq!(format!("{key:?}"), "SecretKey(<redacted>)");
    }
}
