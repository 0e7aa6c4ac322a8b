//! Link settings that only the release binary takes (never the test binaries, which unwind).

fn main() {
    println!("cargo:rerun-if-changed=link/no-unwind-tables.ld");
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    // amd64 release: no unwind tables (docs/build.md, "Position independence and size"). GNU ld
    // and lld both take a script with INSERT; arm64 links through Zig and fits without.
    if target == "x86_64-unknown-linux-musl" && profile == "release" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/link/no-unwind-tables.ld");
    }
}
