//! The one reader of processes in `/proc`: one walk over its processes, one descriptor
//! scanner, one reader of stat, status and maps, used for NVML's owners and for the holder
//! scan alike. What it yields is `reading`'s plain data; it runs on the `/proc` reader
//! thread, which the live host hands its looks (`observe::procfs_jobs`).
//!
//! - this file: the [`ProcessReader`], and one process read whole (stat, status,
//!   descriptors, mappings, cgroup), served from what an earlier look remembered while its
//!   start time holds;
//! - `after_kill`: what tells a process's story after a kill: where it came from and
//!   whether its parent has exited, whether it is exiting, whether a kill waits on it in
//!   the driver;
//! - `holder_scan`: every process looked at for NVIDIA device files, on a few threads.

mod after_kill;
#[cfg(test)]
mod fake_proc;
mod holder_scan;
mod pipes;

use super::earlier_looks::{open_stat_file, read_held_stat, EarlierLooks, Remembered};
use super::parse::{self, Stat, Status};
use super::placement::{Placement, Position};
use super::reading::{Lineage, NodeSet, ProcessFacts, ProcfsView, References, WitnessedProcess};
use super::references::{self, Descriptors, OpenFile};
use super::root::{gone, ProcRoot, Unread};
use crate::dates::now_unix_millis;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Instant;

/// One look at a process: what was found, how many entries could not be read, and what
/// to remember of it.
#[derive(Debug)]
pub struct Looked {
    /// The facts, or why there are none.
    pub(super) facts: Result<Arc<ProcessFacts>, Unread>,
    /// Entries that existed but could not be read.
    pub(super) errors: u64,
    /// Whether it lives in a nested PID namespace (`None`: not known).
    pub(super) nested: Option<bool>,
    /// What to remember of it for the next look.
    pub remember: Option<Remembered>,
}

impl Looked {
    fn failed(unread: Unread) -> Looked {
        let errors = u64::from(matches!(unread, Unread::Unreadable(_)));
        Looked {
            facts: Err(unread),
            errors,
            nested: None,
            remember: None,
        }
    }
}

/// Reads processes for one observation; cheap to make, shared by the scan's threads.
#[derive(Debug)]
pub struct ProcessReader<'a> {
    root: &'a ProcRoot,
    placement: Placement,
    /// What earlier looks found.
    previous: &'a EarlierLooks,
    /// The host's password file, read once when a user name is first needed.
    passwd: OnceLock<Option<String>>,
    /// Our PIDs to the procfs's, when it shows another namespace; built on first need.
    translation: OnceLock<HashMap<u32, u32>>,
    /// The owners read in this collection.
    owners_read: OwnersRead,
    /// Whether owners' stat files are held open between looks.
    hold_stat_files: bool,
    /// When a walk over every process for one owner (its pipes' other ends) must stop.
    until: Option<Instant>,
}

/// The NVML-listed owners read in this collection, by PID of the procfs: their start time
/// and the minor numbers of the GPUs NVML lists them on.
pub(crate) type OwnersRead = HashMap<u32, (u64, Vec<u32>)>;

/// No earlier looks, for a reader that starts from nothing.
static NOTHING_REMEMBERED: std::sync::LazyLock<EarlierLooks> =
    std::sync::LazyLock::new(EarlierLooks::new);

impl<'a> ProcessReader<'a> {
    /// A reader of `root` that remembers nothing, locating the exporter in it.
    pub fn new(root: &'a ProcRoot) -> ProcessReader<'a> {
        ProcessReader::with_earlier_looks(root, Placement::locate(root), &NOTHING_REMEMBERED)
    }

    /// A reader of `root` from `placement` that serves what `previous` remembers of a
    /// process while its start time is the same.
    pub fn with_earlier_looks(
        root: &'a ProcRoot,
        placement: Placement,
        previous: &'a EarlierLooks,
    ) -> ProcessReader<'a> {
        ProcessReader {
            root,
            placement,
            previous,
            passwd: OnceLock::new(),
            translation: OnceLock::new(),
            owners_read: OwnersRead::new(),
            hold_stat_files: false,
            until: None,
        }
    }

    /// This reader, stopping any walk over every process that one owner's reading calls
    /// for at `until` (what it did not finish says nothing).
    pub(super) fn until(mut self, until: Instant) -> ProcessReader<'a> {
        self.until = Some(until);
        self
    }

    /// This reader, holding the stat files of the owners it reads open for the next look
    /// (for a long-running exporter with a bounded number of owners).
    pub(super) fn holding_stat_files(mut self, hold: bool) -> ProcessReader<'a> {
        self.hold_stat_files = hold;
        self
    }

    /// This reader, told which owners were read in this collection (with their readings
    /// in its earlier looks): the holder scan takes those readings as they are when they can
    /// blame the owner for no GPU, instead of reading every owner's mappings again.
    pub(super) fn with_owners_read(mut self, owners_read: OwnersRead) -> ProcessReader<'a> {
        self.owners_read = owners_read;
        self
    }

    /// Whether the procfs shows our own PID namespace.
    pub(super) fn view(&self) -> ProcfsView {
        self.placement.view()
    }

    /// The procfs's PID of the process that is `pid` in our namespace (NVML's PIDs are
    /// ours); `None` when the procfs shows no such process.
    pub(super) fn procfs_pid(&self, pid: u32) -> Option<u32> {
        match self.placement.position {
            Position::Own => Some(pid),
            Position::Lost => None,
            Position::Foreign { .. } => self
                .translation
                .get_or_init(|| self.build_translation())
                .get(&pid)
                .copied(),
        }
    }

    /// Our PID of every process of the procfs that lives in our namespace, from its
    /// `NSpid` line: one pass over every process's status.
    fn build_translation(&self) -> HashMap<u32, u32> {
        let mut ours = HashMap::new();
        for pid in self.root.pids().unwrap_or_default() {
            if let Some(local) = self.local_pid(pid, &self.root.pid_dir(pid), None) {
                ours.insert(local, pid);
            }
        }
        ours
    }

    /// `status` when the caller read it already, else the status of `dir` read now.
    fn status_of<'s>(&self, dir: &Path, status: Option<&'s Status>) -> Option<Cow<'s, Status>> {
        match status {
            Some(status) => Some(Cow::Borrowed(status)),
            None => self.root.status(dir).ok().map(Cow::Owned),
        }
    }

    /// The PID that the process `pid` of the procfs has in our namespace.
    fn local_pid(&self, pid: u32, dir: &Path, status: Option<&Status>) -> Option<u32> {
        let Position::Foreign { level, namespace } = self.placement.position else {
            return (self.placement.position == Position::Own).then_some(pid);
        };
        let status = self.status_of(dir, status)?;
        let levels = status.nspid.as_ref()?;
        // Only a process of our very namespace is checked; one nested deeper would need
        // its namespace's ancestry, which procfs does not show.
        (levels.len() == level + 1 && self.root.pid_namespace(dir) == Some(namespace))
            .then(|| levels[level])
    }

    /// What was remembered of `pid`, if it is still the same process.
    fn remembered(&self, pid: u32, stat: &Stat) -> Option<&'a Remembered> {
        self.previous
            .get(&pid)
            .filter(|known| known.start_time_ticks == stat.start_time_ticks)
    }

    /// An NVML-listed owner, `pid` of the procfs, which NVML lists on the GPUs whose nodes
    /// have minor numbers `gpus`. What cannot change for a process is served from earlier looks;
    /// its stat is read each time, and its descriptors and mappings again whenever they do
    /// not show a context on every one of those GPUs (or its main thread is a zombie), so
    /// that a verdict against it always rests on a fresh reading.
    pub fn read_owner(&self, pid: u32, gpus: &[u32]) -> Looked {
        let dir = self.root.pid_dir(pid);
        let held = self
            .previous
            .get(&pid)
            .and_then(|known| known.stat_file.as_ref());
        let stat = match held.and_then(|file| read_held_stat(file)) {
            Some(stat) => stat,
            None => match self.root.stat(&dir) {
                Ok(stat) => stat,
                Err(error) => return Looked::failed(Unread::from_error(error)),
            },
        };
        let mut looked = self.read_owner_with(pid, &dir, stat, gpus);
        if let Some(remember) = looked.remember.as_mut() {
            if remember.stat_file.is_none() && self.hold_stat_files {
                remember.stat_file = open_stat_file(&dir, remember.start_time_ticks);
            }
        }
        looked
    }

    fn read_owner_with(&self, pid: u32, dir: &Path, stat: Stat, gpus: &[u32]) -> Looked {
        let Some((known, mut facts)) = self
            .remembered(pid, &stat)
            .and_then(|known| Some((known, Arc::clone(known.facts.as_ref()?))))
        else {
            let mut looked = self.read_afresh(pid, dir, stat, None);
            self.add_lineage(&mut looked, dir);
            return looked;
        };
        let stale = stat.state == b'Z'
            || !gpus
                .iter()
                .all(|&minor| facts.mappings.maps_gpu_read_write(minor));
        let mut errors = 0;
        if stale {
            match self.references(dir, &stat, None) {
                Ok((descriptors, mappings, failed)) => {
                    let facts = Arc::make_mut(&mut facts);
                    facts.descriptors = descriptors;
                    facts.mappings = mappings;
                    errors += failed;
                }
                Err(unread) => return Looked::failed(unread),
            }
        }
        // The reading shared with the earlier looks is copied only where this stat line and
        // the reads it calls for say something new: a live owner most often says nothing.
        let exiting = self.process_exiting(dir, &stat);
        let wchan = self.wchan(dir, &stat);
        let kill_pending_since =
            self.kill_pending_since(dir, &stat, None, Earlier::of_facts(&facts));
        let ending = ProcessFacts::is_ending(
            exiting,
            char::from(stat.state),
            stat.threads,
            &facts.mappings,
        );
        let ending_since = ending_since(ending, Earlier::of_facts(&facts));
        // `None`: the lineage read before still holds.
        let lineage = match facts.lineage.as_ref() {
            Some(lineage) => self.parent_exit_seen(lineage, &stat).map(|seen| Lineage {
                parent_exit_seen_unix_seconds: Some(seen),
                ..lineage.clone()
            }),
            None => Some(self.lineage(dir, pid, &stat)),
        };
        let unchanged = agrees_with_stat(&facts, &stat)
            && facts.exiting == exiting
            && facts.wchan == wchan
            && facts.kill_pending_since_unix_seconds == kill_pending_since
            && facts.ending_since_unix_millis == ending_since
            && lineage.is_none();
        if !unchanged {
            let facts = Arc::make_mut(&mut facts);
            refresh_from_stat(facts, &stat);
            facts.exiting = exiting;
            facts.wchan = wchan;
            facts.kill_pending_since_unix_seconds = kill_pending_since;
            facts.ending_since_unix_millis = ending_since;
            if lineage.is_some() {
                facts.lineage = lineage;
            }
        }
        Looked {
            remember: Some(known.with_facts(Arc::clone(&facts))),
            facts: Ok(facts),
            errors,
            nested: known.nested,
        }
    }

    /// Everything about process `pid` of the procfs, read now; `descriptors` are passed in
    /// when the caller already scanned them.
    fn read_afresh(
        &self,
        pid: u32,
        dir: &Path,
        stat: Stat,
        descriptors: Option<Descriptors>,
    ) -> Looked {
        let status = match self.root.status(dir) {
            Ok(status) => status,
            Err(error) => return Looked::failed(Unread::from_error(error)),
        };
        let (descriptor_refs, mappings, mut errors) = match self.references(dir, &stat, descriptors)
        {
            Ok(references) => references,
            Err(unread) => return Looked::failed(unread),
        };
        if status.uid.is_none() {
            errors += 1;
        }
        let nested = status.nspid.as_ref().map(|levels| levels.len() >= 2);
        // What an earlier look learnt of the same process, which no reading now can tell
        // again: where it came from, and since when a kill has been pending.
        let earlier = self
            .remembered(pid, &stat)
            .map_or_else(Earlier::default, |known| {
                match (&known.facts, &known.witnessed) {
                    (Some(facts), _) => Earlier::of_facts(facts),
                    (None, Some(witnessed)) => Earlier::of_witnessed(witnessed),
                    (None, None) => Earlier::default(),
                }
            });
        let exiting = self.process_exiting(dir, &stat);
        let ending =
            ProcessFacts::is_ending(exiting, char::from(stat.state), stat.threads, &mappings);
        let facts = ProcessFacts {
            pid,
            local_pid: self.local_pid(pid, dir, Some(&status)),
            start_time_ticks: stat.start_time_ticks,
            comm: stat.comm.clone(),
            state: char::from(stat.state),
            ppid: stat.ppid,
            pgid: stat.pgrp,
            sid: stat.session,
            threads: stat.threads,
            uid: status.uid,
            user: status.uid.and_then(|uid| self.user_name(uid)),
            wchan: self.wchan(dir, &stat),
            exiting,
            ending_since_unix_millis: ending_since(ending, earlier),
            kill_pending_since_unix_seconds: self.kill_pending_since(
                dir,
                &stat,
                Some(&status),
                earlier,
            ),
            lineage: self.lineage_since(earlier, &stat),
            descriptors: descriptor_refs,
            mappings,
            cgroup: self.root.cgroup(dir),
            pid_namespace_init: None,
        };
        let facts = Arc::new(facts);
        Looked {
            remember: Some(Remembered {
                start_time_ticks: stat.start_time_ticks,
                held_nvidia: facts
                    .descriptors
                    .nodes()
                    .is_some_and(|nodes| !nodes.is_empty()),
                kernel_thread: false,
                directory: None,
                facts: Some(Arc::clone(&facts)),
                nested,
                fd_directory: None,
                stat_file: None,
                witnessed: None,
            }),
            facts: Ok(facts),
            errors,
            nested,
        }
    }

    /// A process's descriptors (unless already scanned) and mappings, and how many of the
    /// two could not be read; a process that exits meanwhile is missing.
    fn references(
        &self,
        dir: &Path,
        stat: &Stat,
        descriptors: Option<Descriptors>,
    ) -> Result<(References, References, u64), Unread> {
        let zombie_leader = stat.state == b'Z';
        let mut errors = 0;
        let descriptors = match descriptors {
            Some(descriptors) => Ok(descriptors),
            None => self.descriptors(dir, zombie_leader),
        };
        let (descriptor_refs, files) = match descriptors {
            Ok(descriptors) => (References::Read(descriptors.nodes()), descriptors.files),
            Err(error) if self.exited(dir, stat, &error) => return Err(Unread::Missing),
            Err(_) => {
                errors += 1;
                (References::Unreadable, Vec::new())
            }
        };
        let mappings = match self.mappings(dir, &files, zombie_leader) {
            Ok(nodes) => References::Read(nodes),
            Err(error) if self.exited(dir, stat, &error) => return Err(Unread::Missing),
            Err(_) => {
                errors += 1;
                References::Unreadable
            }
        };
        Ok((descriptor_refs, mappings, errors))
    }

    /// Whether a read of the process whose stat was `stat` failed because it exited: the
    /// kernel denies reads of a process it is reaping, so a denial is an exit when the
    /// process is gone (or its PID is another's) right after.
    fn exited(&self, dir: &Path, stat: &Stat, error: &io::Error) -> bool {
        gone(error)
            || match self.root.stat(dir) {
                Ok(now) => now.start_time_ticks != stat.start_time_ticks,
                Err(error) => gone(&error),
            }
    }

    /// The NVIDIA device files a process holds open (see [`references::descriptors`]).
    fn descriptors(&self, dir: &Path, zombie_leader: bool) -> io::Result<Descriptors> {
        references::descriptors(
            &self.root.device_prefix,
            dir,
            zombie_leader,
            self.placement.count_denied_links,
        )
    }

    /// The NVIDIA device files a process maps (see [`references::mappings`]).
    fn mappings(&self, dir: &Path, files: &[OpenFile], zombie_leader: bool) -> io::Result<NodeSet> {
        references::mappings(&self.root.device_prefix, dir, files, zombie_leader)
    }

    fn user_name(&self, uid: u32) -> Option<String> {
        self.passwd
            .get_or_init(|| {
                // The password file init sees (through /proc/1/root, which in a container
                // with the host's procfs is the host's), else ours.
                fs::read_to_string(self.root.root.join("1/root/etc/passwd"))
                    .or_else(|_| fs::read_to_string("/etc/passwd"))
                    .ok()
            })
            .as_deref()
            .and_then(|passwd| parse::passwd_user(passwd, uid))
    }
}

/// Whether a new stat line says of a remembered process what it said before: the fields
/// [`refresh_from_stat`] brings up to date.
fn agrees_with_stat(facts: &ProcessFacts, stat: &Stat) -> bool {
    facts.comm == stat.comm
        && facts.state == char::from(stat.state)
        && (facts.ppid, facts.pgid, facts.sid, facts.threads)
            == (stat.ppid, stat.pgrp, stat.session, stat.threads)
}

/// The fields of a remembered process that a new stat line brings up to date.
fn refresh_from_stat(facts: &mut ProcessFacts, stat: &Stat) {
    facts.comm.clone_from(&stat.comm);
    facts.state = char::from(stat.state);
    facts.ppid = stat.ppid;
    facts.pgid = stat.pgrp;
    facts.sid = stat.session;
    facts.threads = stat.threads;
}

/// What earlier looks learnt of a process that no reading now can tell again: from the
/// last reading of the same process, or from what an exporter saw before this one (the
/// witness state); nothing for a process never seen before.
#[derive(Debug, Clone, Copy, Default)]
struct Earlier<'a> {
    lineage: Option<&'a Lineage>,
    kill_pending_since: Option<u64>,
    ending_since: Option<u64>,
}

impl<'a> Earlier<'a> {
    /// What the last reading `facts` learnt.
    fn of_facts(facts: &'a ProcessFacts) -> Earlier<'a> {
        Earlier {
            lineage: facts.lineage.as_ref(),
            kill_pending_since: facts.kill_pending_since_unix_seconds,
            ending_since: facts.ending_since_unix_millis,
        }
    }

    /// What an exporter saw before this one.
    fn of_witnessed(witnessed: &'a WitnessedProcess) -> Earlier<'a> {
        Earlier {
            lineage: witnessed.lineage.as_ref(),
            kill_pending_since: witnessed.kill_pending_since_unix_seconds,
            ending_since: witnessed.ending_since_unix_millis,
        }
    }
}

/// Since when a process that is `ending` (see [`ProcessFacts::ending`]) has been seen so:
/// carried from `earlier`, or now; `None` while it is not ending.
fn ending_since(ending: bool, earlier: Earlier) -> Option<u64> {
    ending.then(|| earlier.ending_since.unwrap_or_else(now_unix_millis))
}

#[cfg(test)]
mod tests {
    use super::fake_proc::FakeProc;
    use super::*;
    use crate::observe::procfs::NarrowAccess;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_remembered_process_is_served_while_its_start_time_holds() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut earlier_looks = EarlierLooks::new();
        assert!(proc
            .read_owner(&mut earlier_looks, 100, &[0])
            .mappings
            .has_gpu(0));
        // Same process (same start), stopped since; its maps are not read again (here
        // they would say nothing), its stat is.
        proc.process(100, 500, 'T', &[]);
        let facts = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert!(facts.mappings.has_gpu(0), "served from memory");
        assert_eq!(facts.state, 'T', "the stat is read each time");
    }

    #[test]
    fn another_start_time_under_the_pid_is_a_stranger_read_afresh() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut earlier_looks = EarlierLooks::new();
        proc.read_owner(&mut earlier_looks, 100, &[0]);
        // The PID came round again: a process that maps nothing.
        proc.process(100, 900, 'S', &[]);
        let facts = proc.read_owner(&mut earlier_looks, 100, &[0]);
        assert_eq!(facts.start_time_ticks, 900);
        assert!(!facts.mappings.has_gpu(0), "{:?}", facts.mappings);
    }

    #[test]
    fn an_owner_without_a_remembered_context_on_a_gpu_is_read_again() {
        // A verdict against an owner never rests on earlier looks: with no remembered mapping of
        // a GPU it is listed on, its mappings are read now.
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut earlier_looks = EarlierLooks::new();
        proc.read_owner(&mut earlier_looks, 100, &[0]);
        proc.process(100, 500, 'S', &[0, 1]);
        assert!(proc
            .read_owner(&mut earlier_looks, 100, &[0, 1])
            .mappings
            .has_gpu(1));
    }

    #[test]
    fn how_each_node_is_mapped_is_read_with_the_mappings() {
        // The MPS control daemon as the H200 showed it: GPU 0's node write-only (twice),
        // nvidiactl read-only; and a context: GPU 0's node read-write beside write-only.
        let proc = FakeProc::new();
        proc.process(300, 500, 'S', &[]);
        let dir = proc.dir.path().join("300");
        symlink("/dev/nvidia0", dir.join("fd/4")).unwrap();
        fs::write(
            dir.join("maps"),
            "7f3c28000000-7f3c28001000 -w-s 00000000 00:05 2000 /dev/nvidia0\n\
             7f3c28200000-7f3c28201000 -w-s 00000000 00:05 2000 /dev/nvidia0\n\
             7f3c28400000-7f3c28401000 r--s 00000000 00:05 1065 /dev/nvidiactl\n",
        )
        .unwrap();
        let mut earlier_looks = EarlierLooks::new();
        let daemon = proc.read_owner(&mut earlier_looks, 300, &[0]);
        let nodes = daemon.mappings.nodes().expect("read").clone();
        assert_eq!(nodes.gpus, [0]);
        assert!(nodes.control);
        assert!(!nodes.maps_gpu_read_write(0));
        assert_eq!(
            nodes.gpu_without_read_write(0),
            Some(NarrowAccess::WriteOnly)
        );
        assert_eq!(
            nodes.control_without_read_write,
            Some(NarrowAccess::ReadOnly)
        );
        // Without a context on the GPU it is listed on, it is read again each time.
        proc.process(300, 500, 'S', &[0]);
        let context = proc.read_owner(&mut earlier_looks, 300, &[0]);
        assert!(context.mappings.maps_gpu_read_write(0));
        let nodes = context.mappings.nodes().unwrap();
        assert!(nodes.gpus_without_read_write.is_empty());
        assert_eq!(nodes.control_without_read_write, None);
    }
}
