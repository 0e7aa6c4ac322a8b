//! A sysext DDI as the sysext bootstrap judges it (`sysext::ddi::read` and `prove`: the GPT,
//! the signature partition's JSON, the verity superblock and hash tree), from any bytes in a
//! file: a layout and a proof or a reason, never a panic, never a read past the file; with no
//! trusted certificate nothing is ever proven. The seed is a real DDI by systemd-repart 257.
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nodestrap::sysext::ddi;

fn path() -> &'static std::path::PathBuf {
    static P: OnceLock<std::path::PathBuf> = OnceLock::new();
    P.get_or_init(|| std::env::temp_dir().join(format!("nodestrap-fuzz-ddi-{}", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    let mut f = std::fs::File::create(path()).expect("a scratch file");
    f.write_all(data).expect("written");
    let f = std::fs::File::open(path()).expect("reopened");
    let Some(sector) = ddi::gpt_sector(data) else {
        return;
    };
    let Ok(d) = ddi::read(&f, sector, data.len() as u64, "x86-64") else {
        return;
    };
    for p in [d.data, d.verity, d.sig] {
        assert!(p.offset + p.len <= data.len() as u64);
    }
    assert!(ddi::prove(&f, &d, &[]).is_err(), "proven without a certificate");
});
