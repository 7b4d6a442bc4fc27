//! The holder scan: every process looked at for NVIDIA device files. It finds the live
//! process that keeps a dead owner's memory alive, which NVML never names, and the NVML
//! clients that hold the same files without a context. Each holder is read whole
//! (descriptors and mappings), as an owner is.

use super::ProcessReader;
use crate::observe::procfs::earlier_looks::Remembered;
use crate::observe::procfs::pidns::NamespaceInits;
use crate::observe::procfs::reading::{HolderScan, ProcessFacts, References};
use crate::observe::procfs::references::{self, FdDirectory};
use crate::observe::procfs::root::{gone, Unread};
use std::io;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How many processes to look at between two checks of the clock.
const CLOCK_CHECK_EVERY: usize = 64;
/// Most threads one scan uses. The first scan of an episode is one system call per open
/// file (a `readlink` costs 1-4 us in a VM: 0.5 s of CPU for 10,000 processes of 50
/// files), and the verdict waits for it, so it spreads over cores; GPU hosts have dozens,
/// and eight for the tenth of a second it then takes leave most of them to the jobs.
/// Later scans are one `statx` a process and rarely need more than one.
const MAX_SCAN_THREADS: usize = 8;
/// Fewest processes not seen before worth a thread of their own (starting and joining
/// one costs about 100 us in a VM): each is one system call per open file.
const MIN_PROCESSES_PER_THREAD: usize = 32;
/// How many processes seen before (one `statx` each, when nothing changed) weigh as
/// much as one not seen before.
const KNOWN_PER_NEW_PROCESS: usize = 25;

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u32 = 0x0020_0000;

impl<'a> ProcessReader<'a> {
    /// An NVML-listed owner's reading as [`ProcessReader::read_owner`] left it in this
    /// collection (its stat read now; its descriptors and mappings by that method's
    /// rule), when the scan may take it as it is: the same process, holding NVIDIA files,
    /// its descriptors and mappings read and showing no GPU but those NVML lists it on,
    /// so that no verdict can blame it (a process with a context on another GPU, or a
    /// MIG capability, is read afresh).
    fn owner_reading(&self, pid: u32) -> Option<(&'a Remembered, &'a ProcessFacts)> {
        let (start_time_ticks, listed) = self.owners_read.get(&pid)?;
        let known = self.previous.get(&pid)?;
        let facts = known.facts.as_ref()?;
        let only_listed = |references: &References| {
            references.nodes().is_some_and(|nodes| {
                nodes.capabilities.is_empty()
                    && nodes.gpus.iter().all(|minor| listed.contains(minor))
            })
        };
        let holds = facts
            .descriptors
            .nodes()
            .is_some_and(|nodes| !nodes.is_empty());
        let usable = known.start_time_ticks == *start_time_ticks
            && facts.state != 'Z'
            && holds
            && only_listed(&facts.descriptors)
            && only_listed(&facts.mappings);
        usable.then_some((known, facts))
    }

    /// One process of the holder scan: `None` when it holds no NVIDIA file (or is gone),
    /// else its facts; with what to remember of it. A process remembered with no NVIDIA
    /// file, the same start time and as many descriptors as then is not listed again.
    fn scan_one(&self, pid: u32, directory: Option<u64>) -> Scanned {
        if let Some((known, facts)) = self.owner_reading(pid) {
            return Scanned::Holder(Box::new(ProcessFacts::clone(facts)), known.unchanged());
        }
        // A kernel thread holds no file, ever: one seen before, whose `/proc` directory
        // is still the one listed then, is taken as it was without a system call (hosts
        // with many cores have thousands).
        if let Some(known) = self.previous.get(&pid) {
            if known.kernel_thread && directory.is_some() && known.directory == directory {
                return Scanned::Nothing(known.unchanged());
            }
        }
        let dir = self.root.pid_dir(pid);
        // One system call tells a process remembered without NVIDIA files, which still
        // has as many descriptors, from one to read (most of a later scan's processes).
        let fd_directory = references::fd_directory(&dir).ok();
        if let (Some(known), Some(now)) = (self.previous.get(&pid), fd_directory) {
            if known.holds_no_nvidia_file_still(now) {
                return Scanned::Nothing(known.unchanged());
            }
        }
        let stat = match self.root.stat(&dir) {
            Ok(stat) => stat,
            Err(error) if gone(&error) => return Scanned::Gone,
            Err(_) => return Scanned::Denied,
        };
        let known = self.remembered(pid, &stat);
        let kernel_thread = stat.flags & PF_KTHREAD != 0;
        let remember = |fd_directory: Option<FdDirectory>| Remembered {
            start_time_ticks: stat.start_time_ticks,
            facts: None,
            nested: known.and_then(|known| known.nested),
            fd_directory,
            held_nvidia: false,
            kernel_thread,
            directory,
            stat_file: None,
            witnessed: None,
        };
        // A kernel thread holds no file, ever.
        if kernel_thread {
            return Scanned::Nothing(remember(fd_directory));
        }
        // The same process (by its start time) with as many descriptors, seen through a
        // directory the kernel made anew since.
        if let (Some(known), Some(now)) = (known, fd_directory) {
            let count = known.fd_directory.map(|then| then.size);
            if !known.held_nvidia && count == Some(now.size) && now.size > 0 {
                return Scanned::Nothing(remember(fd_directory));
            }
        }
        // An empty list is looked behind only when the main thread is a zombie.
        let descriptors = self.descriptors(&dir, stat.state == b'Z');
        match descriptors {
            Ok(found) if found.any() => {
                let looked = self.read_afresh(pid, &dir, stat, Some(found));
                match (looked.facts, looked.remember) {
                    (Ok(facts), Some(remember)) => Scanned::Holder(
                        Box::new(Arc::unwrap_or_clone(facts)),
                        Remembered {
                            fd_directory,
                            ..remember
                        },
                    ),
                    (Err(Unread::Missing), _) => Scanned::Gone,
                    _ => Scanned::Denied,
                }
            }
            Ok(_) => Scanned::Nothing(remember(fd_directory)),
            Err(error) if self.exited(&dir, &stat, &error) => Scanned::Gone,
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => Scanned::Denied,
            Err(_) => Scanned::Gone,
        }
    }

    /// Scan every process but the exporter for NVIDIA device files, stopping at `budget`.
    pub fn scan_holders(&self, budget: Duration) -> HolderScan {
        self.scan_and_remember(Instant::now() + budget).0
    }

    /// Scan every process but the exporter for NVIDIA device files, stopping at
    /// `deadline`; with what to remember of every process seen, for the next scan.
    pub fn scan_and_remember(&self, deadline: Instant) -> (HolderScan, Vec<(u32, Remembered)>) {
        let started = Instant::now();
        let mut inits = NamespaceInits::new(self.root, deadline);
        let pids: Vec<(u32, Option<u64>)> = match self.root.pids_and_directories() {
            Ok(pids) => pids
                .into_iter()
                .filter(|&(pid, _)| pid != self.placement.own_pid)
                .collect(),
            Err(_) => {
                let scan = HolderScan {
                    holders: Vec::new(),
                    permission_errors: 1,
                    cut_short: false,
                    duration_seconds: started.elapsed().as_secs_f64(),
                };
                return (scan, Vec::new());
            }
        };
        let known = pids
            .iter()
            .filter(|(pid, _)| self.previous.contains_key(pid))
            .count();
        let work = (pids.len() - known) + known / KNOWN_PER_NEW_PROCESS;
        let threads = cores()
            .min(MAX_SCAN_THREADS)
            .min(work / MIN_PROCESSES_PER_THREAD)
            .max(1);
        // Threads take every `threads`-th PID, so kernel threads (low PIDs, no files)
        // and busy processes spread evenly over them.
        let share = |first: usize| pids.iter().copied().skip(first).step_by(threads);
        let parts: Vec<PartialScan> = std::thread::scope(|scope| {
            let workers: Vec<_> = (1..threads)
                .map(|first| {
                    std::thread::Builder::new()
                        .name("holder-scan".into())
                        .spawn_scoped(scope, move || self.scan_some(share(first), deadline))
                        .map_err(|_| first)
                })
                .collect();
            let mut parts = vec![self.scan_some(share(0), deadline)];
            for worker in workers {
                parts.push(match worker {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    // No thread to be had: scan its share here.
                    Err(first) => self.scan_some(share(first), deadline),
                });
            }
            parts
        });
        let mut scan = HolderScan {
            holders: Vec::new(),
            permission_errors: 0,
            cut_short: false,
            duration_seconds: 0.0,
        };
        let mut remembered = Vec::new();
        let mut holders = Vec::new();
        for part in parts {
            holders.extend(part.holders);
            scan.permission_errors += part.permission_errors;
            scan.cut_short |= part.cut_short;
            remembered.extend(part.remembered);
        }
        holders.sort_by_key(|(holder, _)| holder.pid);
        // Few processes hold a GPU: which containers have ended is asked of them alone,
        // and not of those known to share the procfs's PID namespace.
        scan.holders = holders
            .into_iter()
            .map(|(mut holder, nested)| {
                if nested != Some(false) {
                    holder.pid_namespace_init = inits.of(holder.pid);
                }
                holder
            })
            .collect();
        scan.duration_seconds = started.elapsed().as_secs_f64();
        (scan, remembered)
    }

    /// Scan `pids`, stopping once the scan is past its deadline.
    fn scan_some(
        &self,
        pids: impl Iterator<Item = (u32, Option<u64>)>,
        deadline: Instant,
    ) -> PartialScan {
        let mut part = PartialScan::default();
        for (seen, (pid, directory)) in pids.enumerate() {
            if seen % CLOCK_CHECK_EVERY == 0 && Instant::now() > deadline {
                part.cut_short = true;
                break;
            }
            match self.scan_one(pid, directory) {
                Scanned::Holder(facts, remember) => {
                    part.holders.push((*facts, remember.nested()));
                    part.remembered.push((pid, remember));
                }
                Scanned::Nothing(remember) => part.remembered.push((pid, remember)),
                Scanned::Denied => part.permission_errors += 1,
                // The process exited while we looked: it holds nothing any more.
                Scanned::Gone => {}
            }
        }
        part
    }
}

/// The cores this process may use, asked once: the standard library reads the cgroup's
/// CPU quota files each time it is asked (six system calls), which a scan a scrape
/// during an orphan episode would pay on every scrape.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// What the scan found of one process.
#[derive(Debug)]
enum Scanned {
    /// It holds NVIDIA files: its facts, and what to remember.
    Holder(Box<ProcessFacts>, Remembered),
    /// It holds none: what to remember.
    Nothing(Remembered),
    /// Its descriptors could not be read.
    Denied,
    /// It exited while it was looked at.
    Gone,
}

/// What one thread of a scan found.
#[derive(Default)]
struct PartialScan {
    /// Each holder, with whether it lives in a nested PID namespace (`None`: not known).
    holders: Vec<(ProcessFacts, Option<bool>)>,
    permission_errors: u64,
    cut_short: bool,
    remembered: Vec<(u32, Remembered)>,
}

#[cfg(test)]
mod tests {
    use super::super::fake_proc::FakeProc;
    use super::*;
    use crate::observe::procfs::earlier_looks::EarlierLooks;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_scan_skips_a_process_remembered_without_nvidia_files() {
        let proc = FakeProc::new();
        let dir = proc.dir.path().join("200");
        proc.process(200, 500, 'S', &[]);
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        let placement = proc.placement();
        let empty = EarlierLooks::new();
        let first = ProcessReader::with_earlier_looks(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(200, None) else {
            panic!("no NVIDIA file yet")
        };
        let earlier_looks: EarlierLooks = [(200, remember)].into();
        // Same process, same number of descriptors: not listed again, so a target changed
        // behind the cache's back goes unseen (a real process's count changes when it
        // opens a device).
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/nvidia0", dir.join("fd/3")).unwrap();
        let reader = ProcessReader::with_earlier_looks(&proc.root, placement, &earlier_looks);
        assert!(matches!(reader.scan_one(200, None), Scanned::Nothing(_)));
        // A new start time under the PID is listed afresh.
        proc.process(200, 900, 'S', &[0]);
        assert!(matches!(reader.scan_one(200, None), Scanned::Holder(..)));
    }

    #[test]
    fn a_later_scan_knows_an_unchanged_process_by_its_descriptor_directory_alone() {
        let proc = FakeProc::new();
        let dir = proc.dir.path().join("300");
        proc.process(300, 500, 'S', &[]);
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        let placement = proc.placement();
        let empty = EarlierLooks::new();
        let first = ProcessReader::with_earlier_looks(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(300, None) else {
            panic!("no NVIDIA file")
        };
        let earlier_looks: EarlierLooks = [(300, remember)].into();
        // Its stat is not read again: were it, this line would make it unreadable.
        fs::write(dir.join("stat"), "not a stat line").unwrap();
        let reader = ProcessReader::with_earlier_looks(&proc.root, placement, &earlier_looks);
        assert!(matches!(reader.scan_one(300, None), Scanned::Nothing(_)));
        // Another directory under the PID is another process: read, and unreadable here.
        fs::rename(dir.join("fd"), dir.join("fd-then")).unwrap();
        fs::create_dir(dir.join("fd")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        assert!(matches!(reader.scan_one(300, None), Scanned::Denied));
    }

    /// Kernel thread `pid` named `comm` in `proc`: PF_KTHREAD (0x200000) among the flags
    /// of its stat line, no descriptors. Its folder.
    fn kernel_thread(proc: &FakeProc, pid: u32, comm: &str) -> std::path::PathBuf {
        let dir = proc.dir.path().join(pid.to_string());
        fs::create_dir_all(dir.join("fd")).unwrap();
        fs::write(
            dir.join("stat"),
            format!("{pid} ({comm}) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0"),
        )
        .unwrap();
        dir
    }

    #[test]
    fn a_kernel_thread_is_known_by_its_descriptor_directory_too() {
        let proc = FakeProc::new();
        let dir = kernel_thread(&proc, 2, "kthreadd");
        let placement = proc.placement();
        let empty = EarlierLooks::new();
        let first = ProcessReader::with_earlier_looks(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(2, None) else {
            panic!("a kernel thread holds nothing")
        };
        let earlier_looks: EarlierLooks = [(2, remember)].into();
        fs::write(dir.join("stat"), "not a stat line").unwrap();
        let reader = ProcessReader::with_earlier_looks(&proc.root, placement, &earlier_looks);
        assert!(matches!(reader.scan_one(2, None), Scanned::Nothing(_)));
    }

    #[test]
    fn a_kernel_thread_under_the_same_proc_directory_is_taken_without_a_system_call() {
        let proc = FakeProc::new();
        let dir = kernel_thread(&proc, 3, "pool_workqueue_release");
        let placement = proc.placement();
        let empty = EarlierLooks::new();
        let first = ProcessReader::with_earlier_looks(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(3, Some(41)) else {
            panic!("a kernel thread holds nothing")
        };
        assert_eq!(remember.directory, Some(41));
        let earlier_looks: EarlierLooks = [(3, remember)].into();
        // Nothing is read again: its descriptor directory gone would make it gone.
        fs::remove_dir(dir.join("fd")).unwrap();
        let reader = ProcessReader::with_earlier_looks(&proc.root, placement, &earlier_looks);
        assert!(matches!(reader.scan_one(3, Some(41)), Scanned::Nothing(_)));
        // Another directory under the PID is another process, read again: a user process
        // that got the number, holding a GPU.
        proc.process(3, 900, 'S', &[0]);
        assert!(matches!(reader.scan_one(3, Some(42)), Scanned::Holder(..)));
        // A listing that could not say which directory it is says nothing either.
        assert!(matches!(reader.scan_one(3, None), Scanned::Holder(..)));
    }
}
