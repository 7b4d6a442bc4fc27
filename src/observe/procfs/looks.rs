//! One observation's looks at `/proc`, each served from and adding to what earlier looks
//! found: NVML's owners on every scrape, and every process for holders when asked.

use super::earlier_looks::{remember, EarlierLooks};
use super::pidns::NamespaceInits;
use super::placement::Placement;
use super::process_reader::{OwnersRead, ProcessReader};
use super::reading::{HolderScan, ProcessLookup, ProcfsView};
use super::root::{ProcRoot, Unread};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// The most owners whose stat files are held open between scrapes (one descriptor each);
/// beyond it, each is opened again on every scrape.
const MAX_HELD_STAT_FILES: usize = 512;

/// What `/proc` says of the PIDs NVML lists.
#[derive(Debug)]
pub(crate) struct Owners {
    /// What is there now, by NVML's PID.
    pub(crate) lookups: BTreeMap<u32, ProcessLookup>,
    /// Entries that existed but could not be read, by NVML's PID (those with any): a look
    /// started before NVML answered may have read PIDs it no longer lists, whose errors
    /// are not this observation's.
    pub(crate) errors: BTreeMap<u32, u64>,
    /// Whether the procfs shows our own PID namespace, in which NVML's PIDs live.
    pub(crate) view: ProcfsView,
}

/// Which owners one look reads, and what it does with the stat files held for others.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnersScope {
    /// How many PIDs NVML lists in all: stat files are held only for up to
    /// [`MAX_HELD_STAT_FILES`] owners.
    pub(crate) listed: usize,
    /// Whether this look reads every owner, so that the stat files of PIDs it did not
    /// read are let go of. A look of only the PIDs that are new since the last one keeps
    /// them: the look before it read (and holds) the others.
    pub(crate) every_owner: bool,
}

/// Reads each PID in `listed` (our PID to the minor numbers of the GPUs NVML lists it
/// on) in `root`, served from and adding to `earlier_looks`. Which owners' containers have
/// ended takes a short walk up from each owner in a nested PID namespace, and a pass over
/// `/proc` at most once, which stops at `deadline`.
pub(crate) fn look_at_owners(
    root: &ProcRoot,
    placement: Placement,
    earlier_looks: &mut EarlierLooks,
    listed: &BTreeMap<u32, Vec<u32>>,
    scope: OwnersScope,
    deadline: Instant,
) -> Owners {
    let reader = ProcessReader::with_earlier_looks(root, placement, earlier_looks)
        .holding_stat_files(scope.listed <= MAX_HELD_STAT_FILES)
        .until(deadline);
    let mut errors = BTreeMap::new();
    let mut read_as_owners = HashSet::new();
    let mut inits = NamespaceInits::new(root, deadline);
    let mut lookups = BTreeMap::new();
    let mut learnt = Vec::new();
    let mut gone = Vec::new();
    for (&pid, gpus) in listed {
        let now = match reader.procfs_pid(pid) {
            None => ProcessLookup::NotVisible,
            Some(procfs_pid) => {
                read_as_owners.insert(procfs_pid);
                let looked = reader.read_owner(procfs_pid, gpus);
                if looked.errors > 0 {
                    errors.insert(pid, looked.errors);
                }
                if let Some(remember) = looked.remember {
                    learnt.push((procfs_pid, remember));
                }
                match looked.facts {
                    Ok(mut facts) => {
                        if looked.nested != Some(false) {
                            let init = inits.of(procfs_pid);
                            if facts.pid_namespace_init != init {
                                Arc::make_mut(&mut facts).pid_namespace_init = init;
                            }
                        }
                        ProcessLookup::Present(facts)
                    }
                    Err(Unread::Missing) => {
                        gone.push(procfs_pid);
                        ProcessLookup::Missing
                    }
                    Err(Unread::Unreadable(error)) => ProcessLookup::Unreadable { error },
                }
            }
        };
        lookups.insert(pid, now);
    }
    let view = reader.view();
    drop(reader);
    for pid in gone {
        earlier_looks.remove(&pid);
    }
    remember(earlier_looks, learnt);
    if scope.every_owner {
        for (pid, known) in earlier_looks.iter_mut() {
            if !read_as_owners.contains(pid) {
                known.let_go_of_stat_file();
            }
        }
    }
    Owners {
        lookups,
        errors,
        view,
    }
}

/// The holder scan of `root`, served from and adding to `earlier_looks`, stopping at
/// `deadline`; `owners_read` are the owners this observation read (see
/// [`ProcessReader::with_owners_read`]).
pub(crate) fn look_for_holders(
    root: &ProcRoot,
    placement: Placement,
    earlier_looks: &mut EarlierLooks,
    owners_read: OwnersRead,
    deadline: Instant,
) -> HolderScan {
    let reader = ProcessReader::with_earlier_looks(root, placement, earlier_looks)
        .with_owners_read(owners_read);
    let (scan, learnt) = reader.scan_and_remember(deadline);
    drop(reader);
    // A complete scan saw every process: what it did not see has exited.
    if !scan.cut_short {
        let seen: HashSet<u32> = learnt.iter().map(|(pid, _)| *pid).collect();
        earlier_looks.retain(|pid, _| seen.contains(pid));
    }
    remember(earlier_looks, learnt);
    scan
}
