//! The small `/proc` and `/etc` text formats read by hand rather than through the
//! `procfs` crate: pure and total, so any bytes give an answer (and the fuzz targets in
//! `fuzz/` can say so). The cgroup file has its own module, [`super::cgroup`].

/// `PF_EXITING` in `/proc/PID/stat`'s flags: the thread has begun to exit.
pub const PF_EXITING: u32 = 0x0000_0004;

/// The fields of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) the exporter reads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFields {
    /// The one-letter state (`R`, `S`, `D`, `Z`, ...).
    pub state: u8,
    /// Parent PID.
    pub ppid: u32,
    /// The kernel's `PF_*` flags of the thread.
    pub flags: u32,
}

/// Reads state, parent and flags from a stat line. The command name in parentheses may
/// itself contain `) ` and spaces, so the fields start after the last `) `.
pub fn stat_fields(stat: &[u8]) -> Option<StatFields> {
    let end = stat.windows(2).rposition(|pair| pair == b") ")?;
    let mut fields = stat[end + 2..].split(|&byte| byte == b' ');
    let state = *fields.next()?.first()?;
    let ppid = number(fields.next()?)?;
    // pgrp, session, tty_nr, tpgid, then flags.
    let flags = number(fields.nth(4)?)?;
    Some(StatFields {
        state,
        ppid: u32::try_from(ppid).ok()?,
        flags: u32::try_from(flags).ok()?,
    })
}

/// The `NSpid:` line of `/proc/PID/status`: the PID in each PID namespace from the one
/// the procfs belongs to down to the process's own. `None` when the line is missing
/// (kernels before 4.1) or malformed.
pub fn nspid(status: &[u8]) -> Option<Vec<u32>> {
    let line = status
        .split(|&byte| byte == b'\n')
        .find_map(|line| line.strip_prefix(b"NSpid:"))?;
    let pids: Option<Vec<u32>> = line
        .split(|byte| byte.is_ascii_whitespace())
        .filter(|field| !field.is_empty())
        .map(|field| number(field).and_then(|pid| u32::try_from(pid).ok()))
        .collect();
    pids.filter(|pids| !pids.is_empty())
}

/// `CAP_SYS_PTRACE`, the capability that lets a process read where another user's
/// descriptors point.
pub const CAP_SYS_PTRACE: u32 = 19;

/// The effective capability set (`CapEff:`, hexadecimal) of a `/proc/PID/status`.
pub fn effective_capabilities(status: &[u8]) -> Option<u64> {
    let line = status
        .split(|&byte| byte == b'\n')
        .find_map(|line| line.strip_prefix(b"CapEff:"))?;
    let digits = std::str::from_utf8(line).ok()?.trim();
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// The inode of a namespace link target such as `pid:[4026532177]`.
pub fn namespace_inode(link: &[u8]) -> Option<u64> {
    let start = link.iter().position(|&byte| byte == b'[')?;
    let rest = &link[start + 1..];
    let end = rest.iter().position(|&byte| byte == b']')?;
    if end + 1 != rest.len() {
        return None;
    }
    number(&rest[..end])
}

/// The name a password file (`name:password:uid:...` lines) gives `uid`.
pub fn passwd_user(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// A decimal number of ASCII digits only (no sign, no spaces), or `None`.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_of_a_sleeping_process() {
        let stat = b"27240 (sleep) S 27238 27234 24780 0 -1 4195340 101 0 0 0 0 0 0 0 20 0 1 0 6186 2490368 236 18446744073709551615";
        assert_eq!(
            stat_fields(stat),
            Some(StatFields {
                state: b'S',
                ppid: 27238,
                flags: 4_195_340
            })
        );
        // 4195340 = 0x40060C: this PID 1 of a namespace was in its exit path.
        assert_ne!(stat_fields(stat).unwrap().flags & PF_EXITING, 0);
    }

    #[test]
    fn stat_with_a_command_name_that_looks_like_the_end() {
        let stat = b"42 (a) b) Z 7 42 42 0 -1 4194564 0";
        let fields = stat_fields(stat).unwrap();
        assert_eq!((fields.state, fields.ppid), (b'Z', 7));
        assert_eq!(fields.flags & PF_EXITING, PF_EXITING);
    }

    #[test]
    fn malformed_stat_lines() {
        for stat in [
            &b""[..],
            b"42 (sleep)",
            b"42 (sleep) ",
            b"42 (sleep) S",
            b"42 (sleep) S x 1 1 0 -1 0",
            b"42 (sleep) S 1 1 1 0 -1 -5",
            b"42 (sleep) S 99999999999 1 1 0 -1 0",
        ] {
            assert_eq!(
                stat_fields(stat),
                None,
                "{:?}",
                String::from_utf8_lossy(stat)
            );
        }
    }

    #[test]
    fn nspid_lines() {
        let status = b"Name:\tsleep\nState:\tD (disk sleep)\nNSpid:\t27241\t2\nThreads:\t1\n";
        assert_eq!(nspid(status), Some(vec![27241, 2]));
        assert_eq!(nspid(b"NSpid:\t1\n"), Some(vec![1]));
        assert_eq!(nspid(b"Name:\tsleep\n"), None);
        assert_eq!(nspid(b"NSpid:\t\n"), None);
        assert_eq!(nspid(b"NSpid:\t12 x\n"), None);
    }

    #[test]
    fn capability_lines() {
        let status = b"Name:\tx\nCapPrm:\t0000000000080004\nCapEff:\t0000000000080004\n";
        let caps = effective_capabilities(status).unwrap();
        assert_ne!(caps & (1 << CAP_SYS_PTRACE), 0);
        assert_eq!(effective_capabilities(b"CapEff:\t\n"), None);
        assert_eq!(effective_capabilities(b"CapEff:\tzz\n"), None);
        assert_eq!(effective_capabilities(b"Name:\tx\n"), None);
    }

    #[test]
    fn namespace_links() {
        assert_eq!(namespace_inode(b"pid:[4026531836]"), Some(4_026_531_836));
        assert_eq!(namespace_inode(b"pid:[]"), None);
        assert_eq!(namespace_inode(b"pid:[12]x"), None);
        assert_eq!(namespace_inode(b"pid:4026531836"), None);
    }

    #[test]
    fn passwd_lines() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\nbroken\n:x:7:7::/:\n";
        assert_eq!(passwd_user(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_user(passwd, 65534).as_deref(), Some("nobody"));
        assert_eq!(passwd_user(passwd, 7), None);
        assert_eq!(passwd_user(passwd, 1000), None);
    }
}
