//! The YAML budget the two YAML targets assert: the tree nodestrap's loader builds never holds
//! more nodes than `yaml::MAX_NODES`, however the anchors and aliases multiply the text.

use yaml_rust2::Yaml;

/// Every node of a document that passed the budget, keys included.
pub fn assert_tree_within_input(text: &str) {
    let Ok(doc) = nodestrap::yaml::parse(text, "fuzz") else {
        return;
    };
    let cap = nodestrap::yaml::MAX_NODES as usize;
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
