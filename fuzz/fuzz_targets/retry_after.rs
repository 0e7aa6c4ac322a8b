//! A server's `Retry-After` (`net::fetch::retry_after`): any header value is either ignored or
//! read as a wait, and the wait never comes out of nothing: digits as seconds, else a date at
//! or after now read as the time until it, a date before now as no wait.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use nodestrap::net::fetch::retry_after;
use nodestrap::net::retry::After;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = std::str::from_utf8(data) else {
        return;
    };
    // Sun, 06 Nov 1994 08:49:37 GMT: dates on either side of it are in the corpus.
    let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
    let Some(after) = retry_after(v, now) else {
        return;
    };
    let t = v.trim();
    match after {
        After::Delay(wait) => assert_eq!(
            Some(wait.as_secs()),
            t.parse::<u64>().ok().or(Some(u64::MAX))
        ),
        After::Date(wait) => {
            let at = httpdate::parse_http_date(t).expect("a wait from something not a date");
            assert_eq!(wait, at.duration_since(now).unwrap_or_default());
        }
    }
});
