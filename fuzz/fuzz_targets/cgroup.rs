//! The cgroup parser on any bytes: no panic, and what it returns is well formed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vram_exporter::observe::procfs::{parse_cgroup_file, parse_cgroup_path, short_container_id};

fuzz_target!(|data: &[u8]| {
    for attribution in [parse_cgroup_file(data), parse_cgroup_path(data)] {
        if let Some(id) = &attribution.container_id {
            assert_eq!(id.len(), 64, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
            assert_eq!(short_container_id(id).len(), 12);
        }
        if let Some(uid) = &attribution.pod_uid {
            assert!(uid.len() == 32 || uid.len() == 36, "{uid}");
            assert!(
                uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()),
                "{uid}"
            );
        }
        assert_eq!(attribution.cgroup.is_some(), !attribution.is_empty());
    }
});
