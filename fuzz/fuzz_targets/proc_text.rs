//! The hand-written /proc and /etc parsers on any bytes: no panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vram_exporter::observe::parse;

fuzz_target!(|data: &[u8]| {
    let _ = parse::stat_fields(data);
    if let Some(levels) = parse::nspid(data) {
        assert!(!levels.is_empty());
    }
    let _ = parse::namespace_inode(data);
    let _ = parse::effective_capabilities(data);
    let uid = data.get(..4).map_or(0, |bytes| {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    });
    if let Some(name) = parse::passwd_user(&String::from_utf8_lossy(data), uid) {
        assert!(!name.is_empty());
    }
});
