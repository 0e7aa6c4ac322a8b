//! `KEY=VALUE` files: os-release and kubelet.env.
//!
//! Stricter than tectonic-torcx's split-on-`=` (which silently took `#K=V` as a key named `#K`):
//! blank lines and `#` comments are skipped, anything else must be `KEY=VALUE` with a shell-style
//! key, and quotes must balance. Order is kept so a rewritten file is stable.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvFile {
    pub vars: Vec<(String, String)>,
}

impl EnvFile {
    /// Parse `text`; `name` is how errors name the input.
    pub fn parse(text: &str, name: &str) -> Result<EnvFile> {
        let mut vars = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why: &str| Error::failed(format!("{name}:{}: {why}: {raw:?}", i + 1));
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| err("expected KEY=VALUE"))?;
            if !valid_key(k) {
                return Err(err("invalid variable name"));
            }
            let v = unquote(v).ok_or_else(|| err("unbalanced quotes"))?;
            vars.push((k.to_string(), v));
        }
        Ok(EnvFile { vars })
    }

    /// First value of `key`, as os-release readers do.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Replace every `key` entry in place, or append it.
    pub fn set(&mut self, key: &str, value: &str) {
        let mut found = false;
        self.vars.retain_mut(|(k, v)| {
            if k != key {
                return true;
            }
            if found {
                return false;
            }
            found = true;
            *v = value.to_string();
            true
        });
        if !found {
            self.vars.push((key.to_string(), value.to_string()));
        }
    }

    /// One `KEY=value` a line; values that systemd or a shell would split are double-quoted.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.vars {
            out.push_str(k);
            out.push('=');
            if !v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./:+@%,=-".contains(&b))
            {
                out.push_str(v);
            } else {
                out.push('"');
                for c in v.chars() {
                    if matches!(c, '"' | '\\' | '$' | '`') {
                        out.push('\\');
                    }
                    out.push(c);
                }
                out.push('"');
            }
            out.push('\n');
        }
        out
    }
}

fn valid_key(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn unquote(v: &str) -> Option<String> {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?),
                '"' => return None,
                c => out.push(c),
            }
        }
        Some(out)
    } else if let Some(inner) = v.strip_prefix('\'') {
        let inner = inner.strip_suffix('\'')?;
        (!inner.contains('\'')).then(|| inner.to_string())
    } else if v.contains(['"', '\'']) {
        None
    } else {
        Some(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_sample() {
        let t = "NAME=\"Container Linux by CoreOS\"\nID=coreos\nVERSION_ID=1662.0.0\n# c\n\nCOREOS_BOARD=\"amd64-usr\"\nVERSION_ID=9\n";
        let e = EnvFile::parse(t, "os-release").unwrap();
        assert_eq!(e.get("VERSION_ID"), Some("1662.0.0"));
        assert_eq!(e.get("COREOS_BOARD"), Some("amd64-usr"));
        assert_eq!(e.get("NAME"), Some("Container Linux by CoreOS"));
    }

    #[test]
    fn malformed_lines_name_the_file_and_line() {
        let e = EnvFile::parse("A=1\nthis is junk\n", "/x/kubelet.env").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/x/kubelet.env:2: expected KEY=VALUE"),
            "{e}"
        );
        assert!(EnvFile::parse("A=\"open\n", "f").is_err());
        assert!(EnvFile::parse("#K=V\n1A=2\n", "f").is_err());
    }

    #[test]
    fn set_keeps_order_and_render_round_trips() {
        let mut e = EnvFile::parse(
            "KUBELET_IMAGE_URL=\"quay.io/coreos/hyperkube\"\nKUBELET_IMAGE_TAG=\"v1.9.6_coreos.0\"\nX=\"a b\"\n",
            "f",
        )
        .unwrap();
        e.set("KUBELET_IMAGE_TAG", "v1.10.2_coreos.0");
        let r = e.render();
        assert_eq!(
            r,
            "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\nX=\"a b\"\n"
        );
        assert_eq!(EnvFile::parse(&r, "f").unwrap(), e);
    }
}
