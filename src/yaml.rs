//! Small helpers over yaml-rust2's tree. Scalars keep their source text (`1.10` stays "1.10",
//! never a float), which the runtime-mappings lookup depends on.

use yaml_rust2::{Yaml, YamlLoader};

use crate::error::{Error, Result};

/// Parse a single-document YAML text; `name` names the input in errors.
pub fn parse(text: &str, name: &str) -> Result<Yaml> {
    let mut docs = YamlLoader::load_from_str(text)
        .map_err(|e| Error::failed(format!("{name}: invalid YAML: {e}")))?;
    match docs.len() {
        0 => Err(Error::failed(format!("{name}: empty YAML document"))),
        1 => Ok(docs.remove(0)),
        n => Err(Error::failed(format!(
            "{name}: expected one YAML document, found {n}"
        ))),
    }
}

/// The literal text of a scalar (string, number, bool); `None` for anything else.
pub fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A string-valued field: missing or null gives `None`, any other non-scalar is an error.
pub fn opt_str(y: &Yaml, key: &str, name: &str) -> Result<Option<String>> {
    match &y[key] {
        Yaml::BadValue | Yaml::Null => Ok(None),
        v => scalar(v)
            .map(Some)
            .ok_or_else(|| Error::failed(format!("{name}: field {key:?} must be a string"))),
    }
}

/// Entries of a mapping as (key text, value).
pub fn entries<'a>(y: &'a Yaml, name: &str, field: &str) -> Result<Vec<(String, &'a Yaml)>> {
    match y {
        Yaml::Hash(h) => h
            .iter()
            .map(|(k, v)| {
                scalar(k)
                    .map(|k| (k, v))
                    .ok_or_else(|| Error::failed(format!("{name}: {field}: keys must be scalars")))
            })
            .collect(),
        _ => Err(Error::failed(format!("{name}: {field} must be a mapping"))),
    }
}

/// Items of a sequence; missing or null is empty.
pub fn items<'a>(y: &'a Yaml, name: &str, field: &str) -> Result<&'a [Yaml]> {
    match y {
        Yaml::Array(a) => Ok(a),
        Yaml::BadValue | Yaml::Null => Ok(&[]),
        _ => Err(Error::failed(format!("{name}: {field} must be a list"))),
    }
}
