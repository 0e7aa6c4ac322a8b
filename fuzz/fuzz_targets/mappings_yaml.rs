//! Runtime mappings (`kind: VersionManifestV1`, YAML): lookups on whatever parsed.
#![no_main]

#[path = "common/yaml_budget.rs"]
mod yaml_budget;

use libfuzzer_sys::fuzz_target;
use nodestrap::node::mappings::{major_minor, Mappings};

fuzz_target!(|text: &str| {
    // Versions come from the same untrusted places (kubelet.env, the API server).
    for line in text.lines().take(8) {
        if let Some(m) = major_minor(line) {
            let (a, b) = m.split_once('.').expect("MAJOR.MINOR");
            assert!(a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok(), "{m}");
        }
    }
    yaml_budget::assert_tree_within_input(text);
    let Ok(m) = Mappings::parse(text, "mappings.yaml") else {
        return;
    };
    for k8s in ["v1.10.2+coreos.0", "v1.9.6", "1.11.0-rc.1"] {
        if let Ok(list) = m.runtime_for(k8s, "docker") {
            assert!(!list.is_empty(), "an answer names a version");
        }
    }
});
