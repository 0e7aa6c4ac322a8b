//! Kubeconfig (YAML): a parsed one always names a server. Target the current entry point;
//! adapt here when the parser changes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::kube::Kubeconfig;

fuzz_target!(|text: &str| {
    let Ok(kc) = Kubeconfig::parse(text, "kubeconfig") else {
        return;
    };
    assert!(!kc.server.is_empty());
    // Debug output redacts secrets; it must at least never panic.
    let _ = format!("{kc:?}");
});
