//! A server's `Content-Range` (`net::fetch::content_range`), which decides whether a resumed
//! download's answer is appended: a first byte only from exactly `bytes FIRST-LAST/TOTAL` (or
//! `/*`) in decimal, with FIRST <= LAST < TOTAL; anything else is no range at all.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::net::fetch::content_range;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = std::str::from_utf8(data) else {
        return;
    };
    let Some(first) = content_range(v) else {
        return;
    };
    let (span, total) = v
        .strip_prefix("bytes ")
        .and_then(|r| r.split_once('/'))
        .expect("a range from a header without `bytes FIRST-LAST/TOTAL`");
    let (f, l) = span.split_once('-').expect("a range without a dash");
    let last: u64 = l.parse().expect("a range whose last byte is not a number");
    assert_eq!(f.parse::<u64>().ok(), Some(first));
    assert!(first <= last, "{v:?}");
    if total != "*" {
        let t: u64 = total.parse().expect("a total that is neither * nor a number");
        assert!(last < t, "{v:?}");
    }
});
