//! The scan of every process for NVIDIA device files: it finds the live process that
//! keeps a dead owner's memory alive, which NVML never names, and the NVML clients that
//! hold the same files without a context. Each holder is read whole (descriptors and
//! mappings) by the one reader, [`Reader`].

use super::pidns::NamespaceInits;
use super::procfs::{Reader, Remembered, Scanned};
use super::{HolderScan, ProcessFacts};
use std::time::{Duration, Instant};

/// How many processes to look at between two checks of the clock.
const CLOCK_CHECK_EVERY: usize = 64;
/// Most threads one scan uses. The scan is one system call per open file (a `readlink`
/// costs 2-4 us in a VM), so it spreads over cores; more would crowd a busy GPU host.
const MAX_SCAN_THREADS: usize = 4;
/// Fewest processes worth a thread of their own (starting one costs tens of microseconds).
const MIN_PROCESSES_PER_THREAD: usize = 32;

/// What one thread of a scan found.
#[derive(Default)]
struct PartialScan {
    /// Each holder, with whether it lives in a nested PID namespace (`None`: not known).
    holders: Vec<(ProcessFacts, Option<bool>)>,
    permission_errors: u64,
    cut_short: bool,
    remembered: Vec<(u32, Remembered)>,
}

impl Reader<'_> {
    /// Scan every process but the exporter for NVIDIA device files, stopping at `budget`.
    pub fn scan_holders(&self, budget: Duration) -> HolderScan {
        self.scan_and_remember(Instant::now() + budget).0
    }

    /// Scan every process but the exporter for NVIDIA device files, stopping at
    /// `deadline`; with what to remember of every process seen, for the next scan.
    pub fn scan_and_remember(&self, deadline: Instant) -> (HolderScan, Vec<(u32, Remembered)>) {
        let started = Instant::now();
        let mut inits = NamespaceInits::new(self.root(), deadline);
        let pids: Vec<u32> = match self.root().pids() {
            Ok(pids) => pids
                .into_iter()
                .filter(|&pid| pid != self.own_pid())
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
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_SCAN_THREADS)
            .min(pids.len() / MIN_PROCESSES_PER_THREAD)
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
    fn scan_some(&self, pids: impl Iterator<Item = u32>, deadline: Instant) -> PartialScan {
        let mut part = PartialScan::default();
        for (seen, pid) in pids.enumerate() {
            if seen % CLOCK_CHECK_EVERY == 0 && Instant::now() > deadline {
                part.cut_short = true;
                break;
            }
            match self.scan_one(pid) {
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
