//! Links ISA-L (Intel's igzip), which compresses the AppendRows requests: `isal-rs` is built
//! with `use-system-isal`, so the library comes from the system (Debian's `libisal-dev`, installed
//! by `scripts/system-deps.sh` and the Dockerfile) rather than from autotools and nasm.

fn main() {
    println!("cargo:rustc-link-lib=isal");
    println!("cargo:rerun-if-changed=build.rs");
    // `sqlx::migrate!` embeds the migrations at compile time but cannot tell cargo on stable
    // Rust (sqlx's documented advice): a new migration alone must rebuild the crate.
    println!("cargo:rerun-if-changed=migrations");
}
