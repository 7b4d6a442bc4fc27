//! The shape of a Kubernetes pod uid, which two sources name pods by: a process's cgroup
//! (read from `/proc`) and the kubelet's pod log directories.

/// A Kubernetes pod uid: a UUID (8-4-4-4-12 hex digits), or the 32-digit hash the kubelet
/// gives a static pod.
pub(crate) fn is_pod_uid(uid: &[u8]) -> bool {
    if is_hex(uid, 32) {
        return true;
    }
    let groups: Vec<&[u8]> = uid.split(|&byte| byte == b'-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, digits)| is_hex(group, digits))
}

fn is_hex(text: &[u8], digits: usize) -> bool {
    text.len() == digits && text.iter().all(u8::is_ascii_hexdigit)
}
