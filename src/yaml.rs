//! Small helpers over yaml-rust2's tree. Scalars keep their source text (`1.10` stays "1.10",
//! never a float), which the runtime-mappings lookup depends on.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;
use yaml_rust2::{Yaml, YamlLoader};

use crate::error::{Error, Result};

/// What one YAML document may cost. A ConfigMap that anyone with edit rights can change is read
/// by every node that bootstraps: a "billion laughs" of aliases, or nesting deep enough to
/// overflow the stack, must be refused before a tree is built.
pub(crate) const MAX_BYTES: usize = 1 << 20;
pub(crate) const MAX_DEPTH: usize = 64;
/// Nodes of the document with every alias expanded, as the tree would hold them.
pub const MAX_NODES: u64 = 100_000;

/// Parse a single-document YAML text; `name` names the input in errors.
pub fn parse(text: &str, name: &str) -> Result<Yaml> {
    let mut docs = parse_all(text, name)?;
    match docs.len() {
        0 => Err(Error::failed(format!("{name}: empty YAML document"))),
        1 => Ok(docs.remove(0)),
        n => Err(Error::failed(format!(
            "{name}: expected one YAML document, found {n}"
        ))),
    }
}

/// Parse every document of a YAML text (`---` between them), within one budget for all.
pub(crate) fn parse_all(text: &str, name: &str) -> Result<Vec<Yaml>> {
    if text.len() > MAX_BYTES {
        return Err(Error::failed(format!(
            "{name}: {} bytes of YAML is over the {MAX_BYTES}-byte limit",
            text.len()
        )));
    }
    // First pass: events only, counting depth and expanded nodes; no tree is built.
    let mut budget = Budget::default();
    Parser::new_from_str(text)
        .load(&mut budget, true)
        .map_err(|e| Error::failed(format!("{name}: invalid YAML: {e}")))?;
    if let Some(over) = budget.over {
        return Err(Error::failed(format!("{name}: {over}")));
    }
    YamlLoader::load_from_str(text).map_err(|e| Error::failed(format!("{name}: invalid YAML: {e}")))
}

/// Event receiver that sizes the tree a loader would build.
#[derive(Default)]
struct Budget {
    /// Open collections: their anchor id and expanded node count so far.
    open: Vec<(usize, u64)>,
    /// Expanded size of each anchored node.
    anchors: HashMap<usize, u64>,
    total: u64,
    over: Option<String>,
}

impl Budget {
    /// A finished node of `size` expanded nodes joins its parent (and the total).
    fn add(&mut self, size: u64) {
        self.total = self.total.saturating_add(size);
        if let Some((_, n)) = self.open.last_mut() {
            *n = n.saturating_add(size);
        }
        if self.total > MAX_NODES {
            self.over = Some(format!(
                "more than {MAX_NODES} YAML nodes once aliases are expanded (limit {MAX_NODES})"
            ));
        }
    }

    fn anchor(&mut self, id: usize, size: u64) {
        if id > 0 {
            self.anchors.insert(id, size);
        }
    }
}

impl MarkedEventReceiver for Budget {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.over.is_some() {
            return;
        }
        match ev {
            Event::SequenceStart(id, _) | Event::MappingStart(id, _) => {
                if self.open.len() >= MAX_DEPTH {
                    self.over = Some(format!(
                        "nesting deeper than {MAX_DEPTH} levels at line {} (limit {MAX_DEPTH})",
                        mark.line()
                    ));
                    return;
                }
                // The collection itself counts as one node of its parent's total.
                self.total = self.total.saturating_add(1);
                self.open.push((id, 1));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((id, n)) = self.open.pop() {
                    self.anchor(id, n);
                    // `n` already counted into `total` while it grew; only the parent gains.
                    if let Some((_, p)) = self.open.last_mut() {
                        *p = p.saturating_add(n);
                    }
                }
            }
            Event::Scalar(_, _, id, _) => {
                self.anchor(id, 1);
                self.add(1);
            }
            Event::Alias(id) => {
                let size = self.anchors.get(&id).copied().unwrap_or(1);
                self.add(size);
            }
            _ => {}
        }
    }
}

/// The literal text of a scalar (string, number, bool); `None` for anything else.
pub(crate) fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A string-valued field: missing or null gives `None`, any other non-scalar is an error.
pub(crate) fn opt_str(y: &Yaml, key: &str, name: &str) -> Result<Option<String>> {
    match &y[key] {
        Yaml::BadValue | Yaml::Null => Ok(None),
        v => scalar(v)
            .map(Some)
            .ok_or_else(|| Error::failed(format!("{name}: field {key:?} must be a string"))),
    }
}

/// Entries of a mapping as (key text, value).
pub(crate) fn entries<'a>(y: &'a Yaml, name: &str, field: &str) -> Result<Vec<(String, &'a Yaml)>> {
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
pub(crate) fn items<'a>(y: &'a Yaml, name: &str, field: &str) -> Result<&'a [Yaml]> {
    match y {
        Yaml::Array(a) => Ok(a),
        Yaml::BadValue | Yaml::Null => Ok(&[]),
        _ => Err(Error::failed(format!("{name}: {field} must be a list"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn billion_laughs_is_refused_by_its_expanded_size() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            doc.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = parse(&doc, "ConfigMap ns/cm key k")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("ConfigMap ns/cm key k: more than 100000 YAML nodes"),
            "{e}"
        );
    }

    #[test]
    fn a_few_aliases_are_fine() {
        let doc = "base: &b {docker: ['17.03']}\nversions:\n  a: *b\n  c: *b\n";
        let y = parse(doc, "f").unwrap();
        assert_eq!(scalar(&y["versions"]["c"]["docker"][0]).unwrap(), "17.03");
    }

    #[test]
    fn deep_nesting_and_large_documents_are_refused() {
        // Flow style: yaml-rust2's scanner stops at its own recursion limit first.
        let deep = "[".repeat(100_000);
        let e = parse(&deep, "f").unwrap_err().to_string();
        assert!(e.starts_with("f: invalid YAML: recursion limit"), "{e}");
        // Block style reaches ours.
        let deep: String = (0..100)
            .map(|i| format!("{}a:\n", "  ".repeat(i)))
            .collect();
        let e = parse(&deep, "f").unwrap_err().to_string();
        assert!(e.contains("nesting deeper than 64 levels"), "{e}");
        let ok = format!("{}{}", "[".repeat(60), "]".repeat(60));
        parse(&ok, "f").unwrap();
        let big = format!("k: \"{}\"\n", "x".repeat(MAX_BYTES));
        let e = parse(&big, "/etc/m.yaml").unwrap_err().to_string();
        assert!(e.contains("over the 1048576-byte limit"), "{e}");
    }
}
