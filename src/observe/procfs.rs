//! What `/proc` says about processes: the facts of listed owners, and our own PID namespace.

use super::cgroup::{parse_cgroup_file, CgroupAttribution, MAX_CGROUP_FILE_BYTES};
use super::{DeviceFiles, ProcessFacts, ProcessLookup};
use procfs::process::Process;
use procfs::ProcError;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The inode of the initial PID namespace, fixed by the kernel (`PROC_PID_INIT_INO`).
const HOST_PID_NAMESPACE: &str = "pid:[4026531836]";

/// The device-node prefix NVIDIA's driver uses; only tests point it elsewhere.
pub const DEVICE_PREFIX: &[u8] = b"/dev/nvidia";

/// Where to read processes from.
#[derive(Debug, Clone)]
pub struct ProcRoot {
    /// The procfs mount (`/proc` on a host, `/host/proc` in a container).
    pub root: PathBuf,
    /// Byte prefix of NVIDIA device paths; compared as bytes because `Path::starts_with`
    /// compares whole components and would miss `/dev/nvidia0`.
    pub device_prefix: Vec<u8>,
}

impl ProcRoot {
    /// The process directory of `pid`.
    pub fn pid_dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// Whether we run in the host's PID namespace; `None` when it cannot be read.
    pub fn host_pid_namespace(&self) -> Option<bool> {
        let link = fs::read_link(self.root.join("self/ns/pid")).ok()?;
        Some(link.as_os_str() == HOST_PID_NAMESPACE)
    }

    /// The facts about one PID, plus how many entries could not be read.
    pub fn lookup(&self, pid: u32) -> (ProcessLookup, u64) {
        let process = match Process::new_with_root(self.pid_dir(pid)) {
            Ok(process) => process,
            Err(error) => return lookup_error(error),
        };
        let stat = match process.stat() {
            Ok(stat) => stat,
            Err(error) => return lookup_error(error),
        };
        let mut errors = 0;
        let uid = match process.uid() {
            Ok(uid) => Some(uid),
            // It exited between the two reads: it is gone, not unreadable.
            Err(ProcError::NotFound(_)) => return (ProcessLookup::Missing, 0),
            Err(_) => {
                errors += 1;
                None
            }
        };
        let device_files = self.device_files(pid, stat.state);
        if device_files == DeviceFiles::Unreadable {
            errors += 1;
        }
        let facts = ProcessFacts {
            comm: stat.comm,
            state: stat.state,
            ppid: u32::try_from(stat.ppid).unwrap_or(0),
            start_time_ticks: stat.starttime,
            uid,
            device_files,
            cgroup: self.cgroup(pid),
            // Filled in for all owners at once (see `LiveHost::observe`).
            pid_namespace_init: None,
        };
        (ProcessLookup::Present(facts), errors)
    }

    /// The container and pod `pid`'s cgroup names; nothing when its cgroup file cannot be
    /// read (every user may read it, so only a process that exited cannot).
    pub fn cgroup(&self, pid: u32) -> CgroupAttribution {
        let mut content = Vec::new();
        let read = fs::File::open(self.pid_dir(pid).join("cgroup")).and_then(|file| {
            file.take(MAX_CGROUP_FILE_BYTES as u64)
                .read_to_end(&mut content)
        });
        match read {
            Ok(_) => parse_cgroup_file(&content),
            Err(_) => CgroupAttribution::default(),
        }
    }

    /// Whether any thread of `pid` holds an NVIDIA device file.
    pub fn device_files(&self, pid: u32, state: char) -> DeviceFiles {
        let dir = self.pid_dir(pid);
        match self.fd_dir_holds_device(&dir.join("fd")) {
            Ok(true) => return DeviceFiles::Held,
            Ok(false) if state != 'Z' => return DeviceFiles::NotHeld,
            Ok(false) => {}
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                return DeviceFiles::Unreadable
            }
            // Gone between two reads: it holds nothing now.
            Err(_) => return DeviceFiles::NotHeld,
        }
        // A zombie main thread's fd list is empty while its other threads live on with
        // the descriptors; only their own lists show them.
        let Ok(tasks) = fs::read_dir(dir.join("task")) else {
            return DeviceFiles::NotHeld;
        };
        let mut denied = false;
        for task in tasks.flatten() {
            match self.fd_dir_holds_device(&task.path().join("fd")) {
                Ok(true) => return DeviceFiles::Held,
                Ok(false) => {}
                Err(error) => denied |= error.kind() == io::ErrorKind::PermissionDenied,
            }
        }
        if denied {
            DeviceFiles::Unreadable
        } else {
            DeviceFiles::NotHeld
        }
    }

    fn fd_dir_holds_device(&self, fd_dir: &Path) -> io::Result<bool> {
        for entry in fs::read_dir(fd_dir)? {
            let Ok(entry) = entry else { continue };
            match fs::read_link(entry.path()) {
                Ok(target)
                    if target
                        .as_os_str()
                        .as_bytes()
                        .starts_with(&self.device_prefix) =>
                {
                    return Ok(true)
                }
                Ok(_) => {}
                // A listing we may read with links we may not (CAP_DAC_READ_SEARCH
                // without CAP_SYS_PTRACE) is unreadable, not empty.
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => return Err(error),
                // Closed since the listing.
                Err(_) => {}
            }
        }
        Ok(false)
    }
}

/// Maps a procfs error to a lookup: absence only when the kernel says so.
fn lookup_error(error: ProcError) -> (ProcessLookup, u64) {
    match error {
        ProcError::NotFound(_) => (ProcessLookup::Missing, 0),
        other => (
            ProcessLookup::Unreadable {
                error: other.to_string(),
            },
            1,
        ),
    }
}
