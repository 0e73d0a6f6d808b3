//! The cluster secret file: one hex secret per line; the first signs, every one is accepted.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rand::TryRngCore;

use crate::AuthError;

/// Bytes in a secret (64 hex digits in the file).
pub const SECRET_LEN: usize = 32;
/// More lines than a rotation needs (old + new) is a mistake, not a config.
const MAX_SECRETS: usize = 8;
/// A secret file is a few hundred bytes; refuse to read a huge one.
const MAX_FILE_BYTES: u64 = 4096;

/// One cluster secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; SECRET_LEN]);

impl Secret {
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Secret {
        Secret(bytes)
    }

    /// 32 bytes from the operating system's random source.
    pub fn generate() -> Result<Secret, std::io::Error> {
        let mut bytes = [0u8; SECRET_LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(std::io::Error::other)?;
        Ok(Secret(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(text: &str) -> Option<Secret> {
        if text.len() != 2 * SECRET_LEN || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; SECRET_LEN];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Secret(bytes))
    }
}

impl fmt::Debug for Secret {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The secrets of one file, in its order: the first signs, all are accepted. Never empty.
#[derive(Clone, Debug)]
pub struct Secrets(Vec<Secret>);

impl Secrets {
    pub fn new(first: Secret, more: impl IntoIterator<Item = Secret>) -> Secrets {
        Secrets(std::iter::once(first).chain(more).collect())
    }

    /// The secret this side proves itself with.
    pub fn signing(&self) -> &Secret {
        &self.0[0]
    }

    /// Every secret a peer may prove itself with.
    pub fn accepted(&self) -> &[Secret] {
        &self.0
    }

    /// Reads `path` (at most 4 KiB). A file readable by others is used, with a warning.
    pub fn load(path: &Path) -> Result<Secrets, AuthError> {
        let error = |detail: String| AuthError::SecretFile {
            path: path.display().to_string(),
            detail,
        };
        let file = std::fs::File::open(path).map_err(|e| error(e.to_string()))?;
        if let Ok(meta) = file.metadata() {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "the cluster secret file is readable by others; chmod 600 it");
            }
        }
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| error(e.to_string()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(error(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        parse_secrets(&text).map_err(error)
    }
}

/// Parses a secret file's text: one secret of 64 hex digits per line; blank lines and lines
/// starting with `#` are skipped. At least one, at most 8 secrets.
pub fn parse_secrets(text: &str) -> Result<Secrets, String> {
    let mut secrets = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let secret = Secret::from_hex(line).ok_or_else(|| {
            format!(
                "line {}: a secret is {} hex digits (e.g. `openssl rand -hex 32`)",
                number + 1,
                2 * SECRET_LEN
            )
        })?;
        if secrets.len() == MAX_SECRETS {
            return Err(format!("more than {MAX_SECRETS} secrets"));
        }
        secrets.push(secret);
    }
    let mut secrets = secrets.into_iter();
    let first = secrets.next().ok_or("no secret in the file")?;
    Ok(Secrets::new(first, secrets))
}

/// Writes a new file with one fresh secret, mode 0600. Fails if `path` exists, so a secret is
/// never overwritten.
pub fn generate_secret_file(path: &Path) -> Result<(), AuthError> {
    let error = |detail: String| AuthError::SecretFile {
        path: path.display().to_string(),
        detail,
    };
    let secret = Secret::generate().map_err(|e| error(e.to_string()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| error(e.to_string()))?;
    writeln!(file, "{}", secret.to_hex())
        .and_then(|()| file.sync_all())
        .map_err(|e| error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn generated_file_is_private_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.secret");
        generate_secret_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let secrets = Secrets::load(&path).unwrap();
        assert_eq!(secrets.accepted().len(), 1);
        assert!(generate_secret_file(&path).is_err(), "never overwrites");
    }

    #[test]
    fn two_generated_secrets_differ() {
        assert_ne!(Secret::generate().unwrap(), Secret::generate().unwrap());
    }

    #[test]
    fn first_line_signs_all_are_accepted() {
        let (a, b) = ("ab".repeat(32), "CD".repeat(32));
        let secrets = parse_secrets(&format!("# rotation\n{a}\n\n  {b}  \n")).unwrap();
        assert_eq!(secrets.signing().to_hex(), a);
        assert_eq!(secrets.accepted()[1].to_hex(), "cd".repeat(32));
    }

    #[test]
    fn malformed_files_are_refused() {
        for text in [
            "",
            "# only a comment\n",
            "abc\n",
            &"zz".repeat(32),
            &"a".repeat(66),
        ] {
            assert!(parse_secrets(text).is_err(), "{text:?}");
        }
        assert!(parse_secrets(&format!("{}\n", "ab".repeat(32)).repeat(9)).is_err());
    }

    proptest! {
        #[test]
        fn parsing_any_text_never_panics(text in "\\PC{0,300}") {
            let _ = parse_secrets(&text);
        }

        #[test]
        fn hex_round_trips(bytes in proptest::array::uniform32(any::<u8>())) {
            let secret = Secret::from_bytes(bytes);
            let parsed = parse_secrets(&secret.to_hex()).unwrap();
            prop_assert_eq!(parsed.signing(), &secret);
        }
    }
}
