//! os-release and kubelet.env (`EnvFile::parse`): what parses renders back to the same vars.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::envfile::EnvFile;

fuzz_target!(|text: &str| {
    let Ok(mut e) = EnvFile::parse(text, "fuzz.env") else {
        return;
    };
    // bootstrap rewrites kubelet.env with render(): a reread must give the same file.
    let again = EnvFile::parse(&e.render(), "rendered").expect("rendered file parses");
    assert_eq!(again, e);
    if let Some((k, v)) = e.vars.first().cloned() {
        assert_eq!(e.get(&k), Some(v.as_str()), "get gives the first value");
        // A value that needs quoting and escaping, set over every entry of that key.
        e.set(&k, "a \"b\" $c `d` \\e");
        assert_eq!(e.vars.iter().filter(|(x, _)| *x == k).count(), 1);
        let again = EnvFile::parse(&e.render(), "set").expect("rendered file parses");
        assert_eq!(again, e);
    }
});
