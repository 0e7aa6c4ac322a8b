//! Build-time facts for the binary: its build date (the clock's floor, src/node/clock.rs), and
//! link settings that only the release binary takes (never the test binaries, which unwind).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=link/no-unwind-tables.ld");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rustc-env=NODESTRAP_BUILD_EPOCH={}", build_epoch());

    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    // amd64 release: no unwind tables (docs/build.md, "Position independence and size"). GNU ld
    // and lld both take a script with INSERT; arm64 links through Zig and fits without.
    if target == "x86_64-unknown-linux-musl" && profile == "release" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/link/no-unwind-tables.ld");
    }
}

/// Seconds since 1970 of the build, reproducibly: `SOURCE_DATE_EPOCH` (reproducible-builds.org)
/// when set, else the time of the commit built, else 0 (no floor from the build).
fn build_epoch() -> u64 {
    if let Some(v) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return v;
    }
    Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
