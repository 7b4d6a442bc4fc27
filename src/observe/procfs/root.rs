//! Where processes are read from: the procfs mount, what it says about the host and the
//! exporter's own PID namespace, and the small files of a process directory that are
//! read whole (stat, status, cgroup, the PID namespace link).

use super::cgroup::{parse_cgroup_file, CgroupAttribution, MAX_CGROUP_FILE_BYTES};
use super::parse::{self, Stat, Status};
use procfs_core::{ExplicitSystemInfo, FromBufReadSI, KernelStats};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The inode of the initial PID namespace, fixed by the kernel (`PROC_PID_INIT_INO`).
const HOST_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Bytes of a stat line read at once; a longer line (fields of 20 digits) is read whole.
const STAT_LINE_BYTES: usize = 1024;

/// The device-node prefix NVIDIA's driver uses; only tests point it elsewhere.
pub const DEVICE_PREFIX: &[u8] = b"/dev/nvidia";

/// Where to read processes from.
#[derive(Debug, Clone)]
pub struct ProcRoot {
    /// The procfs mount (`/proc` on a host, `/host/proc` in a container).
    pub root: PathBuf,
    /// Byte prefix of NVIDIA device paths (see [`parse::nvidia_node`]).
    pub device_prefix: Vec<u8>,
    /// A tree of files standing in for a procfs (tests): without a `self` entry it shows
    /// the exporter's own PID namespace, where a real procfs without one shows another.
    pub stand_in: bool,
}

/// `PROC_SUPER_MAGIC`: the file system type of every procfs mount (`statfs(2)`).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Why a path cannot be read as a procfs.
#[derive(Debug, thiserror::Error)]
pub enum NotProcfs {
    /// It cannot be looked at: missing, or not ours to see.
    #[error("--path.procfs {path}: {error}; point it at the host's /proc (mounted at /host/proc in a container)", path = path.display())]
    Unreadable {
        /// The path.
        path: PathBuf,
        /// Why, said in the line itself (one line, each cause once).
        error: io::Error,
    },
    /// It is a directory of another file system.
    #[error("--path.procfs {path} is not a procfs (file system type {kind:#x}); point it at the host's /proc (mounted at /host/proc in a container)", path = path.display())]
    OtherFileSystem {
        /// The path.
        path: PathBuf,
        /// The file system type `statfs` gives.
        kind: i64,
    },
}

/// Which PID namespace the exporter runs in, as `{procfs}/self/ns/pid` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidNamespace {
    /// The host's (initial) PID namespace: NVML lists the processes of every namespace.
    Host,
    /// Another one (a container without `hostPID`): NVML hides the processes of others.
    Other,
    /// The link cannot be read: which, the exporter cannot tell.
    Unreadable,
}

impl PidNamespace {
    /// As an observation records it: whether it is the host's, `None` when unreadable.
    pub(crate) fn is_host(self) -> Option<bool> {
        match self {
            PidNamespace::Host => Some(true),
            PidNamespace::Other => Some(false),
            PidNamespace::Unreadable => None,
        }
    }
}

/// Why a process could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unread {
    /// It does not exist (or exited while it was read).
    Missing,
    /// It exists but its entry could not be read; the error in one line.
    Unreadable(String),
}

impl Unread {
    /// Absence only when the kernel says so.
    pub(super) fn from_error(error: io::Error) -> Unread {
        if gone(&error) {
            Unread::Missing
        } else {
            Unread::Unreadable(error.to_string())
        }
    }
}

/// Whether an error says the process is gone: its entry vanished, or it exited between
/// the open and the read of a file (`ESRCH`).
pub(super) fn gone(error: &io::Error) -> bool {
    const ESRCH: i32 = 3;
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(ESRCH)
}

impl ProcRoot {
    /// Whether the root is a procfs mount at all: a path that is missing or of another
    /// file system (a container missing its `/host/proc` mount, a typo) shows no process,
    /// and every owner NVML names would look exited. A stand-in passes.
    pub fn check_is_procfs(&self) -> Result<(), NotProcfs> {
        use std::os::unix::ffi::OsStrExt;
        if self.stand_in {
            return Ok(());
        }
        let unreadable = |error| NotProcfs::Unreadable {
            path: self.root.clone(),
            error,
        };
        let path = std::ffi::CString::new(self.root.as_os_str().as_bytes())
            .map_err(|error| unreadable(io::Error::new(io::ErrorKind::InvalidInput, error)))?;
        // SAFETY: statfs reads the NUL-terminated path we own and writes into the zeroed
        // struct we own.
        let mut found: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(path.as_ptr(), &mut found) } != 0 {
            return Err(unreadable(io::Error::last_os_error()));
        }
        let kind = found.f_type as i64;
        if kind != PROC_SUPER_MAGIC {
            return Err(NotProcfs::OtherFileSystem {
                path: self.root.clone(),
                kind,
            });
        }
        Ok(())
    }

    /// The process directory of `pid`.
    pub(super) fn pid_dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// Every PID the procfs lists: the one walk over processes.
    /// Every PID of the procfs with the inode of its directory, as the listing gives it
    /// (`None` where the kernel could not say): which process it is, while it lives.
    pub(super) fn pids_and_directories(&self) -> io::Result<Vec<(u32, Option<u64>)>> {
        use std::os::unix::fs::DirEntryExt;
        Ok(fs::read_dir(&self.root)?
            .flatten()
            .filter_map(|entry| {
                let pid = parse::pid_name(entry.file_name().as_bytes())?;
                // The kernel says 1 for an entry it could not instantiate.
                let inode = entry.ino();
                Some((pid, (inode > 1).then_some(inode)))
            })
            .collect())
    }

    pub(super) fn pids(&self) -> io::Result<Vec<u32>> {
        Ok(fs::read_dir(&self.root)?
            .flatten()
            .filter_map(|entry| parse::pid_name(entry.file_name().as_bytes()))
            .collect())
    }

    /// The PID the procfs gives the process reading it (`{procfs}/self`): ours in our
    /// namespace, another number when the procfs belongs to another PID namespace.
    pub(super) fn self_pid(&self) -> Option<u32> {
        let link = fs::read_link(self.root.join("self")).ok()?;
        parse::pid_name(link.as_os_str().as_bytes())
    }

    /// Which PID namespace we run in. A process never changes its PID namespace, so the
    /// first answer read through a procfs holds for as long as we run: every scrape asks,
    /// and only the first reads the link (while it cannot be read, each asks again).
    pub(crate) fn own_pid_namespace(&self) -> PidNamespace {
        static READ: OnceLock<(PathBuf, PidNamespace)> = OnceLock::new();
        if let Some((root, namespace)) = READ.get() {
            if *root == self.root {
                return *namespace;
            }
        }
        let namespace = match fs::read_link(self.root.join("self/ns/pid")) {
            Ok(link) if link.as_os_str() == HOST_PID_NAMESPACE => PidNamespace::Host,
            Ok(_) => PidNamespace::Other,
            Err(_) => return PidNamespace::Unreadable,
        };
        let _ = READ.set((self.root.clone(), namespace));
        namespace
    }

    /// When the host booted, in seconds since the Unix epoch (`btime` of `/proc/stat`).
    pub(crate) fn boot_time(&self) -> Option<u64> {
        boot_time(&fs::read(self.root.join("stat")).ok()?)
    }

    /// The host's name, as the kernel knows it.
    pub(crate) fn hostname(&self) -> Option<String> {
        let name = fs::read_to_string(self.root.join("sys/kernel/hostname")).ok()?;
        Some(name.trim().to_string()).filter(|name| !name.is_empty())
    }

    /// The stat line of a process or thread directory, in one `read` where it fits the
    /// buffer (the kernel writes the whole line at the first read): three system calls
    /// instead of the five of reading a file of unknown size to its end.
    pub(super) fn stat(&self, dir: &Path) -> io::Result<Stat> {
        let path = dir.join("stat");
        let mut line = [0u8; STAT_LINE_BYTES];
        let length = fs::File::open(&path)?.read(&mut line)?;
        if length == line.len() {
            return parse::stat(&fs::read(&path)?).ok_or_else(malformed);
        }
        parse::stat(&line[..length]).ok_or_else(malformed)
    }

    /// The status file of a process or thread directory.
    pub(super) fn status(&self, dir: &Path) -> io::Result<Status> {
        Ok(parse::status(&fs::read(dir.join("status"))?))
    }

    /// The inode of the PID namespace of the process whose directory is `dir`; reading
    /// another user's needs CAP_SYS_PTRACE.
    pub(super) fn pid_namespace(&self, dir: &Path) -> Option<u64> {
        let link = fs::read_link(dir.join("ns/pid")).ok()?;
        parse::namespace_inode(link.as_os_str().as_bytes())
    }

    /// The container and pod `dir`'s cgroup names; nothing when its cgroup file cannot be
    /// read (every user may read it, so only a process that exited cannot).
    pub(super) fn cgroup(&self, dir: &Path) -> CgroupAttribution {
        let mut content = Vec::new();
        let read = fs::File::open(dir.join("cgroup")).and_then(|file| {
            file.take(MAX_CGROUP_FILE_BYTES as u64)
                .read_to_end(&mut content)
        });
        match read {
            Ok(_) => parse_cgroup_file(&content),
            Err(_) => CgroupAttribution::default(),
        }
    }
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed stat line")
}

/// The boot time (`btime`, seconds since the Unix epoch) of a `/proc/stat`, through
/// procfs-core's parser: read once at start, off every scrape's path, from a file the
/// kernel always writes whole.
fn boot_time(proc_stat: &[u8]) -> Option<u64> {
    // The parser wants the system's figures to turn the CPU lines' ticks into times;
    // only `btime` is used here, which is in seconds, so they do not matter.
    let system = ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    KernelStats::from_buf_read(proc_stat, &system)
        .ok()
        .map(|stats| stats.btime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_line() {
        // The lines procfs-core needs (the CPU totals, ctxt, btime and processes), as a
        // kernel writes them.
        let text = b"cpu  1 2 3 4 5 6 7 0 0 0\ncpu0 1 2 3 4 5 6 7 0 0 0\nintr 5\nctxt 88\nbtime 1764754262\nprocesses 9\nprocs_running 1\nprocs_blocked 0\n";
        assert_eq!(boot_time(text), Some(1_764_754_262));
        assert_eq!(boot_time(b"btime x\n"), None);
    }
}
