//! Where torcx looks, read with torcx's own rules (coreos/torcx `internal/cli/common.go`,
//! `internal/torcx/config.go`, `store.go`), so that what nodestrap stages is what torcx finds
//! at boot (docs/bootstrap.md, "Where torcx looks").
//!
//! torcx reads one configuration file, the one `torcx_config=` names on the kernel command line
//! (its first such argument), else `/etc/torcx/config.json`; a missing file is no configuration.
//! Its `base_dir` moves the user stores (`<base_dir>/store/<VERSION_ID>`, `<base_dir>/store`),
//! `conf_dir` the profiles and next-profile, `run_dir` the applied profile, and `store_paths`
//! adds stores searched before the user stores. A file that does not decode (Go's
//! `encoding/json`: the first JSON value, keys matched without regard to case), of another
//! kind, or with a relative path, stops torcx from applying any profile: nodestrap refuses it
//! then, naming the file and what torcx would say.

use serde::de::{MapAccess, Visitor};

use crate::error::{Error, Result};
use crate::node::root::{Root, CONFIG_CAP};

pub(crate) const DEFAULT_CONFIG: &str = "/etc/torcx/config.json";
const CONFIG_KIND: &str = "torcx-config-v0";
/// The running OS's own store, searched first.
pub const VENDOR_STORE: &str = "/usr/share/torcx/store";
const OEM_STORE: &str = "/usr/share/oem/torcx/store";

/// torcx's paths on this node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub(crate) base_dir: String,
    pub(crate) conf_dir: String,
    pub(crate) run_dir: String,
    /// `store_paths` of the configuration, searched after the OEM stores.
    pub(crate) store_paths: Vec<String>,
    /// Where this came from, for log lines: the file, or "torcx's defaults".
    pub(crate) source: String,
}

impl Default for Layout {
    fn default() -> Layout {
        Layout {
            base_dir: "/var/lib/torcx".into(),
            conf_dir: "/etc/torcx".into(),
            run_dir: "/run/torcx".into(),
            store_paths: Vec::new(),
            source: "torcx's defaults".into(),
        }
    }
}

impl Layout {
    /// The node's layout: the kernel command line's `torcx_config=` or the default file.
    pub(crate) fn read(root: &Root) -> Result<Layout> {
        let cmdline = crate::node::cmdline::read()?;
        let (path, why) = match crate::node::cmdline::first_value(&cmdline, "torcx_config") {
            Some(p) => (p.to_string(), "torcx_config= on the kernel command line"),
            None => (DEFAULT_CONFIG.to_string(), "torcx's default"),
        };
        // An empty torcx_config= is no file at all for torcx.
        if path.is_empty() {
            return Ok(Layout::default());
        }
        let node_path = if path.starts_with('/') {
            path.clone()
        } else {
            format!("/{path}")
        };
        let shown = root.show(&node_path);
        let Some(data) = root.read(&node_path, CONFIG_CAP)? else {
            return Ok(Layout::default());
        };
        let mut l = Layout::parse(&data, &format!("{shown} ({why})"))?;
        l.source = format!("{shown} ({why})");
        Ok(l)
    }

    /// A configuration file's content, as torcx decodes and checks it.
    pub(crate) fn parse(data: &[u8], name: &str) -> Result<Layout> {
        let refuse = |why: String| {
            Error::failed(format!(
                "{name}: torcx would not start with this configuration ({why}), so it would \
                 apply no profile at boot; fix or remove it"
            ))
        };
        let top = first_value(data).map_err(refuse)?;
        let top = members(&top, "the configuration").map_err(refuse)?;
        let kind = field(top, "kind")
            .map(|v| string(v, "kind"))
            .transpose()
            .map_err(refuse)?
            .unwrap_or_default();
        if kind != CONFIG_KIND {
            return Err(refuse(format!(
                "unknown config file kind {kind:?}, expected {CONFIG_KIND:?}"
            )));
        }
        let mut l = Layout::default();
        let value = match field(top, "value") {
            Some(v) => members(v, "value").map_err(refuse)?,
            None => &[],
        };
        for (key, dest) in [
            ("base_dir", &mut l.base_dir),
            ("conf_dir", &mut l.conf_dir),
            ("run_dir", &mut l.run_dir),
        ] {
            // Empty keeps the default, as torcx's "populate with non-empty settings".
            if let Some(v) = field(value, key) {
                let s = string(v, key).map_err(refuse)?;
                if !s.is_empty() {
                    *dest = s;
                }
            }
        }
        match field(value, "store_paths") {
            None | Some(J::Other(serde_json::Value::Null)) => {}
            Some(J::Other(serde_json::Value::Array(a))) => {
                for v in a {
                    let v = J::Other(v.clone());
                    l.store_paths
                        .push(string(&v, "store_paths").map_err(refuse)?);
                }
            }
            Some(_) => return Err(refuse("store_paths is not an array of strings".into())),
        }
        for (key, p) in [
            ("base_dir", &l.base_dir),
            ("conf_dir", &l.conf_dir),
            ("run_dir", &l.run_dir),
        ] {
            if !p.starts_with('/') {
                return Err(refuse(format!("non-absolute {key} {p:?}")));
            }
        }
        if let Some(p) = l.store_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(refuse(format!("non absolute store path {p:?}")));
        }
        for p in [&mut l.base_dir, &mut l.conf_dir, &mut l.run_dir] {
            *p = clean(p);
        }
        Ok(l)
    }

    /// `<base_dir>/store/<os>`: where nodestrap stages for OS `os`.
    pub(crate) fn user_store(&self, os: &str) -> String {
        clean(&format!("{}/store/{os}", self.base_dir))
    }

    /// `<base_dir>/store`: the user stores' parent, whose versioned stores the hook collects.
    pub(crate) fn store_root(&self) -> String {
        clean(&format!("{}/store", self.base_dir))
    }

    pub(crate) fn profiles_dir(&self) -> String {
        clean(&format!("{}/profiles", self.conf_dir))
    }

    pub(crate) fn next_profile(&self) -> String {
        clean(&format!("{}/next-profile", self.conf_dir))
    }

    /// The profile torcx applied in this boot.
    pub(crate) fn applied_profile(&self) -> String {
        clean(&format!("{}/profile.json", self.run_dir))
    }

    /// The stores torcx searches when it boots OS `os`, in its order. The vendor store belongs
    /// to the OS that is running (`vendor`): for another OS version it is that OS's own, which
    /// this one cannot see.
    pub(crate) fn stores(&self, os: &str, vendor: bool) -> Vec<String> {
        let mut s = Vec::new();
        if vendor {
            s.push(VENDOR_STORE.to_string());
        }
        s.push(clean(&format!("{OEM_STORE}/{os}")));
        s.push(OEM_STORE.to_string());
        s.extend(self.store_paths.iter().map(|p| clean(p)));
        s.push(self.user_store(os));
        s.push(self.store_root());
        s
    }

    /// The archive torcx takes for `name:reference` from `stores`: the first squashfs that
    /// defines it, else the first tgz (symlinks to regular files count; names split on their
    /// last `:`, the rest joined, as torcx does). `ours`, a tgz nodestrap is about to stage,
    /// counts as there already.
    pub(crate) fn archive_for(
        root: &Root,
        stores: &[String],
        name: &str,
        reference: &str,
        ours: Option<&str>,
    ) -> Result<Option<String>> {
        let mut tgz = None;
        for store in stores {
            if let Some(o) = ours.filter(|o| o.rsplit_once('/').map(|(d, _)| d) == Some(store)) {
                tgz.get_or_insert(o.to_string());
            }
            // A store that is not there is skipped, as torcx skips it; one that cannot be
            // read is an error: torcx might read what nodestrap could not check.
            let Some(dir) = root.dir(store)? else {
                continue;
            };
            let entries = dir.entries()?;
            for e in entries {
                let Some((n, r, squashfs)) = archive_name(&e) else {
                    continue;
                };
                if n != name || r != reference {
                    continue;
                }
                let path = format!("{}/{e}", store.trim_end_matches('/'));
                // Only a regular file, or a symlink that leads to one, is an archive.
                if root.open_file(&path).ok().flatten().is_none() {
                    continue;
                }
                if squashfs {
                    return Ok(Some(path));
                }
                tgz.get_or_insert(path);
            }
        }
        Ok(tgz)
    }
}

/// `(name, reference, squashfs)` of a store entry, as torcx's store walk reads it.
pub(crate) fn archive_name(file: &str) -> Option<(String, String, bool)> {
    let (base, squashfs) = match file.strip_suffix(".torcx.tgz") {
        Some(b) => (b, false),
        None => (file.strip_suffix(".torcx.squashfs")?, true),
    };
    Some(match base.rsplit_once(':') {
        Some((n, r)) => (n.replace(':', ""), r.to_string(), squashfs),
        None => (base.to_string(), "com.coreos.cl".to_string(), squashfs),
    })
}

/// Go's `filepath.Clean` of an absolute path: no empty, `.` or `..` components.
fn clean(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    format!("/{}", out.join("/"))
}

/// A JSON value whose objects keep their members in document order, duplicates included: Go
/// decodes an object's keys in order, so the last key that names a field wins.
#[derive(Debug)]
enum J {
    Object(Vec<(String, J)>),
    Other(serde_json::Value),
}

impl<'de> serde::Deserialize<'de> for J {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, J>()? {
                    v.push((k, val));
                }
                Ok(J::Object(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> std::result::Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = s.next_element::<serde_json::Value>()? {
                    v.push(x);
                }
                Ok(J::Other(serde_json::Value::Array(v)))
            }
            fn visit_bool<E>(self, b: bool) -> std::result::Result<J, E> {
                Ok(J::Other(b.into()))
            }
            fn visit_i64<E>(self, n: i64) -> std::result::Result<J, E> {
                Ok(J::Other(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> std::result::Result<J, E> {
                Ok(J::Other(n.into()))
            }
            fn visit_f64<E>(self, n: f64) -> std::result::Result<J, E> {
                Ok(J::Other(n.into()))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<J, E> {
                Ok(J::Other(s.into()))
            }
            fn visit_unit<E>(self) -> std::result::Result<J, E> {
                Ok(J::Other(serde_json::Value::Null))
            }
        }
        d.deserialize_any(V)
    }
}

/// The first JSON value of `data` (what follows it is not read, as Go's `json.Decoder`).
fn first_value(data: &[u8]) -> std::result::Result<J, String> {
    let mut de = serde_json::Deserializer::from_slice(data);
    match serde::Deserialize::deserialize(&mut de) {
        Ok(j) => Ok(j),
        Err(e) if e.is_eof() => Err("EOF".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The members of an object; `null` is an object with none (every field keeps its zero value).
fn members<'a>(j: &'a J, what: &str) -> std::result::Result<&'a [(String, J)], String> {
    match j {
        J::Object(m) => Ok(m),
        J::Other(serde_json::Value::Null) => Ok(&[]),
        J::Other(_) => Err(format!("json: cannot unmarshal {what}: not an object")),
    }
}

/// The value Go's decoder leaves in field `key`: that of the last member whose name is `key`
/// or folds to it (Unicode simple folding: `ſ` is an `s`, `K` a `k`).
fn field<'a>(members: &'a [(String, J)], key: &str) -> Option<&'a J> {
    members
        .iter()
        .rfind(|(k, _)| k == key || folds_to(k, key))
        .map(|(_, v)| v)
}

fn folds_to(k: &str, field: &str) -> bool {
    k.chars().count() == field.len()
        && k.chars().zip(field.chars()).all(|(c, f)| {
            c.to_ascii_lowercase() == f || (c == 'ſ' && f == 's') || (c == '\u{212A}' && f == 'k')
        })
}

fn string(v: &J, key: &str) -> std::result::Result<String, String> {
    let v = match v {
        J::Object(_) => {
            return Err(format!(
                "json: cannot unmarshal object into {key} of type string"
            ))
        }
        J::Other(v) => v,
    };
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Null => Ok(String::new()),
        other => Err(format!(
            "json: cannot unmarshal {} into {key} of type string",
            match other {
                serde_json::Value::Bool(_) => "bool",
                serde_json::Value::Number(_) => "number",
                serde_json::Value::Array(_) => "array",
                _ => "object",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let l = Layout::parse(
            br#"{"kind":"torcx-config-v0","value":{"base_dir":"/srv/torcx/","conf_dir":"","store_paths":["/opt/s"]}} trailing"#,
            "c",
        )
        .unwrap();
        assert_eq!(l.user_store("1.2.3"), "/srv/torcx/store/1.2.3");
        assert_eq!(l.next_profile(), "/etc/torcx/next-profile");
        assert_eq!(l.applied_profile(), "/run/torcx/profile.json");
        assert_eq!(
            l.stores("1.2.3", true),
            vec![
                "/usr/share/torcx/store",
                "/usr/share/oem/torcx/store/1.2.3",
                "/usr/share/oem/torcx/store",
                "/opt/s",
                "/srv/torcx/store/1.2.3",
                "/srv/torcx/store"
            ]
        );
        // Keys as Go matches them: in any case (ſ folds to s), the last one wins.
        let l = Layout::parse(
            r#"{"KIND":"torcx-config-v0","value":{"base_dir":"/a","BASE_DIR":"/b","baſe_dir":"/c","Conf_Dir":"/d","base_dir2":"/e"}}"#.as_bytes(),
            "c",
        )
        .unwrap();
        assert_eq!((l.base_dir.as_str(), l.conf_dir.as_str()), ("/c", "/d"));
        let l = Layout::parse(br#"{"kind":"torcx-config-v0","value":null}"#, "c").unwrap();
        assert_eq!(l.base_dir, "/var/lib/torcx");
    }

    #[test]
    fn what_torcx_refuses_is_refused() {
        for (bad, why) in [
            (&br#""#[..], "EOF"),
            (br#"{"kind":"torcx-config-v1"}"#, "unknown config file kind"),
            (br#"[]"#, "not an object"),
            (
                br#"{"kind":"torcx-config-v0","value":"x"}"#,
                "not an object",
            ),
            (
                br#"{"kind":"torcx-config-v0","value":{"base_dir":"rel"}}"#,
                "non-absolute base_dir",
            ),
            (
                br#"{"kind":"torcx-config-v0","value":{"store_paths":["a"]}}"#,
                "non absolute store path",
            ),
            (
                br#"{"kind":"torcx-config-v0","value":{"run_dir":1}}"#,
                "cannot unmarshal number",
            ),
            (
                br#"{"kind":"torcx-config-v0","value":{"store_paths":"/a"}}"#,
                "not an array",
            ),
        ] {
            let e = Layout::parse(bad, "/etc/torcx/config.json")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(why) && e.contains("/etc/torcx/config.json"),
                "{e}"
            );
        }
    }

    #[test]
    fn archive_names_as_torcx_splits_them() {
        assert_eq!(
            archive_name("docker:17.03.torcx.tgz"),
            Some(("docker".into(), "17.03".into(), false))
        );
        assert_eq!(
            archive_name("do:ck:er:17.03.torcx.squashfs"),
            Some(("docker".into(), "17.03".into(), true))
        );
        assert_eq!(
            archive_name("docker.torcx.tgz"),
            Some(("docker".into(), "com.coreos.cl".into(), false))
        );
        assert_eq!(archive_name("docker:17.03.tgz"), None);
        assert_eq!(clean("/a/./b/../c//"), "/a/c");
        assert_eq!(clean("/../x"), "/x");
    }
}
