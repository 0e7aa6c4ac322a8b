//! `KEY=VALUE` files: os-release and kubelet.env.
//!
//! Stricter than tectonic-torcx's split-on-`=` (which silently took `#K=V` as a key named `#K`):
//! blank lines and `#` comments are skipped, anything else must be `KEY=VALUE` with a shell-style
//! key, and quotes must balance. Values are read as os-release(5) says (shell rules without
//! expansion): in double quotes only `\\`, `\$`, `\"` and `` \` `` are escapes, other backslashes
//! stay; in single quotes nothing is an escape; outside quotes a backslash takes the next
//! character literally; quoted and unquoted parts may follow each other. Order is kept so a
//! rewritten file is stable.

use crate::error::{excerpt, Error, Result};

/// The budget of one file: node files are small, and a bigger one is not what we think it is.
pub(crate) const MAX_BYTES: usize = 64 << 10;
pub(crate) const MAX_VARS: usize = 1024;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvFile {
    pub vars: Vec<(String, String)>,
}

impl EnvFile {
    /// Parse `text`; `name` is how errors name the input.
    pub fn parse(text: &str, name: &str) -> Result<EnvFile> {
        if text.len() > MAX_BYTES {
            return Err(Error::failed(format!(
                "{name}: {} bytes is over the {MAX_BYTES}-byte limit of an env file",
                text.len()
            )));
        }
        let mut vars = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why: &str| {
                Error::failed(format!("{name}:{}: {why}: \"{}\"", i + 1, excerpt(raw, 80)))
            };
            if vars.len() == MAX_VARS {
                return Err(err(&format!("more than {MAX_VARS} variables")));
            }
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

/// The value after `=`, as a shell (without expansion) or systemd reads it; `None` when a quote
/// is left open or a backslash ends the line.
fn unquote(v: &str) -> Option<String> {
    enum In {
        Plain,
        Double,
        Single,
    }
    let mut out = String::new();
    let mut state = In::Plain;
    let mut chars = v.trim().chars();
    while let Some(c) = chars.next() {
        match (&state, c) {
            (In::Plain, '\\') => out.push(chars.next()?),
            (In::Plain, '"') => state = In::Double,
            (In::Plain, '\'') => state = In::Single,
            (In::Double, '\\') => match chars.next()? {
                e @ ('\\' | '$' | '"' | '`') => out.push(e),
                e => {
                    out.push('\\');
                    out.push(e);
                }
            },
            (In::Double, '"') | (In::Single, '\'') => state = In::Plain,
            (_, c) => out.push(c),
        }
    }
    matches!(state, In::Plain).then_some(out)
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

    /// Values as a POSIX shell reads them (`. file`), the rules os-release(5) gives.
    #[test]
    fn values_read_as_the_shell_reads_them() {
        let lines = [
            r#"A="a \\ b \$ c \" d \` e""#,
            r#"A="keep \n and \x and \'""#,
            r#"A='single \" \\ \n $x'"#,
            r#"A=plain\ value\"q"#,
            r#"A=con"cat "'en'ated"#,
            r#"A="""#,
            r#"A="#,
            r#"A=Fedora\ Linux"#,
        ];
        let dir = std::env::temp_dir().join(format!("nodestrap-envfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for line in lines {
            let f = dir.join("os-release");
            std::fs::write(&f, format!("{line}\n")).unwrap();
            let sh = std::process::Command::new("sh")
                .arg("-c")
                .arg(r#". "$1" && printf %s "$A""#)
                .arg("sh")
                .arg(&f)
                .output()
                .unwrap();
            assert!(sh.status.success(), "{line}");
            let want = String::from_utf8(sh.stdout).unwrap();
            let got = EnvFile::parse(line, "f").unwrap();
            assert_eq!(got.get("A"), Some(want.as_str()), "{line}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        for bad in [r#"A="open"#, "A='open", r#"A=trailing\"#, r#"A="x\"#] {
            assert!(EnvFile::parse(bad, "f").is_err(), "{bad}");
        }
    }

    #[test]
    fn budgets_and_bounded_excerpts() {
        let big = "A=1\n".repeat(MAX_BYTES / 4 + 1);
        let e = EnvFile::parse(&big, "/r/usr/lib/os-release").unwrap_err();
        assert!(e.to_string().contains("over the 65536-byte limit"), "{e}");
        let many: String = (0..=MAX_VARS).map(|i| format!("K{i}=v\n")).collect();
        let e = EnvFile::parse(&many, "f").unwrap_err();
        assert!(e.to_string().contains("more than 1024 variables"), "{e}");
        let junk = format!("{}\n", "x".repeat(5000));
        let e = EnvFile::parse(&junk, "f").unwrap_err().to_string();
        assert!(e.len() < 200 && e.contains("(4920 more characters)"), "{e}");
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
