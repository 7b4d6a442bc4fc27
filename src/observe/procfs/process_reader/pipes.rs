//! Whether a worker's pipes to the process that started it lead nowhere: what `/proc`
//! still shows of a killed server when no exporter watched it die.
//!
//! Python's `multiprocessing` (and so `torch.multiprocessing`, vLLM's engine core and
//! SGLang's schedulers) gives each worker two pipes to its parent beyond the standard
//! streams: one it reads (the parent's sentinel) and one it writes, whose other ends only
//! the parent holds, or, with the fork start method, the parent and the workers forked
//! after it. Measured with Python 3.11's fork and spawn workers, with `setproctitle` applied
//! (which rewrites the command line, and with it the spawn clue): once the server is
//! SIGKILLed, each worker holds a pipe it reads and one it writes whose other ends no
//! process outside its process group holds. A daemon that double-forked keeps no such pair:
//! it closes what its launcher gave it, or holds both ends of its own self-pipe.

use super::ProcessReader;
use crate::observe::procfs::parse;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

/// The first descriptor past the standard streams: a pipe on stdin, stdout or stderr leads
/// to whatever started the process (a shell, a logger) and says nothing of a worker.
const FIRST_OWN_DESCRIPTOR: u32 = 3;

impl ProcessReader<'_> {
    /// Whether process `pid` (of group `pgid`, its directory `dir`) holds a pipe it only
    /// reads and another it only writes, beyond the standard streams, whose other ends no
    /// process outside its group holds. A look that does not finish by the reader's
    /// deadline, or cannot read every process, says no: a clue is only what was seen.
    pub(super) fn pipes_to_parent_closed(&self, pid: u32, pgid: u32, dir: &Path) -> bool {
        let Some((read, written)) = own_pipes(dir) else {
            return false;
        };
        if read.is_empty() || written.is_empty() {
            return false;
        }
        let wanted: HashSet<u64> = read.iter().chain(&written).copied().collect();
        let Ok(pids) = self.root.pids() else {
            return false;
        };
        let mut held_outside: HashSet<u64> = HashSet::new();
        for other in pids {
            if other == pid {
                continue;
            }
            if self.until.is_some_and(|until| Instant::now() >= until) {
                return false;
            }
            let other_dir = self.root.pid_dir(other);
            let descriptors = match fs::read_dir(other_dir.join("fd")) {
                Ok(descriptors) => descriptors,
                // Another user's, without the right to list it, could hold an end: then
                // nothing can be said.
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => return false,
                // Gone meanwhile.
                Err(_) => continue,
            };
            let mut holds = descriptors.flatten().filter_map(|entry| {
                let link = fs::read_link(entry.path()).ok()?;
                parse::pipe_inode(link.as_os_str().as_bytes())
                    .filter(|inode| wanted.contains(inode))
            });
            let Some(first) = holds.next() else {
                continue;
            };
            let inodes: Vec<u64> = std::iter::once(first).chain(holds).collect();
            let outside = self
                .root
                .stat(&other_dir)
                .map_or(true, |stat| stat.pgrp != pgid);
            if outside {
                held_outside.extend(inodes);
            }
        }
        let lead_nowhere =
            |inodes: &HashSet<u64>| inodes.iter().any(|inode| !held_outside.contains(inode));
        lead_nowhere(&read) && lead_nowhere(&written)
    }
}

/// The pipes process directory `dir` holds beyond the standard streams, each opened only
/// for reading or only for writing: those it reads, and those it writes. A pipe of which
/// it holds both ends (its own self-pipe) is neither.
fn own_pipes(dir: &Path) -> Option<(HashSet<u64>, HashSet<u64>)> {
    let mut modes: HashMap<u64, (bool, bool)> = HashMap::new();
    for entry in fs::read_dir(dir.join("fd")).ok()?.flatten() {
        let name = entry.file_name();
        let Some(descriptor) = parse::pid_name(name.as_bytes()) else {
            continue;
        };
        if descriptor < FIRST_OWN_DESCRIPTOR {
            continue;
        }
        let Some(inode) = fs::read_link(entry.path())
            .ok()
            .and_then(|link| parse::pipe_inode(link.as_os_str().as_bytes()))
        else {
            continue;
        };
        let Some(reading) = fs::read(dir.join("fdinfo").join(&name))
            .ok()
            .and_then(|fdinfo| parse::opened_for_reading(&fdinfo))
        else {
            continue;
        };
        let (reads, writes) = modes.entry(inode).or_default();
        *reads |= reading;
        *writes |= !reading;
    }
    let only = |wanted: fn(&(bool, bool)) -> bool| -> HashSet<u64> {
        modes
            .iter()
            .filter(|(_, mode)| wanted(mode))
            .map(|(inode, _)| *inode)
            .collect()
    };
    Some((
        only(|&(reads, writes)| reads && !writes),
        only(|&(reads, writes)| writes && !reads),
    ))
}
