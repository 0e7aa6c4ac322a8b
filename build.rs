//! Build-time facts for the binary: its build date (the clock's floor, src/node/clock.rs), its
//! version (`NODESTRAP_VERSION`, default Cargo.toml's: the tests build a later release of the
//! same code to move a node to, docs/build.md), and link settings that only the release binary takes (never the test binaries, which unwind).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=link/no-unwind-tables.ld");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rustc-env=NODESTRAP_BUILD_EPOCH={}", build_epoch());
    println!("cargo:rerun-if-env-changed=NODESTRAP_VERSION");
    println!("cargo:rustc-env=NODESTRAP_VERSION={}", version());

    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    // Release binaries: no unwind tables (docs/build.md, "Position independence and size"). GNU
    // ld (amd64) and Zig's lld (arm64) both take a script with INSERT.
    if target.ends_with("-unknown-linux-musl") && profile == "release" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/link/no-unwind-tables.ld");
    }
    // amd64 release: linked by the toolchain's own rust-lld, through the gcc-ld shim every rustup
    // toolchain ships, for identical code folding (the same machine code once: -22 KB). arm64's
    // linker is Zig's.
    if target == "x86_64-unknown-linux-musl" && profile == "release" {
        let gcc_ld = toolchain_gcc_ld();
        println!("cargo:rustc-link-arg-bins=-fuse-ld=lld");
        println!("cargo:rustc-link-arg-bins=-B{gcc_ld}");
        println!("cargo:rustc-link-arg-bins=-Wl,--icf=all");
    }
}

/// `NODESTRAP_VERSION` when set (dot-separated numbers only: the version floor compares them),
/// else the package's.
fn version() -> String {
    match std::env::var("NODESTRAP_VERSION") {
        Ok(v) if !v.is_empty() => {
            let ok = v.split('.').count() == 3
                && v.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            if !ok {
                panic!("NODESTRAP_VERSION={v}: expected MAJOR.MINOR.PATCH, numbers only");
            }
            v
        }
        _ => std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
    }
}

/// The toolchain's `lib/rustlib/HOST/bin/gcc-ld`, where its `ld.lld` shim runs rust-lld.
fn toolchain_gcc_ld() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let host = std::env::var("HOST").unwrap_or_default();
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let dir = format!("{sysroot}/lib/rustlib/{host}/bin/gcc-ld");
    if !std::path::Path::new(&dir).join("ld.lld").exists() {
        panic!("{dir}/ld.lld not found: the release binary links with the toolchain's rust-lld (rustup's toolchains ship it)");
    }
    dir
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
