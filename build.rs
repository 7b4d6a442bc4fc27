//! Bakes the source revision into the binary for `vram_build_info{revision}`.

#[path = "build/revision.rs"]
mod revision;

fn main() {
    println!("cargo:rerun-if-env-changed=VRAM_EXPORTER_REVISION");
    let package = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let explicit = std::env::var("VRAM_EXPORTER_REVISION").ok();
    let found = revision::find(&package, explicit.as_deref());
    for path in &found.watch {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rustc-env=VRAM_EXPORTER_REVISION={}", found.value);
}
