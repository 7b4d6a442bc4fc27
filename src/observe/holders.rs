//! The scan of every process's descriptors for NVIDIA device files: it finds the live
//! process that keeps a dead owner's memory alive, which NVML never names.

use super::procfs::ProcRoot;
use super::{Holder, HolderScan};
use procfs::process::Process;
use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How many processes to look at between two checks of the clock.
const CLOCK_CHECK_EVERY: usize = 64;

/// What one process's descriptor lists told us.
#[derive(Default)]
struct HeldNodes {
    any: bool,
    uvm: bool,
    gpu_minors: BTreeSet<u32>,
}

impl ProcRoot {
    /// Scan every process but `own_pid` for NVIDIA device files, stopping at `budget`.
    pub fn scan_holders(&self, own_pid: u32, budget: Duration) -> HolderScan {
        let started = Instant::now();
        let mut scan = HolderScan {
            holders: Vec::new(),
            permission_errors: 0,
            cut_short: false,
            duration_seconds: 0.0,
        };
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(_) => {
                scan.permission_errors += 1;
                scan.duration_seconds = started.elapsed().as_secs_f64();
                return scan;
            }
        };
        for (seen, entry) in entries.flatten().enumerate() {
            if seen % CLOCK_CHECK_EVERY == 0 && started.elapsed() > budget {
                scan.cut_short = true;
                break;
            }
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == own_pid {
                continue;
            }
            match self.held_nodes(&entry.path()) {
                Ok(held) if held.any => {
                    if let Some(holder) = self.describe_holder(pid, held) {
                        scan.holders.push(holder);
                    }
                }
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                    scan.permission_errors += 1;
                }
                // The process exited while we looked: it holds nothing any more.
                Err(_) => {}
            }
        }
        scan.holders.sort_by_key(|holder| holder.pid);
        scan.duration_seconds = started.elapsed().as_secs_f64();
        scan
    }

    /// The NVIDIA nodes a process holds, through its own list or, when that is empty
    /// (a zombie main thread), through its threads' lists.
    fn held_nodes(&self, pid_dir: &Path) -> io::Result<HeldNodes> {
        let mut held = HeldNodes::default();
        let open_files = self.collect_nodes(&pid_dir.join("fd"), &mut held)?;
        if open_files == 0 {
            if let Ok(tasks) = fs::read_dir(pid_dir.join("task")) {
                for task in tasks.flatten() {
                    // Kernel threads and fresh zombies have no files at all; a denied
                    // thread list was already denied for the process itself.
                    let _ = self.collect_nodes(&task.path().join("fd"), &mut held);
                }
            }
        }
        Ok(held)
    }

    /// Adds the NVIDIA nodes in one fd directory to `held`; returns how many files it lists.
    fn collect_nodes(&self, fd_dir: &Path, held: &mut HeldNodes) -> io::Result<usize> {
        let mut open_files = 0;
        for entry in fs::read_dir(fd_dir)? {
            let Ok(entry) = entry else { continue };
            open_files += 1;
            let Ok(target) = fs::read_link(entry.path()) else {
                continue;
            };
            let Some(rest) = target
                .as_os_str()
                .as_bytes()
                .strip_prefix(self.device_prefix.as_slice())
            else {
                continue;
            };
            held.any = true;
            held.uvm |= rest == b"-uvm";
            // `/dev/nvidia0` names a GPU; `/dev/nvidiactl`, `/dev/nvidia-uvm` and the
            // capability nodes are shared by every CUDA process.
            if let Some(minor) = std::str::from_utf8(rest)
                .ok()
                .and_then(|digits| digits.parse::<u32>().ok())
            {
                held.gpu_minors.insert(minor);
            }
        }
        Ok(open_files)
    }

    fn describe_holder(&self, pid: u32, held: HeldNodes) -> Option<Holder> {
        let process = Process::new_with_root(self.pid_dir(pid)).ok()?;
        let stat = process.stat().ok()?;
        let uid = process.uid().ok();
        let wchan = if stat.state == 'D' {
            process
                .wchan()
                .ok()
                .filter(|name| !name.is_empty() && name != "0")
        } else {
            None
        };
        Some(Holder {
            pid,
            ppid: u32::try_from(stat.ppid).unwrap_or(0),
            comm: stat.comm,
            state: stat.state,
            start_time_ticks: stat.starttime,
            uid,
            user: uid.and_then(user_name),
            wchan,
            gpu_minors: held.gpu_minors.into_iter().collect(),
            holds_uvm: held.uvm,
        })
    }
}

/// The name of a user id from the host's password file.
fn user_name(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid).then(|| name.to_string())
    })
}
