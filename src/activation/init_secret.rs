//! The init secret's hash, as provisioned on the node: Django's documented PBKDF2 format,
//! `pbkdf2_sha256$<iterations>$<salt>$<base64 of the 32-byte derived key>`. Salted and slow on
//! purpose (the file may be readable more widely than the secret should be guessable), it is
//! made with any PBKDF2 implementation, e.g.
//! `python3 -c 'import hashlib,base64,secrets,sys; s=secrets.token_hex(8); print("pbkdf2_sha256$600000$%s$%s" % (s, base64.b64encode(hashlib.pbkdf2_hmac("sha256", sys.stdin.buffer.read().rstrip(b"\n"), s.encode(), 600000)).decode()))'`.
//! Checked with ring's PBKDF2, whose comparison takes constant time.

use std::num::NonZeroU32;

use base64::Engine as _;

use crate::error::{Error, Result};

/// Fewer rounds than this is no protection; more than this turns every init request into a
/// denial of service on a small node.
const MIN_ROUNDS: u32 = 1000;
const MAX_ROUNDS: u32 = 10_000_000;

pub(crate) struct SecretHash {
    rounds: NonZeroU32,
    salt: Vec<u8>,
    key: Vec<u8>,
}

impl SecretHash {
    /// `name` says where the text came from, for the error.
    pub(crate) fn parse(text: &str, name: &str) -> Result<SecretHash> {
        let bad = |why: &str| {
            Error::config(format!(
                "{name}: {why} (expected pbkdf2_sha256$ROUNDS$SALT$BASE64)"
            ))
        };
        let parts: Vec<&str> = text.trim().split('$').collect();
        let [algo, rounds, salt, key] = parts[..] else {
            return Err(bad("not four $-separated fields"));
        };
        if algo != "pbkdf2_sha256" {
            return Err(bad(&format!("unknown algorithm {algo:?}")));
        }
        let rounds = rounds
            .parse::<u32>()
            .ok()
            .filter(|r| (MIN_ROUNDS..=MAX_ROUNDS).contains(r))
            .and_then(NonZeroU32::new)
            .ok_or_else(|| {
                bad(&format!(
                    "rounds must be a number from {MIN_ROUNDS} to {MAX_ROUNDS}"
                ))
            })?;
        if salt.is_empty() {
            return Err(bad("empty salt"));
        }
        let key = base64::engine::general_purpose::STANDARD
            .decode(key)
            .ok()
            .filter(|k| k.len() == 32)
            .ok_or_else(|| bad("the key is not 32 bytes of base64"))?;
        Ok(SecretHash {
            rounds,
            salt: salt.as_bytes().to_vec(),
            key,
        })
    }

    pub(crate) fn matches(&self, secret: &[u8]) -> bool {
        ring::pbkdf2::verify(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            self.rounds,
            &self.salt,
            secret,
            &self.key,
        )
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From Python's hashlib.pbkdf2_hmac("sha256", secret, salt, 1000): an independent maker.
    const HASH: &str =
        "pbkdf2_sha256$1000$nodestrapsalt01$k8x0XsKnEkaYhxzBTnnnU6ux7VEXU7I1ZBv7TauOe/s=\n";

    #[test]
    fn verifies_what_another_implementation_made() {
        let h = SecretHash::parse(HASH, "f").unwrap();
        assert!(h.matches(b"correct horse battery staple"));
        assert!(!h.matches(b"correct horse battery stapl"));
        assert!(!h.matches(b""));
    }

    #[test]
    fn refuses_malformed_hashes_naming_the_file() {
        for bad in [
            "",
            "sha256:abcd",
            "pbkdf2_sha1$1000$s$k8x0XsKnEkaYhxzBTnnnU6ux7VEXU7I1ZBv7TauOe/s=",
            "pbkdf2_sha256$999$s$k8x0XsKnEkaYhxzBTnnnU6ux7VEXU7I1ZBv7TauOe/s=",
            "pbkdf2_sha256$99999999$s$k8x0XsKnEkaYhxzBTnnnU6ux7VEXU7I1ZBv7TauOe/s=",
            "pbkdf2_sha256$1000$$k8x0XsKnEkaYhxzBTnnnU6ux7VEXU7I1ZBv7TauOe/s=",
            "pbkdf2_sha256$1000$s$AAAA",
        ] {
            let e = SecretHash::parse(bad, "/etc/nodestrap/init-secret.hash")
                .err()
                .unwrap();
            assert_eq!(e.exit_code(), 2);
            assert!(
                e.to_string()
                    .starts_with("/etc/nodestrap/init-secret.hash: "),
                "{e}"
            );
        }
    }
}
