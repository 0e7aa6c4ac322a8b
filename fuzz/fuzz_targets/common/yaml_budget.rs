//! The YAML budget the two YAML targets assert: the tree nodestrap's loader builds is never much
//! larger than the text it came from (anchors and aliases must not multiply it).

use yaml_rust2::Yaml;

/// Without aliases a node takes at least a byte or two of text; four per byte is ample.
pub fn assert_tree_within_input(text: &str) {
    let Ok(doc) = nodestrap::yaml::parse(text, "fuzz") else {
        return;
    };
    let cap = 4 * text.len() + 16;
    let mut stack = vec![&doc];
    let mut n = 0;
    while let Some(y) = stack.pop() {
        n += 1;
        assert!(
            n <= cap,
            "{} bytes of YAML became over {cap} nodes",
            text.len()
        );
        match y {
            Yaml::Array(a) => stack.extend(a),
            Yaml::Hash(h) => h.iter().for_each(|(k, v)| stack.extend([k, v])),
            _ => {}
        }
    }
}
