//! The hand-written /proc and /etc parsers on any bytes: no panic, and what they return
//! is well formed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vram_exporter::observe::procfs::parse;

fuzz_target!(|data: &[u8]| {
    if let Some(stat) = parse::stat(data) {
        assert!(stat.comm.len() <= data.len() * 3);
    }
    if let Some(levels) = parse::status(data).nspid {
        assert!(!levels.is_empty());
    }
    let _ = parse::namespace_inode(data);
    for mapping in parse::shared_mappings(data) {
        assert!(!mapping.path.is_empty() && mapping.inode != 0);
        let _ = parse::nvidia_node(mapping.path, b"/dev/nvidia");
    }
    let _ = parse::nvidia_node(data, b"/dev/nvidia");
    let uid = data.get(..4).map_or(0, |bytes| {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    });
    if let Some(name) = parse::passwd_user(&String::from_utf8_lossy(data), uid) {
        assert!(!name.is_empty());
    }
});
