//! Kubeconfig (YAML): a parsed one always names a server. Target the current entry point;
//! adapt here when the parser changes.
#![no_main]

#[path = "common/yaml_budget.rs"]
mod yaml_budget;

use libfuzzer_sys::fuzz_target;
use nodestrap::net::kubeconfig::Kubeconfig;

fuzz_target!(|text: &str| {
    yaml_budget::assert_tree_within_input(text);
    let Ok(kc) = Kubeconfig::parse(text, "kubeconfig") else {
        return;
    };
    assert!(!kc.server.is_empty());
    // Debug output redacts secrets; it must at least never panic.
    let _ = format!("{kc:?}");
});
