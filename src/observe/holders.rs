//! The scan of every process's descriptors for NVIDIA device files: it finds the live
//! process that keeps a dead owner's memory alive, which NVML never names.

use super::parse;
use super::pidns::NamespaceInits;
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
/// Most threads one scan uses. The scan is one system call per open file (a `readlink`
/// costs 2-4 us in a VM), so it spreads over cores; more would crowd a busy GPU host.
const MAX_SCAN_THREADS: usize = 4;
/// Fewest processes worth a thread of their own (starting one costs tens of microseconds).
const MIN_PROCESSES_PER_THREAD: usize = 32;

/// Whether a denied `readlink` of a descriptor makes the process unreadable. Listing
/// another user's descriptors needs CAP_DAC_READ_SEARCH, reading where they point
/// CAP_SYS_PTRACE: an exporter with only the first may list every process and read no
/// link, and would miss holders in a scan that looks complete. With CAP_SYS_PTRACE a
/// denial comes from beyond what capabilities grant (a process of a parent user
/// namespace, such as a sandbox's own init) and is passed over as before.
fn denied_links_count() -> bool {
    std::fs::read("/proc/self/status")
        .ok()
        .and_then(|status| parse::effective_capabilities(&status))
        .is_none_or(|caps| caps & (1 << parse::CAP_SYS_PTRACE) == 0)
}

/// What one process's descriptor lists told us.
#[derive(Default)]
struct HeldNodes {
    any: bool,
    gpu_minors: BTreeSet<u32>,
}

/// What every thread of one scan shares.
#[derive(Clone, Copy)]
struct Pass {
    started: Instant,
    budget: Duration,
    /// See [`denied_links_count`].
    count_denied_links: bool,
}

/// What one thread of a scan found.
#[derive(Default)]
struct PartialScan {
    holders: Vec<Holder>,
    permission_errors: u64,
    cut_short: bool,
}

impl ProcRoot {
    /// Scan every process but `own_pid` for NVIDIA device files, stopping at `budget`.
    pub fn scan_holders(&self, own_pid: u32, budget: Duration) -> HolderScan {
        let started = Instant::now();
        let pass = Pass {
            started,
            budget,
            count_denied_links: denied_links_count(),
        };
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
        let pids: Vec<u32> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != own_pid)
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_SCAN_THREADS)
            .min(pids.len() / MIN_PROCESSES_PER_THREAD)
            .max(1);
        // Threads take every `threads`-th PID, so kernel threads (low PIDs, no files)
        // and busy processes spread evenly over them.
        let parts: Vec<PartialScan> = std::thread::scope(|scope| {
            let workers: Vec<_> = (1..threads)
                .map(|first| {
                    let mine = pids.iter().copied().skip(first).step_by(threads);
                    std::thread::Builder::new()
                        .name("holder-scan".into())
                        .spawn_scoped(scope, move || self.scan_some(mine, pass))
                        .map_err(|_| first)
                })
                .collect();
            let mut parts = vec![self.scan_some(pids.iter().copied().step_by(threads), pass)];
            for worker in workers {
                parts.push(match worker {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    // No thread to be had: scan its share here.
                    Err(first) => {
                        self.scan_some(pids.iter().copied().skip(first).step_by(threads), pass)
                    }
                });
            }
            parts
        });
        for part in parts {
            scan.holders.extend(part.holders);
            scan.permission_errors += part.permission_errors;
            scan.cut_short |= part.cut_short;
        }
        scan.holders.sort_by_key(|holder| holder.pid);
        // Few processes hold a GPU: which containers have ended is asked of them alone.
        let mut inits = NamespaceInits::new(self, started + budget);
        for holder in &mut scan.holders {
            holder.pid_namespace_init = inits.of(holder.pid);
        }
        scan.duration_seconds = started.elapsed().as_secs_f64();
        scan
    }

    /// Scan `pids`, stopping once the scan is over its budget.
    fn scan_some(&self, pids: impl Iterator<Item = u32>, pass: Pass) -> PartialScan {
        let mut part = PartialScan::default();
        for (seen, pid) in pids.enumerate() {
            if seen % CLOCK_CHECK_EVERY == 0 && pass.started.elapsed() > pass.budget {
                part.cut_short = true;
                break;
            }
            match self.held_nodes(&self.pid_dir(pid), pass.count_denied_links) {
                Ok(held) if held.any => {
                    if let Some(holder) = self.describe_holder(pid, held) {
                        part.holders.push(holder);
                    }
                }
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                    part.permission_errors += 1;
                }
                // The process exited while we looked: it holds nothing any more.
                Err(_) => {}
            }
        }
        part
    }

    /// The NVIDIA nodes a process holds, through its own list or, when that is empty
    /// (a zombie main thread), through its threads' lists.
    fn held_nodes(&self, pid_dir: &Path, count_denied_links: bool) -> io::Result<HeldNodes> {
        let mut held = HeldNodes::default();
        let open_files = self.collect_nodes(&pid_dir.join("fd"), &mut held, count_denied_links)?;
        if open_files == 0 && main_thread_may_be_zombie(pid_dir) {
            if let Ok(tasks) = fs::read_dir(pid_dir.join("task")) {
                for task in tasks.flatten() {
                    // Kernel threads and fresh zombies have no files at all; a denied
                    // thread list was already denied for the process itself.
                    let _ = self.collect_nodes(&task.path().join("fd"), &mut held, false);
                }
            }
        }
        Ok(held)
    }

    /// Adds the NVIDIA nodes in one fd directory to `held`; returns how many files it lists.
    fn collect_nodes(
        &self,
        fd_dir: &Path,
        held: &mut HeldNodes,
        count_denied_links: bool,
    ) -> io::Result<usize> {
        let mut open_files = 0;
        for entry in fs::read_dir(fd_dir)? {
            let Ok(entry) = entry else { continue };
            open_files += 1;
            let target = match fs::read_link(entry.path()) {
                Ok(target) => target,
                Err(error)
                    if count_denied_links && error.kind() == io::ErrorKind::PermissionDenied =>
                {
                    return Err(error)
                }
                // Closed since the listing.
                Err(_) => continue,
            };
            let Some(rest) = target
                .as_os_str()
                .as_bytes()
                .strip_prefix(self.device_prefix.as_slice())
            else {
                continue;
            };
            held.any = true;
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
            user: uid.and_then(|uid| user_name(&self.root, uid)),
            wchan,
            gpu_minors: held.gpu_minors.into_iter().collect(),
            pgid: u32::try_from(stat.pgrp).unwrap_or(0),
            sid: u32::try_from(stat.session).unwrap_or(0),
            cgroup: self.cgroup(pid),
            pid_namespace_init: None,
        })
    }
}

/// Whether an empty descriptor list may hide live threads' files: only when the main
/// thread is a zombie (or its state cannot be read). Kernel threads and processes that
/// closed every file have empty lists too, and one read of `stat` spares the listing of
/// their threads.
fn main_thread_may_be_zombie(pid_dir: &Path) -> bool {
    let state = fs::read(pid_dir.join("stat"))
        .ok()
        .and_then(|stat| parse::stat_fields(&stat))
        .map(|fields| fields.state);
    !matches!(state, Some(letter) if letter != b'Z')
}

/// The name of a user id from the host's password file: the one init sees (through
/// `/proc/1/root`, which in a container with the host's procfs is the host's), else ours.
fn user_name(proc_root: &Path, uid: u32) -> Option<String> {
    let passwd = fs::read_to_string(proc_root.join("1/root/etc/passwd"))
        .or_else(|_| fs::read_to_string("/etc/passwd"))
        .ok()?;
    parse::passwd_user(&passwd, uid)
}
