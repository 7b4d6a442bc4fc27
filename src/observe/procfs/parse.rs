//! The `/proc` and `/etc` text formats read on every scrape, parsed by hand: pure and
//! total, so any bytes give an answer (and the fuzz targets in `fuzz/` can say so). One
//! parser per format, shared by every reader of it. The cgroup file has its own module,
//! `cgroup`; `/proc/stat`'s boot time, read once at start, and the exporter's own limits
//! file (`own_process`), which the kernel writes whole for it, go through procfs-core.
//!
//! procfs-core offers parsers of `stat`, `status` and `maps` too. Each was tried on the
//! inputs of this module's tests and timed against these on real inputs (a 2-core VM);
//! none can do this job:
//!
//! - `Stat` needs every field up to `cnswap` (37) where 9 are read here, panics on some
//!   malformed lines (`42 (sleep)` slices past the end, a line that starts with `(`
//!   overflows), and copies the line into a `String` before parsing every field: about
//!   3 times the time of [`stat`].
//! - `Status` fails unless some twenty lines are all there, and builds a map of every
//!   line: about 20 times the time of [`status`], which takes the three lines it uses
//!   where they are, each on its own.
//! - `MemoryMaps` fails the whole file on one line it cannot read (a path that is not
//!   UTF-8, which any process may map), panics on a mapping of a file whose name starts
//!   with `/SYSV` and is short (which any process may map too), and allocates every
//!   mapping's path: one odd mapping would hide a process's CUDA context, and a 3,000-line
//!   maps takes 4 to 6 times as long as with [`shared_mappings`].
//!
//! Namespace links, `/proc` directory names, device numbers and the password file have
//! no procfs-core parser.

/// `PF_EXITING` in `/proc/PID/stat`'s flags: the thread has begun to exit.
pub(crate) const PF_EXITING: u32 = 0x0000_0004;

/// `CAP_SYS_PTRACE`, the capability that lets a process read where another user's
/// descriptors point and what it maps.
pub(crate) const CAP_SYS_PTRACE: u32 = 19;

/// The character-device major number of NVIDIA's GPU and control nodes.
const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl` under [`NVIDIA_MAJOR`].
const NVIDIA_CONTROL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset` under [`NVIDIA_MAJOR`]; minors below it are GPUs.
const NVIDIA_MODESET_MINOR: u32 = 254;

/// The fields of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) the exporter uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Command name, as the kernel keeps it (at most 15 bytes; lossy UTF-8).
    pub comm: String,
    /// The one-letter state (`R`, `S`, `D`, `Z`, ...).
    pub state: u8,
    /// Parent PID.
    pub ppid: u32,
    /// Process group.
    pub pgrp: u32,
    /// Session.
    pub session: u32,
    /// The kernel's `PF_*` flags of the thread.
    pub flags: u32,
    /// Threads in the process.
    pub threads: u32,
    /// Start time in clock ticks after boot: with the PID, the process's identity.
    pub start_time_ticks: u64,
}

/// Reads a stat line. The command name in parentheses may itself contain `) ` and
/// spaces, so the name ends at the last `) ` and the fields start after it.
pub fn stat(line: &[u8]) -> Option<Stat> {
    let (name, mut fields) = stat_fields(line)?;
    let comm = String::from_utf8_lossy(name).into_owned();
    let state = *fields.next()?.first()?;
    let ppid = small(fields.next()?)?;
    let pgrp = group(fields.next()?)?;
    let session = group(fields.next()?)?;
    // tty_nr, tpgid, then flags (field 9).
    let flags = small(fields.nth(2)?)?;
    // minflt .. itrealvalue lie between flags and num_threads (field 20).
    let threads = small(fields.nth(10)?)?;
    // itrealvalue, then starttime (field 22).
    let start_time_ticks = number(fields.nth(1)?)?;
    Some(Stat {
        comm,
        state,
        ppid,
        pgrp,
        session,
        flags,
        threads,
        start_time_ticks,
    })
}

/// A stat line's command name, and its fields from the state (field 3) on.
fn stat_fields(line: &[u8]) -> Option<(&[u8], impl Iterator<Item = &[u8]>)> {
    let open = line.iter().position(|&byte| byte == b'(')?;
    let close = line.windows(2).rposition(|pair| pair == b") ")?;
    if close < open {
        return None;
    }
    let fields = line[close + 2..].split(|&byte| byte == b' ');
    Some((&line[open + 1..close], fields))
}

/// What a process has used, from its stat line: the `process_*` series of the
/// exporter's own process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in user mode, in clock ticks (field 14).
    pub user_ticks: u64,
    /// CPU time in kernel mode, in clock ticks (field 15).
    pub system_ticks: u64,
    /// Start time in clock ticks after boot (field 22).
    pub start_time_ticks: u64,
    /// Virtual memory, in bytes (field 23).
    pub virtual_bytes: u64,
    /// Resident memory, in pages (field 24).
    pub resident_pages: u64,
}

/// Reads what a process has used from its stat line.
pub fn stat_usage(line: &[u8]) -> Option<Usage> {
    let (_, mut fields) = stat_fields(line)?;
    // The state (field 3) first: utime is 11 fields after it.
    let user_ticks = number(fields.nth(11)?)?;
    let system_ticks = number(fields.next()?)?;
    // cutime .. itrealvalue, then starttime (field 22).
    let start_time_ticks = number(fields.nth(6)?)?;
    Some(Usage {
        user_ticks,
        system_ticks,
        start_time_ticks,
        virtual_bytes: number(fields.next()?)?,
        resident_pages: number(fields.next()?)?,
    })
}

/// The lines of `/proc/PID/status` the exporter uses; each is `None` when missing or
/// malformed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Real user id (`Uid:`'s first field).
    pub uid: Option<u32>,
    /// The PID in each PID namespace from the one the procfs belongs to down to the
    /// process's own (`NSpid:`, kernels since 4.1); never empty when present.
    pub nspid: Option<Vec<u32>>,
    /// Effective capability set (`CapEff:`, hexadecimal).
    pub effective_capabilities: Option<u64>,
    /// Signals pending for the main thread (`SigPnd:`) or the whole process (`ShdPnd:`),
    /// hexadecimal masks OR-ed together; `None` when neither line is there.
    pub pending_signals: Option<u64>,
}

impl Status {
    /// Whether SIGKILL is pending: the process was killed, and the kill waits to be
    /// delivered (a process in uninterruptible sleep takes it only when it wakes).
    pub fn kill_pending(&self) -> bool {
        const SIGKILL: u32 = 9;
        self.pending_signals
            .is_some_and(|mask| mask & (1 << (SIGKILL - 1)) != 0)
    }
}

/// Reads the lines of a status file the exporter uses.
pub fn status(text: &[u8]) -> Status {
    let mut status = Status::default();
    for line in text.split(|&byte| byte == b'\n') {
        if let Some(rest) = line.strip_prefix(b"Uid:") {
            status.uid = words(rest).next().and_then(small);
        } else if let Some(rest) = line.strip_prefix(b"NSpid:") {
            let pids: Option<Vec<u32>> = words(rest).map(small).collect();
            status.nspid = pids.filter(|pids| !pids.is_empty());
        } else if let Some(rest) = line.strip_prefix(b"CapEff:") {
            status.effective_capabilities = hexadecimal(rest);
        } else if let Some(rest) = line
            .strip_prefix(b"SigPnd:")
            .or_else(|| line.strip_prefix(b"ShdPnd:"))
        {
            if let Some(mask) = hexadecimal(rest) {
                status.pending_signals = Some(status.pending_signals.unwrap_or(0) | mask);
            }
        }
    }
    status
}

/// A status line's hexadecimal mask (`CapEff:`, `SigPnd:`), at most 64 bits.
fn hexadecimal(rest: &[u8]) -> Option<u64> {
    std::str::from_utf8(rest)
        .ok()
        .map(str::trim)
        .filter(|digits| !digits.is_empty() && digits.len() <= 16)
        .and_then(|digits| u64::from_str_radix(digits, 16).ok())
}

/// Whether a command line (`/proc/PID/cmdline`, NUL-separated) is that of a worker a
/// parent process spawned and talks to: Python's `multiprocessing` (and so
/// `torch.multiprocessing`, vLLM's engine core, SGLang's schedulers) starts each child
/// as `python -c 'from multiprocessing.spawn import spawn_main; ...' --multiprocessing-fork`,
/// or through its fork server. Such a process is never meant to run without its parent.
pub fn spawned_worker(cmdline: &[u8]) -> bool {
    cmdline.split(|&byte| byte == 0).any(|argument| {
        argument == b"--multiprocessing-fork"
            || argument.starts_with(b"from multiprocessing.spawn import spawn_main")
            || argument.starts_with(b"from multiprocessing.forkserver import main")
    })
}

/// The inode of the pipe a descriptor's link names (`pipe:[12345]`).
pub fn pipe_inode(link: &[u8]) -> Option<u64> {
    let inode = link.strip_prefix(b"pipe:[")?.strip_suffix(b"]")?;
    std::str::from_utf8(inode).ok()?.parse().ok()
}

/// How a descriptor was opened, from its `fdinfo` (`flags:` in octal): `Some(true)` for
/// reading only, `Some(false)` for writing only, `None` for both or when unreadable.
pub fn opened_for_reading(fdinfo: &[u8]) -> Option<bool> {
    let flags = fdinfo.split(|&byte| byte == b'\n').find_map(|line| {
        let value = line.strip_prefix(b"flags:")?;
        u32::from_str_radix(std::str::from_utf8(value).ok()?.trim(), 8).ok()
    })?;
    match flags & 0o3 {
        0 => Some(true),
        1 => Some(false),
        _ => None,
    }
}

/// What kind of NVIDIA device file a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NvidiaNode {
    /// `/dev/nvidia<minor>`: one GPU, whose contexts map it.
    Gpu(u32),
    /// `/dev/nvidiactl`, shared by every client of the driver.
    Control,
    /// `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`.
    Uvm,
    /// `/dev/nvidia-caps/nvidia-cap<minor>`: a capability, such as access to a MIG instance.
    Capability(u32),
    /// Any other `/dev/nvidia*` node (modeset, NVSwitch, ...).
    Other,
}

/// The node a path names, when it starts with the NVIDIA device prefix (`/dev/nvidia`
/// outside tests). Compared as bytes: `Path::starts_with` compares whole components and
/// would miss `/dev/nvidia0`.
pub fn nvidia_node(path: &[u8], prefix: &[u8]) -> Option<NvidiaNode> {
    let rest = path.strip_prefix(prefix)?;
    Some(if let Some(minor) = small(rest) {
        NvidiaNode::Gpu(minor)
    } else if rest == b"ctl" {
        NvidiaNode::Control
    } else if rest == b"-uvm" || rest == b"-uvm-tools" {
        NvidiaNode::Uvm
    } else if let Some(minor) = rest.strip_prefix(b"-caps/nvidia-cap").and_then(small) {
        NvidiaNode::Capability(minor)
    } else {
        NvidiaNode::Other
    })
}

/// The node a character device's numbers name, when they are NVIDIA's GPU or control
/// numbers; names can lie (a container may show GPU 3 as `/dev/nvidia0`), numbers cannot.
pub(crate) fn nvidia_node_by_number(major: u32, minor: u32) -> Option<NvidiaNode> {
    (major == NVIDIA_MAJOR).then_some(match minor {
        NVIDIA_CONTROL_MINOR => NvidiaNode::Control,
        NVIDIA_MODESET_MINOR => NvidiaNode::Other,
        minor => NvidiaNode::Gpu(minor),
    })
}

/// Major and minor number of a Linux `dev_t` (glibc's encoding).
pub(crate) fn device_numbers(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// One shared mapping of a file, from a line of `/proc/PID/maps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMapping<'a> {
    /// Major and minor number of the device holding the file's inode.
    pub device: (u32, u32),
    /// The file's inode.
    pub inode: u64,
    /// The path as the process sees it (may end in ` (deleted)`).
    pub path: &'a [u8],
    /// The mapping may be read (`r` in the permissions).
    pub read: bool,
    /// The mapping may be written (`w` in the permissions).
    pub write: bool,
}

/// The shared file mappings (`s` in the permissions) of a maps file: a CUDA context,
/// own or inherited by fork, is shared mappings of the GPU's node and `/dev/nvidiactl`,
/// read-write ones among them (`rw-s`); a process that initialised the driver without a
/// context (the MPS control daemon, measured on an H200) maps the GPU's node write-only
/// (`-w-s`) and the control node read-only (`r--s`).
pub fn shared_mappings(maps: &[u8]) -> impl Iterator<Item = SharedMapping<'_>> {
    maps.split(|&byte| byte == b'\n').filter_map(|line| {
        let mut fields = line.splitn(6, |&byte| byte == b' ');
        let _range = fields.next()?;
        let permissions = fields.next()?;
        if permissions.get(3) != Some(&b's') {
            return None;
        }
        let read = permissions[0] == b'r';
        let write = permissions[1] == b'w';
        let _offset = fields.next()?;
        let (major, minor) = std::str::from_utf8(fields.next()?).ok()?.split_once(':')?;
        let device = (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        );
        let inode = number(fields.next()?)?;
        let path = trim_start(fields.next()?);
        (inode != 0 && !path.is_empty()).then_some(SharedMapping {
            device,
            inode,
            path,
            read,
            write,
        })
    })
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

/// A PID as a directory name of `/proc`, or `None` for the other entries.
pub(crate) fn pid_name(name: &[u8]) -> Option<u32> {
    small(name).filter(|&pid| pid != 0)
}

/// The whitespace-separated words of a line.
fn words(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|byte| byte.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&byte| byte != b' ')
        .unwrap_or(bytes.len());
    &bytes[start..]
}

/// A decimal number of ASCII digits only (no sign, no spaces), or `None`.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// A decimal number that fits 32 bits.
fn small(digits: &[u8]) -> Option<u32> {
    number(digits).and_then(|value| u32::try_from(value).ok())
}

/// A process group or session id; a dead process (state X, being reaped) shows -1 for
/// both, read as 0, which no user process has.
fn group(digits: &[u8]) -> Option<u32> {
    if digits == b"-1" {
        Some(0)
    } else {
        small(digits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line of a sleeping `sleep` (kernel 6.18).
    const SLEEP: &[u8] = b"27240 (sleep) S 27238 27234 24780 0 -1 4195340 101 0 0 0 0 0 0 0 20 0 1 0 6186 2490368 236 18446744073709551615";

    #[test]
    fn stat_of_a_sleeping_process() {
        assert_eq!(
            stat(SLEEP),
            Some(Stat {
                comm: "sleep".into(),
                state: b'S',
                ppid: 27238,
                pgrp: 27234,
                session: 24780,
                flags: 4_195_340,
                threads: 1,
                start_time_ticks: 6186,
            })
        );
        // 4195340 = 0x40060C: this PID 1 of a namespace was in its exit path.
        assert_ne!(stat(SLEEP).unwrap().flags & PF_EXITING, 0);
    }

    #[test]
    fn stat_with_a_command_name_that_looks_like_the_end() {
        let line = b"42 (a) b) Z 7 42 42 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 3 0 99 0";
        let fields = stat(line).unwrap();
        assert_eq!(fields.comm, "a) b");
        assert_eq!((fields.state, fields.ppid, fields.threads), (b'Z', 7, 3));
        assert_eq!(fields.start_time_ticks, 99);
        assert_eq!(fields.flags & PF_EXITING, PF_EXITING);
    }

    #[test]
    fn stat_of_a_process_being_reaped() {
        // Read while its parent reaped it: dead, in no process group or session.
        let line = b"9707 (sleep) X 0 -1 -1 0 -1 4227084 139 0 0 0 0 0 0 0 20 0 0 0 918943 0 0";
        let fields = stat(line).unwrap();
        assert_eq!(fields.state, b'X');
        assert_eq!((fields.ppid, fields.pgrp, fields.session), (0, 0, 0));
        assert_eq!(fields.start_time_ticks, 918_943);
    }

    #[test]
    fn malformed_stat_lines() {
        for line in [
            &b""[..],
            b"42 (sleep)",
            b"42 (sleep) ",
            b"42 (sleep) S",
            b"42 (sleep) S 1 1 1 0 -1 0",
            b"42 (sleep) S x 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 6186",
            b"42 (sleep) S 1 -2 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 6186",
            b"42 (sleep) S 1 1 1 0 -1 -5 0 0 0 0 0 0 0 0 20 0 1 0 6186",
            b"42 (sleep) S 99999999999 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 6186",
            b"42 (sleep) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -6186",
            b"42 ) (sleep S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 6186",
        ] {
            assert_eq!(stat(line), None, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn status_lines() {
        let text = b"Name:\tsleep\nState:\tD (disk sleep)\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t27241\t2\nThreads:\t1\nCapEff:\t0000000000080004\n";
        let parsed = status(text);
        assert_eq!(parsed.uid, Some(1000));
        assert_eq!(parsed.nspid, Some(vec![27241, 2]));
        assert_ne!(
            parsed.effective_capabilities.unwrap() & (1 << CAP_SYS_PTRACE),
            0
        );
        assert_eq!(status(b"Name:\tsleep\n"), Status::default());
        let broken = status(b"NSpid:\t12 x\nUid:\t\nCapEff:\tzz\n");
        assert_eq!(broken, Status::default());
        assert_eq!(status(b"NSpid:\t\n").nspid, None);
        assert!(!status(b"SigPnd:\tzz\n").kill_pending());
    }

    #[test]
    fn a_pending_kill_is_read_from_either_pending_set() {
        // SIGKILL is signal 9: bit 8 of the mask. A kill(2) of the process pends in the
        // shared set; the kernel also marks each thread's own set when it delivers one.
        let shared = status(b"SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n");
        assert!(shared.kill_pending());
        let own = status(b"SigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n");
        assert!(own.kill_pending());
        // SIGTERM (15, bit 14) pending is not a kill.
        let term = status(b"SigPnd:\t0000000000004000\nShdPnd:\t0000000000000000\n");
        assert!(!term.kill_pending());
        assert_eq!(term.pending_signals, Some(0x4000));
    }

    #[test]
    fn spawned_workers_by_their_command_line() {
        // What Python 3.12's multiprocessing (spawn) gives its children.
        let spawn = b"/usr/bin/python3\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)\0--multiprocessing-fork\0";
        assert!(spawned_worker(spawn));
        let forkserver =
            b"python3\0-c\0from multiprocessing.forkserver import main; main(8, 9, ['__main__'], **{})\0";
        assert!(spawned_worker(forkserver));
        // A server, and a program that only mentions the words.
        assert!(!spawned_worker(
            b"python3\0-m\0vllm.entrypoints.openai.api_server\0"
        ));
        assert!(!spawned_worker(b"grep\0--multiprocessing-forkx\0"));
        assert!(!spawned_worker(b""));
    }

    #[test]
    fn a_pipe_and_the_way_it_was_opened() {
        assert_eq!(pipe_inode(b"pipe:[28606]"), Some(28606));
        assert_eq!(pipe_inode(b"socket:[28606]"), None);
        assert_eq!(pipe_inode(b"pipe:[]"), None);
        assert_eq!(pipe_inode(b"/dev/nvidia0"), None);
        // As Linux 6.x shows a pipe's ends (O_RDONLY, O_WRONLY, with O_LARGEFILE beside).
        let fdinfo = |flags: &str| format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t15\nino:\t28606\n");
        assert_eq!(opened_for_reading(fdinfo("0100000").as_bytes()), Some(true));
        assert_eq!(
            opened_for_reading(fdinfo("0100001").as_bytes()),
            Some(false)
        );
        assert_eq!(opened_for_reading(fdinfo("02").as_bytes()), None);
        assert_eq!(opened_for_reading(b"pos:\t0\n"), None);
    }

    #[test]
    fn nvidia_nodes_by_name() {
        let prefix = b"/dev/nvidia";
        for (path, node) in [
            (&b"/dev/nvidia0"[..], Some(NvidiaNode::Gpu(0))),
            (b"/dev/nvidia13", Some(NvidiaNode::Gpu(13))),
            (b"/dev/nvidiactl", Some(NvidiaNode::Control)),
            (b"/dev/nvidia-uvm", Some(NvidiaNode::Uvm)),
            (b"/dev/nvidia-uvm-tools", Some(NvidiaNode::Uvm)),
            (
                b"/dev/nvidia-caps/nvidia-cap2",
                Some(NvidiaNode::Capability(2)),
            ),
            (b"/dev/nvidia-modeset", Some(NvidiaNode::Other)),
            (b"/dev/nvidia0 (deleted)", Some(NvidiaNode::Other)),
            (b"/dev/null", None),
            (b"/dev/nvidi", None),
        ] {
            assert_eq!(
                nvidia_node(path, prefix),
                node,
                "{}",
                String::from_utf8_lossy(path)
            );
        }
    }

    #[test]
    fn nvidia_nodes_by_number() {
        assert_eq!(nvidia_node_by_number(195, 3), Some(NvidiaNode::Gpu(3)));
        assert_eq!(nvidia_node_by_number(195, 255), Some(NvidiaNode::Control));
        assert_eq!(nvidia_node_by_number(195, 254), Some(NvidiaNode::Other));
        assert_eq!(nvidia_node_by_number(1, 3), None);
        // /dev/nvidia3 is char 195:3; /dev/null is 1:3; a large minor splits across bits.
        assert_eq!(device_numbers(0xc303), (195, 3));
        assert_eq!(device_numbers(0x103), (1, 3));
        // glibc's makedev for a major and a minor beyond 8 and 12 bits.
        let (major, minor) = (0x1234_u64, 0x5_6789_u64);
        let dev = ((major & 0xfff) << 8)
            | ((major & !0xfff) << 32)
            | (minor & 0xff)
            | ((minor & !0xff) << 12);
        assert_eq!(device_numbers(dev), (0x1234, 0x5_6789));
    }

    #[test]
    fn shared_mappings_of_a_cuda_process() {
        // Lines as a PyTorch process on an H200 shows them, with a private library mapping.
        let maps = b"7f10a0000000-7f10a0200000 rw-s 00000000 00:05 1065                       /dev/nvidiactl\n\
7f10a4000000-7f10a4001000 -w-s 00000000 00:05 1071                       /dev/nvidia0\n\
7f10b0000000-7f10b0021000 r-xp 00000000 fe:01 393300                     /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7f10b8000000-7f10b8200000 rw-s 00000000 00:01 5                          /dev/zero (deleted)\n\
7f10c0000000-7f10c0001000 rw-p 00000000 00:00 0 \n\
garbage\n";
        let shared: Vec<_> = shared_mappings(maps).collect();
        assert_eq!(shared.len(), 3);
        assert_eq!(shared[0].path, b"/dev/nvidiactl");
        assert_eq!((shared[1].device, shared[1].inode), ((0, 5), 1071));
        assert_eq!(shared[2].path, b"/dev/zero (deleted)");
        // rw-s, -w-s, rw-s.
        let access: Vec<(bool, bool)> = shared.iter().map(|m| (m.read, m.write)).collect();
        assert_eq!(access, [(true, true), (false, true), (true, true)]);
    }

    #[test]
    fn odd_mappings_beside_a_context_hide_nothing() {
        // Any process may map a file whose name is not UTF-8, or a short `/SYSV` name
        // (procfs-core's `MemoryMaps` fails the whole file on the one and panics on the
        // other): the GPU mapping after them is still found, and so are they.
        let maps = b"7f0000000000-7f0000001000 rw-s 00000000 00:05 77 /tmp/\xff\xfe-shard\n\
7f0000001000-7f0000002000 rw-s 00000000 00:01 6 /SYSV\n\
7f0000002000-7f0000003000 rw-s 00000000 00:05 1071 /dev/nvidia3\n";
        let paths: Vec<&[u8]> = shared_mappings(maps).map(|m| m.path).collect();
        assert_eq!(
            paths,
            [&b"/tmp/\xff\xfe-shard"[..], b"/SYSV", b"/dev/nvidia3"]
        );
        assert_eq!(
            nvidia_node(paths[2], b"/dev/nvidia"),
            Some(NvidiaNode::Gpu(3))
        );
    }

    #[test]
    fn the_access_of_the_mps_control_daemons_mappings() {
        // The MPS control daemon on the H200: GPU 0's node write-only, nvidiactl read-only.
        let maps = b"7f3c28000000-7f3c28001000 -w-s 00000000 00:05 1071                       /dev/nvidia0\n\
7f3c28200000-7f3c28201000 -w-s 00000000 00:05 1071                       /dev/nvidia0\n\
7f3c28400000-7f3c28401000 r--s 00000000 00:05 1065                       /dev/nvidiactl\n\
7f3c28600000-7f3c28601000 ---s 00000000 00:05 1065                       /dev/nvidiactl\n";
        let access: Vec<(&[u8], bool, bool)> = shared_mappings(maps)
            .map(|m| (m.path, m.read, m.write))
            .collect();
        assert_eq!(
            access,
            [
                (&b"/dev/nvidia0"[..], false, true),
                (&b"/dev/nvidia0"[..], false, true),
                (&b"/dev/nvidiactl"[..], true, false),
                (&b"/dev/nvidiactl"[..], false, false),
            ]
        );
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

    #[test]
    fn pid_directory_names() {
        assert_eq!(pid_name(b"4242"), Some(4242));
        assert_eq!(pid_name(b"self"), None);
        assert_eq!(pid_name(b"0"), None);
        assert_eq!(pid_name(b"-1"), None);
    }
}
