//! The one reader of `/proc`: one walk over its processes, one descriptor scanner, one
//! reader of stat, status and maps, used for NVML's owners and for the holder scan alike.
//!
//! The holder scan looks at every process for NVIDIA device files: it finds the live
//! process that keeps a dead owner's memory alive, which NVML never names, and the NVML
//! clients that hold the same files without a context. Each holder is read whole
//! (descriptors and mappings), as an owner is.

use super::memory::{open_stat_file, read_held_stat, Memory, Remembered};
use super::parse::{self, Stat, Status, PF_EXITING};
use super::pidns::NamespaceInits;
use super::placement::{Placement, Position};
use super::reading::{
    HolderScan, Leader, Lineage, NodeSet, ProcessFacts, ProcfsView, References, Relative,
};
use super::references::{self, Descriptors, FdDirectory, OpenFile};
use super::root::{gone, ProcRoot, Unread};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;
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

/// One look at a process: what was found, how many entries could not be read, and what
/// to remember of it.
#[derive(Debug)]
pub struct Looked {
    /// The facts, or why there are none.
    pub(super) facts: Result<ProcessFacts, Unread>,
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
pub struct Reader<'a> {
    root: &'a ProcRoot,
    placement: Placement,
    /// What earlier looks found.
    previous: &'a Memory,
    /// The host's password file, read once when a user name is first needed.
    passwd: OnceLock<Option<String>>,
    /// Our PIDs to the procfs's, when it shows another namespace; built on first need.
    translation: OnceLock<HashMap<u32, u32>>,
    /// The owners read in this collection.
    owners_read: OwnersRead,
    /// Whether owners' stat files are held open between looks.
    hold_stat_files: bool,
}

/// The NVML-listed owners read in this collection, by PID of the procfs: their start time
/// and the minor numbers of the GPUs NVML lists them on.
pub(crate) type OwnersRead = HashMap<u32, (u64, Vec<u32>)>;

/// An empty memory, for a reader that starts from nothing.
static NOTHING_REMEMBERED: std::sync::LazyLock<Memory> = std::sync::LazyLock::new(Memory::new);

impl<'a> Reader<'a> {
    /// A reader of `root` that remembers nothing, locating the exporter in it.
    pub fn new(root: &'a ProcRoot) -> Reader<'a> {
        Reader::with_memory(root, Placement::locate(root), &NOTHING_REMEMBERED)
    }

    /// A reader of `root` from `placement` that serves what `previous` remembers of a
    /// process while its start time is the same.
    pub fn with_memory(
        root: &'a ProcRoot,
        placement: Placement,
        previous: &'a Memory,
    ) -> Reader<'a> {
        Reader {
            root,
            placement,
            previous,
            passwd: OnceLock::new(),
            translation: OnceLock::new(),
            owners_read: OwnersRead::new(),
            hold_stat_files: false,
        }
    }

    /// This reader, holding the stat files of the owners it reads open for the next look
    /// (for a long-running exporter with a bounded number of owners).
    pub(super) fn holding_stat_files(mut self, hold: bool) -> Reader<'a> {
        self.hold_stat_files = hold;
        self
    }

    /// This reader, told which owners were read in this collection (with their readings
    /// in its memory): the holder scan takes those readings as they are when they can
    /// blame the owner for no GPU, instead of reading every owner's mappings again.
    pub(super) fn with_owners_read(mut self, owners_read: OwnersRead) -> Reader<'a> {
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
    /// have minor numbers `gpus`. What cannot change for a process is served from memory;
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
            .and_then(|known| Some((known, known.facts.clone()?)))
        else {
            let mut looked = self.read_afresh(pid, dir, stat, None);
            self.add_lineage(&mut looked, dir);
            return looked;
        };
        let stale = stat.state == b'Z'
            || !gpus
                .iter()
                .all(|&minor| facts.mappings.maps_gpu_read_write(minor));
        refresh_from_stat(&mut facts, &stat);
        facts.exiting = self.process_exiting(dir, &stat);
        let mut errors = 0;
        if stale {
            match self.references(dir, &stat, None) {
                Ok((descriptors, mappings, failed)) => {
                    facts.descriptors = descriptors;
                    facts.mappings = mappings;
                    errors += failed;
                }
                Err(unread) => return Looked::failed(unread),
            }
        }
        facts.wchan = self.wchan(dir, &stat);
        facts.kill_pending_since_unix_seconds =
            self.kill_pending_since(dir, &stat, None, Some(&facts));
        facts.lineage = match facts.lineage.take() {
            Some(lineage) => Some(self.parent_exit(lineage, &stat)),
            None => Some(self.lineage(dir, pid, &stat)),
        };
        Looked {
            remember: Some(known.with_facts(facts.clone())),
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
            .and_then(|known| known.facts.as_ref());
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
            exiting: self.process_exiting(dir, &stat),
            kill_pending_since_unix_seconds: self.kill_pending_since(
                dir,
                &stat,
                Some(&status),
                earlier,
            ),
            lineage: earlier.and_then(|facts| facts.lineage.clone()),
            descriptors: descriptor_refs,
            mappings,
            cgroup: self.root.cgroup(dir),
            pid_namespace_init: None,
        };
        Looked {
            remember: Some(Remembered {
                start_time_ticks: stat.start_time_ticks,
                held_nvidia: facts
                    .descriptors
                    .nodes()
                    .is_some_and(|nodes| !nodes.is_empty()),
                kernel_thread: false,
                facts: Some(facts.clone()),
                nested,
                fd_directory: None,
                stat_file: None,
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

    /// An NVML-listed owner's reading as [`Reader::read_owner`] left it in this
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

    /// The kernel function a process in uninterruptible sleep waits in.
    fn wchan(&self, dir: &Path, stat: &Stat) -> Option<String> {
        (stat.state == b'D')
            .then(|| fs::read_to_string(dir.join("wchan")).ok())
            .flatten()
            .filter(|name| !name.is_empty() && name != "0")
    }

    /// Whether the whole process is in its exit path: its main thread has begun to exit
    /// (`PF_EXITING`) and, when that thread is already a zombie, every other thread too.
    /// After a SIGKILL every thread exits, and the driver frees the context with the last
    /// (an H200's and an H100's PyTorch owners showed a zombie main thread for most of the
    /// 0.12-0.20 s); a main thread that called pthread_exit leaves the others running with
    /// the context. Threads are read only for a zombie main thread.
    fn process_exiting(&self, dir: &Path, stat: &Stat) -> bool {
        if stat.flags & PF_EXITING == 0 {
            return false;
        }
        if stat.state != b'Z' {
            return true;
        }
        match fs::read_dir(dir.join("task")) {
            // A thread that is gone by the time it is read has exited.
            Ok(threads) => threads.flatten().all(|thread| {
                self.root
                    .stat(&thread.path())
                    .map_or(true, |thread| thread.flags & PF_EXITING != 0)
            }),
            Err(_) => false,
        }
    }

    /// Since when a process in uninterruptible sleep has had a SIGKILL pending, carried
    /// from `earlier` (the last reading of the same process) or now; `None` outside state
    /// `D` or without a pending kill. Its status is read only in state `D`.
    fn kill_pending_since(
        &self,
        dir: &Path,
        stat: &Stat,
        status: Option<&Status>,
        earlier: Option<&ProcessFacts>,
    ) -> Option<u64> {
        if stat.state != b'D' {
            return None;
        }
        let status = self.status_of(dir, status)?;
        status.kill_pending().then(|| {
            earlier
                .and_then(|facts| facts.kill_pending_since_unix_seconds)
                .unwrap_or_else(now_unix_seconds)
        })
    }

    /// An owner read afresh, with where it came from.
    fn add_lineage(&self, looked: &mut Looked, dir: &Path) {
        let Ok(facts) = looked.facts.as_mut() else {
            return;
        };
        if facts.lineage.is_none() {
            let stat = Stat {
                comm: facts.comm.clone(),
                state: facts.state as u8,
                ppid: facts.ppid,
                pgrp: facts.pgid,
                session: facts.sid,
                flags: 0,
                threads: facts.threads,
                start_time_ticks: facts.start_time_ticks,
            };
            facts.lineage = Some(self.lineage(dir, facts.pid, &stat));
        }
        if let (Some(remember), Ok(facts)) = (looked.remember.as_mut(), looked.facts.as_ref()) {
            *remember = remember.with_facts(facts.clone());
        }
    }

    /// Where owner `pid` (stat `stat`) came from, read now: its parent, and its process
    /// group's and session's leaders (their PIDs cannot be another process's while the
    /// group or session lives); its command line only when its group's leader is gone.
    fn lineage(&self, dir: &Path, pid: u32, stat: &Stat) -> Lineage {
        let relative = |relative_pid: u32| self.root.stat(&self.root.pid_dir(relative_pid)).ok();
        let parent_stat = (stat.ppid != 0).then(|| relative(stat.ppid)).flatten();
        let leader = |leader_pid: u32| {
            if leader_pid == pid {
                return Leader::Itself;
            }
            if leader_pid == 0 {
                return Leader::Unknown;
            }
            match self.root.stat(&self.root.pid_dir(leader_pid)) {
                Ok(found) if found.start_time_ticks <= stat.start_time_ticks => Leader::Alive,
                Ok(_) => Leader::Gone,
                Err(error) if gone(&error) => Leader::Gone,
                Err(_) => Leader::Unknown,
            }
        };
        let group_leader = leader(stat.pgrp);
        let spawned_worker = group_leader == Leader::Gone
            && fs::read(dir.join("cmdline")).is_ok_and(|line| parse::spawned_worker(&line));
        Lineage {
            parent: Relative {
                pid: stat.ppid,
                start_time_ticks: parent_stat.as_ref().map(|parent| parent.start_time_ticks),
                pgid: parent_stat.as_ref().map(|parent| parent.pgrp),
                comm: parent_stat.map(|parent| parent.comm),
            },
            parent_exit_seen_unix_seconds: None,
            group_leader,
            session_leader: leader(stat.session),
            spawned_worker,
        }
    }

    /// `lineage` brought up to date by the owner's stat now: a parent PID other than the
    /// one first read means the parent exited (the kernel hands a child to a subreaper or
    /// PID 1 only then); its PID is read to be sure, and the moment is kept.
    fn parent_exit(&self, mut lineage: Lineage, stat: &Stat) -> Lineage {
        let Some(start) = lineage.parent.start_time_ticks else {
            return lineage;
        };
        if lineage.parent_exit_seen_unix_seconds.is_some() || stat.ppid == lineage.parent.pid {
            return lineage;
        }
        let parent_lives = match self.root.stat(&self.root.pid_dir(lineage.parent.pid)) {
            Ok(now) => now.start_time_ticks == start,
            Err(error) => !gone(&error),
        };
        if !parent_lives {
            lineage.parent_exit_seen_unix_seconds = Some(now_unix_seconds());
        }
        lineage
    }

    /// One process of the holder scan: `None` when it holds no NVIDIA file (or is gone),
    /// else its facts; with what to remember of it. A process remembered with no NVIDIA
    /// file, the same start time and as many descriptors as then is not listed again.
    fn scan_one(&self, pid: u32) -> Scanned {
        if let Some((known, facts)) = self.owner_reading(pid) {
            return Scanned::Holder(Box::new(facts.clone()), known.unchanged());
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
            stat_file: None,
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
                        Box::new(facts),
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

    /// Scan every process but the exporter for NVIDIA device files, stopping at `budget`.
    pub fn scan_holders(&self, budget: Duration) -> HolderScan {
        self.scan_and_remember(Instant::now() + budget).0
    }

    /// Scan every process but the exporter for NVIDIA device files, stopping at
    /// `deadline`; with what to remember of every process seen, for the next scan.
    pub fn scan_and_remember(&self, deadline: Instant) -> (HolderScan, Vec<(u32, Remembered)>) {
        let started = Instant::now();
        let mut inits = NamespaceInits::new(self.root, deadline);
        let pids: Vec<u32> = match self.root.pids() {
            Ok(pids) => pids
                .into_iter()
                .filter(|&pid| pid != self.placement.own_pid)
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
            .filter(|pid| self.previous.contains_key(pid))
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

/// Now, in seconds since the Unix epoch.
fn now_unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::procfs::NarrowAccess;
    use std::os::unix::fs::symlink;

    /// A procfs tree with the files the reader reads, for one process at a time.
    struct FakeProc {
        dir: tempfile::TempDir,
        root: ProcRoot,
    }

    impl FakeProc {
        fn new() -> FakeProc {
            let dir = tempfile::tempdir().unwrap();
            let root = ProcRoot {
                root: dir.path().to_path_buf(),
                device_prefix: b"/dev/nvidia".to_vec(),
            };
            FakeProc { dir, root }
        }

        /// Process `pid` started at `start` ticks, in `state`, holding and mapping the
        /// GPU nodes `gpus` (and the control node).
        fn process(&self, pid: u32, start: u64, state: char, gpus: &[u32]) {
            let dir = self.dir.path().join(pid.to_string());
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("fd")).unwrap();
            fs::write(
                dir.join("stat"),
                format!("{pid} (python3) {state} 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0"),
            )
            .unwrap();
            fs::write(
                dir.join("status"),
                "Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t1\n",
            )
            .unwrap();
            symlink("/dev/nvidiactl", dir.join("fd/3")).unwrap();
            let mut maps =
                String::from("7f00a0000000-7f00a0001000 rw-s 00000000 00:05 1065 /dev/nvidiactl\n");
            for (fd, gpu) in gpus.iter().enumerate() {
                symlink(
                    format!("/dev/nvidia{gpu}"),
                    dir.join(format!("fd/{}", fd + 4)),
                )
                .unwrap();
                maps.push_str(&format!(
                    "7f00b{gpu}000000-7f00b{gpu}001000 rw-s 00000000 00:05 {} /dev/nvidia{gpu}\n",
                    2000 + gpu
                ));
            }
            fs::write(dir.join("maps"), maps).unwrap();
        }

        fn placement(&self) -> Placement {
            Placement {
                own_pid: u32::MAX,
                position: Position::Own,
                count_denied_links: true,
            }
        }

        /// Read owner `pid` listed on `gpus` with `memory`, and remember what was read.
        fn read_owner(&self, memory: &mut Memory, pid: u32, gpus: &[u32]) -> ProcessFacts {
            let reader = Reader::with_memory(&self.root, self.placement(), memory);
            let looked = reader.read_owner(pid, gpus);
            let facts = looked.facts.expect("the process");
            let remember = looked.remember.expect("something to remember");
            drop(reader);
            memory.insert(pid, remember);
            facts
        }
    }

    #[test]
    fn an_owner_remembers_its_first_parent_and_sees_it_exit() {
        let proc = FakeProc::new();
        // A server (PID 50) and its worker (PID 100) in the server's group, as first read.
        proc.process(50, 400, 'S', &[]);
        proc.process(100, 500, 'S', &[0]);
        let stat = |pid: u32, ppid: u32, start: u64| {
            fs::write(
                proc.dir.path().join(format!("{pid}/stat")),
                format!("{pid} (python3) S {ppid} 50 50 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0"),
            )
            .unwrap();
        };
        stat(50, 1, 400);
        stat(100, 50, 500);
        let mut memory = Memory::new();
        let first = proc.read_owner(&mut memory, 100, &[0]);
        let lineage = first.lineage.expect("read with the owner");
        assert_eq!(
            (lineage.parent.pid, lineage.parent.start_time_ticks),
            (50, Some(400))
        );
        assert_eq!(lineage.group_leader, Leader::Alive);
        assert_eq!(lineage.parent_exit_seen_unix_seconds, None);
        // The parent re-execs: the same PID and start time, another name. Not an exit.
        fs::write(
            proc.dir.path().join("50/stat"),
            "50 (server-v2) S 1 50 50 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 400 0",
        )
        .unwrap();
        let again = proc.read_owner(&mut memory, 100, &[0]).lineage.unwrap();
        assert_eq!(again.parent_exit_seen_unix_seconds, None);
        // The server is killed: the worker is adopted by PID 1, and the exit is seen once.
        fs::remove_dir_all(proc.dir.path().join("50")).unwrap();
        stat(100, 1, 500);
        let gone = proc.read_owner(&mut memory, 100, &[0]).lineage.unwrap();
        let seen = gone
            .parent_exit_seen_unix_seconds
            .expect("the exit is seen");
        assert_eq!(gone.parent.pid, 50, "the parent as first seen");
        let later = proc.read_owner(&mut memory, 100, &[0]).lineage.unwrap();
        assert_eq!(later.parent_exit_seen_unix_seconds, Some(seen));
    }

    #[test]
    fn a_zombie_main_thread_is_exiting_only_when_every_thread_is() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'Z', &[0]);
        let dir = proc.dir.path().join("100");
        let thread = |tid: u32, state: char, flags: u32| {
            let task = dir.join(format!("task/{tid}"));
            fs::create_dir_all(&task).unwrap();
            fs::write(
                task.join("stat"),
                format!(
                    "{tid} (python3) {state} 1 100 100 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 3 0 500 0"
                ),
            )
            .unwrap();
        };
        let exiting = 4_194_560 | PF_EXITING;
        fs::write(
            dir.join("stat"),
            format!("100 (python3) Z 1 100 100 0 -1 {exiting} 0 0 0 0 0 0 0 0 20 0 3 0 500 0"),
        )
        .unwrap();
        thread(100, 'Z', exiting);
        thread(101, 'S', 4_194_560);
        let reader = Reader::with_memory(&proc.root, proc.placement(), &NOTHING_REMEMBERED);
        let stat = proc.root.stat(&dir).unwrap();
        // pthread_exit of the main thread: another thread runs on with the context.
        assert!(!reader.process_exiting(&dir, &stat));
        // SIGKILL: every thread exits.
        thread(101, 'D', exiting);
        assert!(reader.process_exiting(&dir, &stat));
    }

    #[test]
    fn a_pending_kill_in_uninterruptible_sleep_keeps_its_first_sighting() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'D', &[0]);
        let status = proc.dir.path().join("100/status");
        fs::write(
            &status,
            "Name:\tpython3\nUid:\t0\t0\t0\t0\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n",
        )
        .unwrap();
        let mut memory = Memory::new();
        let first = proc.read_owner(&mut memory, 100, &[0]);
        let since = first.kill_pending_since_unix_seconds.expect("killed");
        let again = proc.read_owner(&mut memory, 100, &[0]);
        assert_eq!(again.kill_pending_since_unix_seconds, Some(since));
        // Out of uninterruptible sleep, no kill is waiting.
        proc.process(100, 500, 'S', &[0]);
        assert_eq!(
            proc.read_owner(&mut memory, 100, &[0])
                .kill_pending_since_unix_seconds,
            None
        );
    }

    #[test]
    fn a_remembered_process_is_served_while_its_start_time_holds() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut memory = Memory::new();
        assert!(proc.read_owner(&mut memory, 100, &[0]).mappings.has_gpu(0));
        // Same process (same start), stopped since; its maps are not read again (here
        // they would say nothing), its stat is.
        proc.process(100, 500, 'T', &[]);
        let facts = proc.read_owner(&mut memory, 100, &[0]);
        assert!(facts.mappings.has_gpu(0), "served from memory");
        assert_eq!(facts.state, 'T', "the stat is read each time");
    }

    #[test]
    fn another_start_time_under_the_pid_is_a_stranger_read_afresh() {
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut memory = Memory::new();
        proc.read_owner(&mut memory, 100, &[0]);
        // The PID came round again: a process that maps nothing.
        proc.process(100, 900, 'S', &[]);
        let facts = proc.read_owner(&mut memory, 100, &[0]);
        assert_eq!(facts.start_time_ticks, 900);
        assert!(!facts.mappings.has_gpu(0), "{:?}", facts.mappings);
    }

    #[test]
    fn an_owner_without_a_remembered_context_on_a_gpu_is_read_again() {
        // A verdict against an owner never rests on memory: with no remembered mapping of
        // a GPU it is listed on, its mappings are read now.
        let proc = FakeProc::new();
        proc.process(100, 500, 'S', &[0]);
        let mut memory = Memory::new();
        proc.read_owner(&mut memory, 100, &[0]);
        proc.process(100, 500, 'S', &[0, 1]);
        assert!(proc
            .read_owner(&mut memory, 100, &[0, 1])
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
        let mut memory = Memory::new();
        let daemon = proc.read_owner(&mut memory, 300, &[0]);
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
        let context = proc.read_owner(&mut memory, 300, &[0]);
        assert!(context.mappings.maps_gpu_read_write(0));
        let nodes = context.mappings.nodes().unwrap();
        assert!(nodes.gpus_without_read_write.is_empty());
        assert_eq!(nodes.control_without_read_write, None);
    }

    #[test]
    fn the_scan_skips_a_process_remembered_without_nvidia_files() {
        let proc = FakeProc::new();
        let dir = proc.dir.path().join("200");
        proc.process(200, 500, 'S', &[]);
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        let placement = proc.placement();
        let empty = Memory::new();
        let first = Reader::with_memory(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(200) else {
            panic!("no NVIDIA file yet")
        };
        let memory: Memory = [(200, remember)].into();
        // Same process, same number of descriptors: not listed again, so a target changed
        // behind the cache's back goes unseen (a real process's count changes when it
        // opens a device).
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/nvidia0", dir.join("fd/3")).unwrap();
        let reader = Reader::with_memory(&proc.root, placement, &memory);
        assert!(matches!(reader.scan_one(200), Scanned::Nothing(_)));
        // A new start time under the PID is listed afresh.
        proc.process(200, 900, 'S', &[0]);
        assert!(matches!(reader.scan_one(200), Scanned::Holder(..)));
    }

    #[test]
    fn a_later_scan_knows_an_unchanged_process_by_its_descriptor_directory_alone() {
        let proc = FakeProc::new();
        let dir = proc.dir.path().join("300");
        proc.process(300, 500, 'S', &[]);
        fs::remove_file(dir.join("fd/3")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        let placement = proc.placement();
        let empty = Memory::new();
        let first = Reader::with_memory(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(300) else {
            panic!("no NVIDIA file")
        };
        let memory: Memory = [(300, remember)].into();
        // Its stat is not read again: were it, this line would make it unreadable.
        fs::write(dir.join("stat"), "not a stat line").unwrap();
        let reader = Reader::with_memory(&proc.root, placement, &memory);
        assert!(matches!(reader.scan_one(300), Scanned::Nothing(_)));
        // Another directory under the PID is another process: read, and unreadable here.
        fs::rename(dir.join("fd"), dir.join("fd-then")).unwrap();
        fs::create_dir(dir.join("fd")).unwrap();
        symlink("/dev/null", dir.join("fd/3")).unwrap();
        assert!(matches!(reader.scan_one(300), Scanned::Denied));
    }

    #[test]
    fn a_kernel_thread_is_known_by_its_descriptor_directory_too() {
        let proc = FakeProc::new();
        let dir = proc.dir.path().join("2");
        fs::create_dir_all(dir.join("fd")).unwrap();
        // kthreadd's line: PF_KTHREAD (0x200000) among its flags, no descriptors.
        fs::write(
            dir.join("stat"),
            "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0",
        )
        .unwrap();
        let placement = proc.placement();
        let empty = Memory::new();
        let first = Reader::with_memory(&proc.root, placement, &empty);
        let Scanned::Nothing(remember) = first.scan_one(2) else {
            panic!("a kernel thread holds nothing")
        };
        let memory: Memory = [(2, remember)].into();
        fs::write(dir.join("stat"), "not a stat line").unwrap();
        let reader = Reader::with_memory(&proc.root, placement, &memory);
        assert!(matches!(reader.scan_one(2), Scanned::Nothing(_)));
    }
}
