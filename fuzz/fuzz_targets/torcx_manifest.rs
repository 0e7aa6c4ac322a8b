//! The torcx package list (`torcx-package-list-v0` JSON): every name that parsed is plain,
//! and every source it gives is a vendored path or an http(s) URL with a digest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::root::plain_name;
use nodestrap::torcx::layout::VENDOR_STORE;
use nodestrap::torcx::store::{PackageList, Source};

fuzz_target!(|data: &[u8]| {
    let Ok(list) = PackageList::parse(data, "manifest.json") else {
        return;
    };
    for p in &list.value.packages {
        assert!(plain_name(&p.name));
        for v in &p.versions {
            assert!(plain_name(&v.version));
            match list.source_for(&p.name, &v.version) {
                Some(Source::Vendored(path)) => {
                    assert!(path.starts_with(&format!("{VENDOR_STORE}/")))
                }
                Some(Source::Remote { url, .. }) => {
                    assert!(url.starts_with("https://") || url.starts_with("http://"))
                }
                None => {}
            }
        }
    }
});
