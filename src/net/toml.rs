//! TOML documents (containerd's `hosts.toml`), read through `toml_parser`: the toml crate's own
//! lexer, grammar and string decoding, without the `toml` crate's serde layer, which costs
//! about 98 KB of the 4 MiB budget. What is ours is the part the grammar leaves to a reader:
//! tables from headers, dotted keys and inline tables, in document order (containerd tries
//! mirrors in the order the file names them), with TOML 1.0's rules against defining a key
//! or table twice. Dates, integers and floats are kept as their kind only: no key nodestrap
//! reads has one.

use toml_parser::decoder::ScalarKind;
use toml_parser::parser::{Event, EventKind, RecursionGuard};
use toml_parser::{ParseError, Source, Span};

use crate::error::{Error, Result};

/// Arrays and inline tables nested deeper than this are refused (the parser's own guard).
const MAX_DEPTH: u32 = 16;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    String(String),
    Bool(bool),
    /// An integer, float or date-time: its kind ("integer", "float", "date-time").
    Other(&'static str),
    Array(Vec<Value>),
    Table(Table),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Table {
    /// In the order the document first names each key.
    pub(crate) entries: Vec<(String, Value)>,
    how: Defined,
}

/// How a table came to be, for TOML's rules on extending it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Defined {
    /// Only as the parent of something else (`[a.b]` makes `a` so): a header may still
    /// define it once.
    #[default]
    Implicitly,
    /// By its own `[header]`.
    Header,
    /// By dotted keys (`a.b = 1` makes `a`): more dotted keys may extend it, a header may not.
    Dotted,
    /// As an inline table or an array element's table: closed.
    Closed,
}

impl Value {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Other(k) => k,
            Value::Array(_) => "array",
            Value::Table(_) => "table",
        }
    }
}

impl Table {
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// The document `text`; errors name `name`, the line and the reason.
pub(crate) fn parse(text: &str, name: &str) -> Result<Table> {
    let source = Source::new(text);
    let tokens = source.lex().into_vec();
    let mut events: Vec<Event> = Vec::new();
    let mut errors: Vec<ParseError> = Vec::new();
    {
        let mut push = |e: Event| {
            if !matches!(
                e.kind(),
                EventKind::Whitespace | EventKind::Comment | EventKind::Newline
            ) {
                events.push(e)
            }
        };
        let mut guard = RecursionGuard::new(&mut push, MAX_DEPTH);
        toml_parser::parser::parse_document(&tokens, &mut guard, &mut errors);
    }
    let line = |span: Span| text[..span.start().min(text.len())].matches('\n').count() + 1;
    if let Some(e) = errors.first() {
        let at = e.unexpected().or(e.context()).map_or(1, line);
        return Err(Error::config(format!(
            "{name}: line {at}: not TOML: {}",
            e.description()
        )));
    }
    let mut reader = Reader {
        source,
        events,
        at: 0,
    };
    reader
        .document()
        .map_err(|(span, why)| Error::config(format!("{name}: line {}: {why}", line(span))))
}

type Fail = (Span, String);

struct Reader<'i> {
    source: Source<'i>,
    events: Vec<Event>,
    at: usize,
}

impl<'i> Reader<'i> {
    fn next(&mut self) -> Option<Event> {
        let e = self.events.get(self.at).copied();
        self.at += 1;
        e
    }

    fn peek(&self) -> Option<EventKind> {
        self.events.get(self.at).map(Event::kind)
    }

    fn fail<T>(&self, span: Span, why: impl Into<String>) -> std::result::Result<T, Fail> {
        Err((span, why.into()))
    }

    fn end(&self) -> Span {
        self.events
            .last()
            .map_or(Span::new_unchecked(0, 0), Event::span)
    }

    fn expect(&mut self, kind: EventKind) -> std::result::Result<Event, Fail> {
        match self.next() {
            Some(e) if e.kind() == kind => Ok(e),
            Some(e) => self.fail(e.span(), format!("expected {}", kind.description())),
            None => self.fail(self.end(), format!("expected {}", kind.description())),
        }
    }

    fn text(&self, e: &Event) -> std::result::Result<String, Fail> {
        let mut out = String::new();
        let mut bad: Option<ParseError> = None;
        match self.source.get(e) {
            Some(raw) => raw.decode_key(&mut out, &mut bad),
            None => return self.fail(e.span(), "a key outside the document"),
        }
        match bad {
            Some(b) => self.fail(e.span(), format!("not TOML: {}", b.description())),
            None => Ok(out),
        }
    }

    /// A key: its simple keys joined by dots.
    fn key(&mut self) -> std::result::Result<(Vec<String>, Span), Fail> {
        let first = self.expect(EventKind::SimpleKey)?;
        let mut path = vec![self.text(&first)?];
        while self.peek() == Some(EventKind::KeySep) {
            self.at += 1;
            let k = self.expect(EventKind::SimpleKey)?;
            path.push(self.text(&k)?);
        }
        Ok((path, first.span()))
    }

    fn document(&mut self) -> std::result::Result<Table, Fail> {
        let mut root = Table::default();
        // The table key-values go to: the path of the last header.
        let mut current: Vec<String> = Vec::new();
        while let Some(e) = self.next() {
            match e.kind() {
                EventKind::StdTableOpen => {
                    let (path, span) = self.key()?;
                    self.expect(EventKind::StdTableClose)?;
                    let t = descend(&mut root, &path[..path.len() - 1], span)?;
                    let last = &path[path.len() - 1];
                    match entry(t, last) {
                        Some(Value::Table(t)) if t.how == Defined::Implicitly => {
                            t.how = Defined::Header
                        }
                        Some(_) => {
                            return self.fail(span, format!("{} is defined twice", dotted(&path)))
                        }
                        None => t.entries.push((
                            last.clone(),
                            Value::Table(Table {
                                entries: Vec::new(),
                                how: Defined::Header,
                            }),
                        )),
                    }
                    current = path;
                }
                EventKind::ArrayTableOpen => {
                    let (path, span) = self.key()?;
                    self.expect(EventKind::ArrayTableClose)?;
                    let t = descend(&mut root, &path[..path.len() - 1], span)?;
                    let last = &path[path.len() - 1];
                    let fresh = Value::Table(Table {
                        entries: Vec::new(),
                        how: Defined::Header,
                    });
                    match entry(t, last) {
                        Some(Value::Array(a))
                            if a.iter().all(
                                |v| matches!(v, Value::Table(t) if t.how == Defined::Header),
                            ) =>
                        {
                            a.push(fresh)
                        }
                        Some(_) => {
                            return self
                                .fail(span, format!("{} is not an array of tables", dotted(&path)))
                        }
                        None => t.entries.push((last.clone(), Value::Array(vec![fresh]))),
                    }
                    current = path;
                }
                EventKind::SimpleKey => {
                    self.at -= 1;
                    let table = descend(&mut root, &current, e.span())?;
                    self.key_value(table)?;
                }
                k => return self.fail(e.span(), format!("unexpected {}", k.description())),
            }
        }
        Ok(root)
    }

    /// `a.b.c = value` into `table`.
    fn key_value(&mut self, table: &mut Table) -> std::result::Result<(), Fail> {
        let (path, span) = self.key()?;
        self.expect(EventKind::KeyValSep)?;
        let value = self.value()?;
        let mut t = table;
        for k in &path[..path.len() - 1] {
            if entry(t, k).is_none() {
                t.entries.push((
                    k.clone(),
                    Value::Table(Table {
                        entries: Vec::new(),
                        how: Defined::Dotted,
                    }),
                ));
            }
            t = match entry(t, k) {
                Some(Value::Table(inner)) if inner.how == Defined::Dotted => inner,
                _ => {
                    return self.fail(
                        span,
                        format!("{} cannot be extended by dotted keys", dotted(&path)),
                    )
                }
            };
        }
        let last = &path[path.len() - 1];
        if entry(t, last).is_some() {
            return self.fail(span, format!("{} is defined twice", dotted(&path)));
        }
        t.entries.push((last.clone(), value));
        Ok(())
    }

    fn value(&mut self) -> std::result::Result<Value, Fail> {
        let Some(e) = self.next() else {
            return self.fail(self.end(), "expected a value");
        };
        match e.kind() {
            EventKind::Scalar => {
                let mut out = String::new();
                let mut bad: Option<ParseError> = None;
                let kind = match self.source.get(e) {
                    Some(raw) => raw.decode_scalar(&mut out, &mut bad),
                    None => return self.fail(e.span(), "a value outside the document"),
                };
                if let Some(b) = bad {
                    return self.fail(e.span(), format!("not TOML: {}", b.description()));
                }
                Ok(match kind {
                    ScalarKind::String => Value::String(out),
                    ScalarKind::Boolean(b) => Value::Bool(b),
                    k => Value::Other(k.description()),
                })
            }
            EventKind::ArrayOpen => {
                let mut items = Vec::new();
                loop {
                    match self.peek() {
                        Some(EventKind::ArrayClose) => {
                            self.at += 1;
                            return Ok(Value::Array(items));
                        }
                        Some(EventKind::ValueSep) => self.at += 1,
                        Some(_) => {
                            let mut v = self.value()?;
                            if let Value::Table(t) = &mut v {
                                t.how = Defined::Closed;
                            }
                            items.push(v)
                        }
                        None => return self.fail(e.span(), "an array without its ]"),
                    }
                }
            }
            EventKind::InlineTableOpen => {
                let mut t = Table::default();
                loop {
                    match self.peek() {
                        Some(EventKind::InlineTableClose) => {
                            self.at += 1;
                            close(&mut t);
                            return Ok(Value::Table(t));
                        }
                        Some(EventKind::ValueSep) => self.at += 1,
                        Some(_) => self.key_value(&mut t)?,
                        None => return self.fail(e.span(), "an inline table without its }"),
                    }
                }
            }
            k => self.fail(
                e.span(),
                format!("expected a value, not {}", k.description()),
            ),
        }
    }
}

/// An inline table and every table its dotted keys made are closed to later definitions.
fn close(t: &mut Table) {
    t.how = Defined::Closed;
    for (_, v) in &mut t.entries {
        if let Value::Table(inner) = v {
            close(inner);
        }
    }
}

fn entry<'t>(t: &'t mut Table, key: &str) -> Option<&'t mut Value> {
    t.entries.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn dotted(path: &[String]) -> String {
    path.join(".")
}

/// The table at `path` below `root`, made implicitly where missing; through an array of
/// tables, its last element.
fn descend<'t>(
    root: &'t mut Table,
    path: &[String],
    span: Span,
) -> std::result::Result<&'t mut Table, Fail> {
    let mut t = root;
    for (i, k) in path.iter().enumerate() {
        if entry(t, k).is_none() {
            t.entries.push((k.clone(), Value::Table(Table::default())));
        }
        t = match entry(t, k) {
            Some(Value::Table(inner)) if inner.how != Defined::Closed => inner,
            Some(Value::Array(a)) => match a.last_mut() {
                Some(Value::Table(inner)) if inner.how == Defined::Header => inner,
                _ => return Err((span, format!("{} is not a table", dotted(&path[..=i])))),
            },
            _ => return Err((span, format!("{} is not a table", dotted(&path[..=i])))),
        };
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value::String(v.to_string())
    }

    #[test]
    fn hosts_file_in_order() {
        let t = parse(
            r#"
server = "https://registry.example"   # the origin
[host."https://b.example"]
  capabilities = ["pull"]
  ca = 'ca.pem'
[host."https://a.example"]
  capabilities = ["pull", "resolve"]
  client = [["c.pem", "k.pem"]]
  [host."https://a.example".header]
    X-A = "1"
    x-b = ["2", "3"]
[host."https://b.example".header]
  Y = "\u00e9"
"#,
            "hosts.toml",
        )
        .unwrap();
        assert_eq!(t.get("server"), Some(&s("https://registry.example")));
        let Some(Value::Table(hosts)) = t.get("host") else {
            panic!("{t:?}")
        };
        let names: Vec<_> = hosts.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["https://b.example", "https://a.example"]);
        let Some(Value::Table(b)) = hosts.get("https://b.example") else {
            panic!()
        };
        assert_eq!(b.get("capabilities"), Some(&Value::Array(vec![s("pull")])));
        let Some(Value::Table(h)) = b.get("header") else {
            panic!()
        };
        assert_eq!(h.get("Y"), Some(&s("é")));
    }

    #[test]
    fn dotted_and_inline() {
        let t = parse("a.b.c = true\na.b.d = 1\nx = { y = 'z', w.v = [] }\n", "t").unwrap();
        let Some(Value::Table(a)) = t.get("a") else {
            panic!()
        };
        let Some(Value::Table(b)) = a.get("b") else {
            panic!()
        };
        assert_eq!(b.get("c"), Some(&Value::Bool(true)));
        assert_eq!(b.get("d"), Some(&Value::Other("integer")));
    }

    #[test]
    fn refused() {
        for (doc, why) in [
            ("a = 1\na = 2\n", "line 2: a is defined twice"),
            ("[a]\n[a]\n", "line 2: a is defined twice"),
            ("a = 1\n[a.b]\n", "line 2: a is not a table"),
            ("x = { y = 1 }\n[x.z]\n", "line 2: x is not a table"),
            ("x = { y = 1 }\nx.z = 2\n", "line 2: x.z cannot be extended"),
            ("[a]\nb = 1\n[a.b]\n", "line 3: a.b is defined twice"),
            ("a = \"unterminated\n", "line 1: not TOML"),
            (
                "a = [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]\n",
                "not TOML",
            ),
            ("= 1\n", "not TOML"),
        ] {
            let e = parse(doc, "t").unwrap_err().to_string();
            assert!(e.contains(why), "{doc:?}: {e}");
        }
    }

    /// Python's tomllib (a TOML 1.0 reader) as the oracle: the same documents accepted with
    /// the same values, the same ones refused.
    #[test]
    fn agrees_with_tomllib() {
        fn json(v: &Value) -> serde_json::Value {
            match v {
                Value::String(s) => s.clone().into(),
                Value::Bool(b) => (*b).into(),
                Value::Other(k) => format!("<{k}>").into(),
                Value::Array(a) => a.iter().map(json).collect(),
                Value::Table(t) => t
                    .entries
                    .iter()
                    .map(|(k, v)| (k.clone(), json(v)))
                    .collect(),
            }
        }
        let docs = [
            "server = \"https://r\"\n[host.\"https://m:5000\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            "[a.b]\nc = 1\n[a]\nd = 2.5\n",
            "a.b.c = true\na.d = 1979-05-27T07:32:00Z\n",
            "x = { y = 'z', w.v = [ [1, 2], ['a'] ] }\n",
            "[[t]]\nn = 1\n[[t]]\nn = 2\n[t.sub]\nq = \"\"\"multi\nline\"\"\"\n",
            "s = \"tab\\there \\u00e9 \\\"q\\\"\"\nl = 'C:\\path'\n",
            "\"quoted key\" = 1\n'lit.key' = 2\n",
            "a = 1\na = 2\n",
            "[a]\n[a]\n",
            "a = 1\n[a.b]\n",
            "x = { y = 1 }\nx.z = 2\n",
            "[fruit]\napple.color = 'red'\n[fruit.apple]\n",
            "[fruit]\napple.color = 'red'\n[fruit.apple.texture]\nsmooth = true\n",
            "a = [1, 2,]\n",
            "a = \"bad \\q escape\"\n",
            "a = \"no end\n",
            "a = 1 b = 2\n",
            "[t]\na = 1\n[[t]]\n",
            "k = \"\\uD800\"\n",
            "",
        ];
        for doc in docs {
            let ours = parse(doc, "t").map(|t| json(&Value::Table(t)));
            let out = std::process::Command::new("python3")
                .args([
                    "-c",
                    r#"
import sys, json, tomllib, datetime
def conv(v):
    if isinstance(v, bool): return v
    if isinstance(v, int): return "<integer>"
    if isinstance(v, float): return "<float>"
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)): return "<date-time>"
    if isinstance(v, list): return [conv(x) for x in v]
    if isinstance(v, dict): return {k: conv(x) for k, x in v.items()}
    return v
try:
    print(json.dumps(conv(tomllib.loads(sys.argv[1]))))
except tomllib.TOMLDecodeError as e:
    print("refused", e)
"#,
                    doc,
                ])
                .output()
                .expect("python3 (3.11 or later, for tomllib)");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{doc:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            match (&ours, said.strip_prefix("refused")) {
                (Ok(v), None) => {
                    let theirs: serde_json::Value = serde_json::from_str(&said).unwrap();
                    assert_eq!(*v, theirs, "{doc:?}");
                }
                (Err(_), Some(_)) => {}
                _ => panic!("{doc:?}: nodestrap {ours:?}, tomllib {said}"),
            }
        }
    }
}
