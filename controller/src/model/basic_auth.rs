//! HTTP basic authentication (`auth-type: basic`), as ingress-nginx does it:
//! nginx's `auth_basic` with a user file made from a Secret of the
//! Ingress's namespace. `auth-secret-type: auth-file` (the default) reads
//! an htpasswd file from the Secret's `auth` key; `auth-map` reads one user
//! per key, the value being the password hash.
//!
//! nginx reads the user file on every request, so the file is the only
//! copy of the hashes on disk (mode 0600, in the controller's directory);
//! its name carries a hash of its contents, so a changed Secret is a new
//! file and one reload, and a request never sees a half-written file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::values::Invalid;

/// Largest user file: far above any real user list.
pub const MAX_FILE: usize = 1 << 20;
/// Most users in one file.
pub const MAX_USERS: usize = 10_000;

/// Where `auth-secret-type` says the users are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SecretType {
    /// An htpasswd file in the `auth` key.
    #[default]
    AuthFile,
    /// One key per user, the value its password hash.
    AuthMap,
}

impl SecretType {
    pub fn parse(v: &str) -> Result<Self, Invalid> {
        match v.trim() {
            "auth-file" => Ok(SecretType::AuthFile),
            "auth-map" => Ok(SecretType::AuthMap),
            _ => Err(Invalid(format!(
                "auth-secret-type must be auth-file or auth-map: {v:?}"
            ))),
        }
    }
}

/// What a location renders: the realm and the user file's name (under
/// `<conf-dir>/auth/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct BasicAuth {
    pub realm: String,
    pub file: String,
}

/// `auth-realm`: shown by browsers; printable, no quotes or `$` (it is
/// rendered as one quoted token), at most 256 bytes.
pub fn realm(v: &str) -> Result<String, Invalid> {
    let ok = !v.is_empty() && v.len() <= 256 && v.bytes().all(|b| (b' '..=b'~').contains(&b) && !b"\"$\\".contains(&b));
    if !ok {
        return Err(Invalid(format!(
            "auth-realm must be printable text without quotes, backslashes or $: {v:?}"
        )));
    }
    Ok(v.to_string())
}

/// One `user:hash` line, checked: a user name without `:` or spaces and a
/// hash of printable characters (nginx supports crypt(3) hashes, `$apr1$`,
/// `{SHA}`, `{SSHA}` and `{PLAIN}`).
fn text(b: &[u8]) -> Result<&str, Invalid> {
    std::str::from_utf8(b).map_err(|_| Invalid("the Secret's data is not UTF-8 text".into()))
}

fn line(user: &str, hash: &str) -> Result<String, Invalid> {
    let user_ok = !user.is_empty() && user.len() <= 255 && user.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    let hash_ok = !hash.is_empty() && hash.len() <= 1024 && hash.bytes().all(|b| b.is_ascii_graphic());
    if !user_ok {
        return Err(Invalid(format!("not a user name: {user:?}")));
    }
    if !hash_ok {
        return Err(Invalid(format!("user {user:?}: not a password hash")));
    }
    Ok(format!("{user}:{hash}\n"))
}

/// The user file made from `secret`, checked line by line.
pub fn user_file(secret: &Secret, kind: SecretType) -> Result<String, Invalid> {
    let data: BTreeMap<&str, &[u8]> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.0.as_slice()))
        .collect();
    let mut out = String::new();
    match kind {
        SecretType::AuthFile => {
            let Some(file) = data.get("auth") else {
                return Err(Invalid("the Secret has no \"auth\" key (an htpasswd file)".into()));
            };
            for l in text(file)?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let (user, hash) = l
                    .split_once(':')
                    .ok_or_else(|| Invalid("an htpasswd line is not user:hash".into()))?;
                out.push_str(&line(user, hash)?);
            }
        }
        SecretType::AuthMap => {
            for (user, hash) in &data {
                out.push_str(&line(user, text(hash)?.trim())?);
            }
        }
    }
    if out.is_empty() {
        return Err(Invalid("the Secret names no user".into()));
    }
    if out.len() > MAX_FILE || out.lines().count() > MAX_USERS {
        return Err(Invalid(format!(
            "the user file is larger than {MAX_FILE} bytes or {MAX_USERS} users"
        )));
    }
    Ok(out)
}

/// `<namespace>-<ingress>-<hash>.htpasswd`: unique per Ingress and per
/// content.
pub fn file_name(namespace: &str, ingress: &str, content: &str) -> String {
    let digest = Sha256::digest(content.as_bytes());
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{namespace}-{ingress}-{hash}.htpasswd")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn htpasswd_files_and_maps_become_checked_user_files() {
        let s = secret(&[(
            "auth",
            "# admins\nfoo:$apr1$xyz$abc\n\nbar:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n",
        )]);
        assert_eq!(
            user_file(&s, SecretType::AuthFile).unwrap(),
            "foo:$apr1$xyz$abc\nbar:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n"
        );
        let s = secret(&[("alice", "$apr1$a$b"), ("bob", "{PLAIN}x")]);
        assert_eq!(
            user_file(&s, SecretType::AuthMap).unwrap(),
            "alice:$apr1$a$b\nbob:{PLAIN}x\n"
        );
    }

    #[test]
    fn malformed_secrets_are_refused() {
        assert!(user_file(&secret(&[]), SecretType::AuthFile).is_err());
        assert!(user_file(&secret(&[("auth", "no-colon")]), SecretType::AuthFile).is_err());
        assert!(user_file(&secret(&[("auth", "a b:hash")]), SecretType::AuthFile).is_err());
        assert!(user_file(&secret(&[("auth", "a:has h")]), SecretType::AuthFile).is_err());
        assert!(user_file(&secret(&[("auth", "# only a comment")]), SecretType::AuthFile).is_err());
        assert!(user_file(&secret(&[("u", "")]), SecretType::AuthMap).is_err());
    }

    #[test]
    fn realms_are_plain_text() {
        assert!(realm("Authentication Required - admin").is_ok());
        for bad in ["", "a\"b", "$host", "a\nb", "back\\slash"] {
            assert!(realm(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_changed_secret_is_a_new_file() {
        assert_ne!(file_name("a", "b", "x:1\n"), file_name("a", "b", "x:2\n"));
        assert!(file_name("a", "b", "x:1\n").starts_with("a-b-"));
    }
}
