//! RHCOS: the Ignition config a machine-config-server serves, completed the way IBM's in-place
//! bootstrapper does it (docs/reprovision.md, RHCOS) and wrapped as the MachineConfig that
//! `machine-config-daemon firstboot-complete-machineconfig` reads.

use std::io::Read;

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// What the machine-config-daemon's first-boot path consumes (renamed to `.bak` when done).
pub(crate) const ENCAPSULATED: &str = "/etc/ignition-machine-config-encapsulated.json";
pub(crate) const NODE_ANNOTATIONS: &str = "/etc/machine-config-daemon/node-annotations.json";
pub(crate) const KUBECONFIG: &str = "/etc/kubernetes/kubeconfig";
/// The full served MachineConfig, a debugging aid the MCS appends; a second source of the name.
const MCS_CONTENT: &str = "/etc/mcs-machine-config-content.json";
const ANN: &str = "machineconfiguration.openshift.io";
/// Fields of a MachineConfig spec that are not the Ignition config (applied before the kubelet).
const SPEC_FIELDS: &[&str] = &[
    "osImageURL",
    "baseOSExtensionsContainerImage",
    "kernelArguments",
    "extensions",
    "kernelType",
    "fips",
];
/// Units whose command line names the machine-config-operator image (MCO templates).
const MCD_UNITS: &[&str] = &[
    "machine-config-daemon-firstboot.service",
    "machine-config-daemon-pull.service",
];

/// Parse a served config: JSON, spec 3.x (RHCOS 4.6 and later; spec 2 is refused by name).
pub(crate) fn parse(data: &[u8], src: &str) -> Result<Value> {
    let v: Value = serde_json::from_slice(data)
        .map_err(|e| Error::failed(format!("{src}: not an Ignition config: invalid JSON: {e}")))?;
    let version = v
        .get("ignition")
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .ok_or_else(|| Error::failed(format!("{src}: no ignition.version")))?;
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok());
    if !numeric || parts[0] != "3" {
        return Err(Error::failed(format!(
            "{src}: Ignition spec {version:?} is not supported: expected 3.x.y"
        )));
    }
    if let Some(files) = v.pointer("/storage/files") {
        let ok = files.as_array().is_some_and(|a| {
            a.iter()
                .all(|f| f.get("path").and_then(Value::as_str).is_some())
        });
        if !ok {
            return Err(Error::failed(format!(
                "{src}: storage.files must be a list of entries with a path"
            )));
        }
    }
    Ok(v)
}

pub(crate) fn version(cfg: &Value) -> &str {
    cfg.pointer("/ignition/version")
        .and_then(Value::as_str)
        .unwrap_or("?")
}

fn same_path(a: &str, b: &str) -> bool {
    let norm = |p: &str| {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/")
    };
    norm(a) == norm(b)
}

fn files(cfg: &Value) -> impl Iterator<Item = &Value> {
    cfg.pointer("/storage/files")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// The contents of the file entry for `path`, when it is inline (a data URL, maybe gzip'ed).
pub(crate) fn file_contents(cfg: &Value, path: &str, src: &str) -> Result<Option<Vec<u8>>> {
    let Some(f) = files(cfg).find(|f| f["path"].as_str().is_some_and(|p| same_path(p, path)))
    else {
        return Ok(None);
    };
    let what = format!("{src}: storage.files {path}");
    let Some(source) = f.pointer("/contents/source").and_then(Value::as_str) else {
        return Ok(Some(Vec::new()));
    };
    let data = decode_data_url(source)
        .ok_or_else(|| Error::failed(format!("{what}: contents are not an inline data URL")))?;
    match f.pointer("/contents/compression").and_then(Value::as_str) {
        None | Some("") => Ok(Some(data)),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&data[..])
                .take(64 << 20)
                .read_to_end(&mut out)
                .map_err(|e| Error::failed(format!("{what}: bad gzip contents: {e}")))?;
            Ok(Some(out))
        }
        Some(c) => Err(Error::failed(format!("{what}: unknown compression {c:?}"))),
    }
}

/// RFC 2397 `data:[<mediatype>][;base64],<data>`.
pub(crate) fn decode_data_url(s: &str) -> Option<Vec<u8>> {
    let rest = s.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let bytes = percent_decode(data)?;
    if meta.split(';').any(|p| p == "base64") {
        let clean: Vec<u8> = bytes
            .into_iter()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        base64::engine::general_purpose::STANDARD.decode(clean).ok()
    } else {
        Some(bytes)
    }
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// What the served config says about the MachineConfig it was rendered from.
#[derive(Debug)]
pub(crate) struct Rendered {
    /// `rendered-<pool>-<hash>`.
    pub(crate) name: String,
    /// Where the name was found, for the log.
    pub(crate) from: String,
    /// The non-Ignition spec fields (osImageURL, kernelArguments, ...).
    pub(crate) spec: Map<String, Value>,
}

/// The rendered config's name and spec fields: from the encapsulated MachineConfig the MCS
/// appends, else its full copy, else the node annotations it appends.
pub(crate) fn rendered(cfg: &Value, src: &str) -> Result<Rendered> {
    for path in [ENCAPSULATED, MCS_CONTENT] {
        let Some(data) = file_contents(cfg, path, src)? else {
            continue;
        };
        let mc: Value = serde_json::from_slice(&data).map_err(|e| {
            Error::failed(format!("{src}: storage.files {path}: invalid JSON: {e}"))
        })?;
        if let Some(name) = mc.pointer("/metadata/name").and_then(Value::as_str) {
            let spec = mc
                .get("spec")
                .and_then(Value::as_object)
                .map(|s| {
                    s.iter()
                        .filter(|(k, _)| SPEC_FIELDS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            return check_name(name, src, path).map(|name| Rendered {
                name,
                from: format!("metadata.name of {path}"),
                spec,
            });
        }
    }
    if let Some(data) = file_contents(cfg, NODE_ANNOTATIONS, src)? {
        let ann: Value = serde_json::from_slice(&data).map_err(|e| {
            Error::failed(format!(
                "{src}: storage.files {NODE_ANNOTATIONS}: invalid JSON: {e}"
            ))
        })?;
        if let Some(name) = ann
            .get(format!("{ANN}/currentConfig"))
            .and_then(Value::as_str)
        {
            return check_name(name, src, NODE_ANNOTATIONS).map(|name| Rendered {
                name,
                from: format!("currentConfig in {NODE_ANNOTATIONS}"),
                spec: Map::new(),
            });
        }
    }
    Err(Error::failed(format!(
        "{src}: no rendered config name: none of {ENCAPSULATED}, {MCS_CONTENT} (metadata.name) or {NODE_ANNOTATIONS} (currentConfig) is in storage.files"
    )))
}

/// A Kubernetes object name (DNS subdomain), as MachineConfig names are.
fn check_name(name: &str, src: &str, path: &str) -> Result<String> {
    if crate::net::names::dns_subdomain(name) {
        Ok(name.to_string())
    } else {
        Err(Error::failed(format!(
            "{src}: {path}: {name:?} is not a MachineConfig name"
        )))
    }
}

/// The machine-config-operator image the MCD units run (`--entrypoint machine-config-daemon
/// '<image>'`, or the image the pull unit pulls).
pub(crate) fn mco_image(cfg: &Value) -> Option<String> {
    let units = cfg.pointer("/systemd/units").and_then(Value::as_array)?;
    for u in units {
        let name = u.get("name").and_then(Value::as_str).unwrap_or("");
        if !MCD_UNITS.contains(&name) {
            continue;
        }
        let text = u.get("contents").and_then(Value::as_str).unwrap_or("");
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("ExecStart"))
        {
            let words: Vec<String> = line
                .split_whitespace()
                .map(|w| w.trim_matches(|c| c == '\'' || c == '"').to_string())
                .collect();
            if let Some(i) = words.iter().position(|w| w == "--entrypoint") {
                if let Some(img) = words.get(i + 2).filter(|w| image_ref(w)) {
                    return Some(img.clone());
                }
            }
            if let Some(img) = words
                .iter()
                .find(|w| w.contains("@sha256:") && image_ref(w))
            {
                return Some(img.clone());
            }
        }
    }
    None
}

/// A plausible pull spec: registry/path[:tag][@digest], nothing a shell or flag parser could
/// read as more.
pub(crate) fn image_ref(s: &str) -> bool {
    s.contains('/')
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"./:@_-".contains(&b))
}

/// Put `path` into storage.files as an inline file (mode 420, overwrite), replacing every
/// entry for the same path instead of adding a second one.
pub(crate) fn set_file(cfg: &mut Value, path: &str, data: &[u8]) {
    let source = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    );
    let entry =
        json!({"path": path, "contents": {"source": source}, "mode": 420, "overwrite": true});
    files_mut(cfg).retain(|f| !f["path"].as_str().is_some_and(|p| same_path(p, path)));
    files_mut(cfg).push(entry);
}

pub(crate) fn remove_file(cfg: &mut Value, path: &str) {
    files_mut(cfg).retain(|f| !f["path"].as_str().is_some_and(|p| same_path(p, path)));
}

fn files_mut(cfg: &mut Value) -> &mut Vec<Value> {
    let root = cfg.as_object_mut().expect("parse checked an object");
    let storage = root.entry("storage").or_insert_with(|| json!({}));
    if !storage.is_object() {
        *storage = json!({});
    }
    let files = storage
        .as_object_mut()
        .expect("object")
        .entry("files")
        .or_insert_with(|| json!([]));
    if !files.is_array() {
        *files = json!([]);
    }
    files.as_array_mut().expect("array")
}

/// The node annotations the in-cluster MCD adopts when the Node has none yet: the node is
/// taken to be at `name` already, state Done.
pub(crate) fn node_annotations(name: &str) -> Vec<u8> {
    let mut m = Map::new();
    m.insert(format!("{ANN}/currentConfig"), json!(name));
    m.insert(format!("{ANN}/desiredConfig"), json!(name));
    m.insert(format!("{ANN}/state"), json!("Done"));
    serde_json::to_vec(&Value::Object(m)).expect("serialisable")
}

/// The MachineConfig the MCD's first-boot path reads: the full config (not the emptied one
/// the MCS encapsulates; the MCD writes every file because its old config is empty) plus the
/// spec fields it applies before the kubelet.
pub(crate) fn machine_config(r: &Rendered, cfg: &Value) -> Value {
    let mut spec = r.spec.clone();
    spec.insert("config".into(), cfg.clone());
    json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": r.name},
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &[u8]) -> String {
        format!(
            "data:;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
    }

    fn served() -> Value {
        let mc = json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": "rendered-worker-0123abcd"},
            "spec": {"osImageURL": "quay.io/openshift/os@sha256:aa", "kernelArguments": ["a=1"], "config": {"ignition": {"version": "3.2.0"}}}});
        json!({"ignition": {"version": "3.2.0"},
            "storage": {"files": [
                {"path": ENCAPSULATED, "contents": {"source": data(mc.to_string().as_bytes())}, "mode": 420},
                {"path": "/etc//kubernetes/kubeconfig", "contents": {"source": "data:,old"}, "mode": 384},
                {"path": "/etc/motd", "contents": {"source": "data:,hello%20world"}}]},
            "systemd": {"units": [{"name": "machine-config-daemon-firstboot.service", "enabled": true,
                "contents": "[Service]\nExecStart=/usr/bin/podman run --rm --privileged --net=host -v /:/rootfs --entrypoint machine-config-daemon 'quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0123' firstboot-complete-machineconfig\n"}]}})
    }

    #[test]
    fn spec_versions() {
        parse(br#"{"ignition":{"version":"3.4.0"}}"#, "u").unwrap();
        for (bad, want) in [
            (&br#"{"ignition":{"version":"2.2.0"}}"#[..], "not supported"),
            (br#"{"ignition":{"version":"3.x"}}"#, "not supported"),
            (br#"{"ignition":{}}"#, "no ignition.version"),
            (b"<html>", "invalid JSON"),
            (
                br#"{"ignition":{"version":"3.2.0"},"storage":{"files":{}}}"#,
                "storage.files",
            ),
        ] {
            let e = parse(bad, "https://ign/x").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("https://ign/x"), "{e}");
        }
    }

    #[test]
    fn data_urls() {
        assert_eq!(
            decode_data_url("data:,hello%20world").unwrap(),
            b"hello world"
        );
        assert_eq!(
            decode_data_url("data:text/plain;charset=utf-8;base64,aGk=").unwrap(),
            b"hi"
        );
        assert!(decode_data_url("https://x").is_none());
        assert!(decode_data_url("data:,bad%zz").is_none());
    }

    #[test]
    fn finds_name_spec_and_image() {
        let cfg = served();
        let r = rendered(&cfg, "u").unwrap();
        assert_eq!(r.name, "rendered-worker-0123abcd");
        assert_eq!(r.spec["osImageURL"], "quay.io/openshift/os@sha256:aa");
        assert!(!r.spec.contains_key("config"));
        assert_eq!(
            mco_image(&cfg).unwrap(),
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0123"
        );
        // Only the annotations file: the name comes from currentConfig.
        let ann = json!({"ignition": {"version": "3.1.0"}, "storage": {"files": [
            {"path": NODE_ANNOTATIONS, "contents": {"source": data(&node_annotations("rendered-infra-9"))}}]}});
        assert_eq!(rendered(&ann, "u").unwrap().name, "rendered-infra-9");
        let none = json!({"ignition": {"version": "3.1.0"}});
        assert!(rendered(&none, "u")
            .unwrap_err()
            .to_string()
            .contains("no rendered config name"));
        assert!(mco_image(&none).is_none());
    }

    #[test]
    fn gzip_contents() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"zipped").unwrap();
        let cfg = json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
            {"path": "/a", "contents": {"source": data(&gz.finish().unwrap()), "compression": "gzip"}}]}});
        assert_eq!(file_contents(&cfg, "/a", "u").unwrap().unwrap(), b"zipped");
    }

    #[test]
    fn set_file_replaces_every_entry_for_the_path() {
        let mut cfg = served();
        set_file(&mut cfg, KUBECONFIG, b"new");
        set_file(&mut cfg, KUBECONFIG, b"newer");
        let kc: Vec<_> = files(&cfg)
            .filter(|f| same_path(f["path"].as_str().unwrap(), KUBECONFIG))
            .collect();
        assert_eq!(kc.len(), 1);
        assert_eq!(kc[0]["mode"], 420);
        assert_eq!(kc[0]["overwrite"], true);
        assert_eq!(
            file_contents(&cfg, KUBECONFIG, "u").unwrap().unwrap(),
            b"newer"
        );
        assert_eq!(
            file_contents(&cfg, "/etc/motd", "u").unwrap().unwrap(),
            b"hello world"
        );
        let mut empty = json!({"ignition": {"version": "3.2.0"}});
        set_file(&mut empty, "/x", b"1");
        assert_eq!(files(&empty).count(), 1);
    }

    #[test]
    fn wraps_as_machine_config() {
        let cfg = served();
        let r = rendered(&cfg, "u").unwrap();
        let mc = machine_config(&r, &cfg);
        assert_eq!(mc["kind"], "MachineConfig");
        assert_eq!(mc["metadata"]["name"], "rendered-worker-0123abcd");
        assert_eq!(mc["spec"]["kernelArguments"], json!(["a=1"]));
        assert_eq!(mc["spec"]["config"]["ignition"]["version"], "3.2.0");
        let ann: Value = serde_json::from_slice(&node_annotations(&r.name)).unwrap();
        assert_eq!(
            ann,
            json!({"machineconfiguration.openshift.io/currentConfig": "rendered-worker-0123abcd",
                "machineconfiguration.openshift.io/desiredConfig": "rendered-worker-0123abcd",
                "machineconfiguration.openshift.io/state": "Done"})
        );
    }

    #[test]
    fn image_refs() {
        assert!(image_ref("quay.io/a/b@sha256:00"));
        for bad in ["--flag", "a b", "noslash", "x/$(id)", "a/b;c"] {
            assert!(!image_ref(bad), "{bad}");
        }
    }
}
