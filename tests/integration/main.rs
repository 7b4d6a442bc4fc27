#[test]
fn t(){ let p = std::path::Path::new(env!("CARGO_BIN_EXE_vram-exporter")).with_file_name("libfake_nvml.so"); assert!(p.exists(), "{p:?}"); }
