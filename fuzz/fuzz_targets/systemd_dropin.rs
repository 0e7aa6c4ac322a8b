//! A drop-in of systemd-sysext.service or of sysext.conf as the signed mode's check reads it
//! (`sysext::trust::settings`): any text gives settings whose keys and values are trimmed and
//! whose keys hold no `=`, in time linear in the text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    for (section, key, value) in nodestrap::fuzz::systemd_dropin(text) {
        assert!(!key.contains('='), "a key holds no '=': {key:?}");
        assert_eq!(key.trim(), key);
        assert_eq!(value.trim(), value);
        assert_eq!(section.trim(), section);
    }
});
