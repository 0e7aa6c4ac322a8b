//! kubeadm's JoinConfiguration (YAML, possibly several documents): a parsed one names a
//! kubeconfig on the node, or an endpoint, a bootstrap token and at least one well-formed pin.
#![no_main]

#[path = "common/yaml_budget.rs"]
mod yaml_budget;

use libfuzzer_sys::fuzz_target;
use nodestrap::net::join_config::{parse, Discovery};

fuzz_target!(|text: &str| {
    yaml_budget::assert_tree_within_input(text);
    match parse(text, "join.yaml") {
        Ok(Discovery::File(p)) => assert!(p.starts_with('/')),
        Ok(Discovery::Token {
            endpoint,
            token,
            pins,
        }) => {
            assert!(endpoint.contains(':') && !endpoint.contains('/'));
            assert_eq!(token.len(), 23);
            assert!(!pins.is_empty() && pins.iter().all(|p| p.len() == 71));
        }
        // An error names the file (the token field's value is never echoed: the unit tests).
        Err(e) => assert!(e.to_string().starts_with("join.yaml: ")),
    }
});
