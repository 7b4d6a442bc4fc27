//! The one reader of `/proc`: one walk over its processes, one descriptor scanner, one
//! reader of stat, status and maps, used for NVML's owners and for the holder scan alike.
//!
//! What a real H200 showed (see the project's GPU facts) decides what is read: every NVML
//! client holds the GPU's device files open, but only a CUDA context, own or inherited
//! by fork, *maps* them shared. So each process is read for both: the descriptors say
//! who holds a file, the mappings say who holds a context.

use super::cgroup::{parse_cgroup_file, MAX_CGROUP_FILE_BYTES};
use super::parse::{self, NvidiaNode, Stat, Status};
use super::{NodeSet, ProcessFacts, ProcfsView, References};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{self, Read};
use std::os::linux::fs::MetadataExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;

/// The inode of the initial PID namespace, fixed by the kernel (`PROC_PID_INIT_INO`).
const HOST_PID_NAMESPACE: &str = "pid:[4026531836]";

/// The device-node prefix NVIDIA's driver uses; only tests point it elsewhere.
pub const DEVICE_PREFIX: &[u8] = b"/dev/nvidia";

/// Where to read processes from.
#[derive(Debug, Clone)]
pub struct ProcRoot {
    /// The procfs mount (`/proc` on a host, `/host/proc` in a container).
    pub root: PathBuf,
    /// Byte prefix of NVIDIA device paths (see [`parse::nvidia_node`]).
    pub device_prefix: Vec<u8>,
}

/// Why a process could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// It does not exist (or exited while it was read).
    Missing,
    /// It exists but its entry could not be read; the error in one line.
    Unreadable(String),
}

impl ProcRoot {
    /// The process directory of `pid`.
    pub fn pid_dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// Every PID the procfs lists: the one walk over processes.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        Ok(fs::read_dir(&self.root)?
            .flatten()
            .filter_map(|entry| parse::pid_name(entry.file_name().as_bytes()))
            .collect())
    }

    /// The PID the procfs gives the process reading it (`{procfs}/self`): ours in our
    /// namespace, another number when the procfs belongs to another PID namespace.
    pub fn self_pid(&self) -> Option<u32> {
        let link = fs::read_link(self.root.join("self")).ok()?;
        parse::pid_name(link.as_os_str().as_bytes())
    }

    /// Whether we run in the host's PID namespace; `None` when it cannot be read.
    pub fn host_pid_namespace(&self) -> Option<bool> {
        let link = fs::read_link(self.root.join("self/ns/pid")).ok()?;
        Some(link.as_os_str() == HOST_PID_NAMESPACE)
    }

    /// When the host booted, in seconds since the Unix epoch.
    pub fn boot_time(&self) -> Option<u64> {
        parse::boot_time(&fs::read(self.root.join("stat")).ok()?)
    }

    /// The host's name, as the kernel knows it.
    pub fn hostname(&self) -> Option<String> {
        let name = fs::read_to_string(self.root.join("sys/kernel/hostname")).ok()?;
        Some(name.trim().to_string()).filter(|name| !name.is_empty())
    }

    /// The stat line of a process or thread directory.
    pub fn stat(&self, dir: &Path) -> io::Result<Stat> {
        parse::stat(&fs::read(dir.join("stat"))?).ok_or_else(malformed)
    }

    /// The status file of a process or thread directory.
    pub fn status(&self, dir: &Path) -> io::Result<Status> {
        Ok(parse::status(&fs::read(dir.join("status"))?))
    }

    /// The inode of the PID namespace of the process whose directory is `dir`; reading
    /// another user's needs CAP_SYS_PTRACE.
    pub fn pid_namespace(&self, dir: &Path) -> Option<u64> {
        let link = fs::read_link(dir.join("ns/pid")).ok()?;
        parse::namespace_inode(link.as_os_str().as_bytes())
    }

    /// The container and pod `dir`'s cgroup names; nothing when its cgroup file cannot be
    /// read (every user may read it, so only a process that exited cannot).
    fn cgroup(&self, dir: &Path) -> super::CgroupAttribution {
        let mut content = Vec::new();
        let read = fs::File::open(dir.join("cgroup")).and_then(|file| {
            file.take(MAX_CGROUP_FILE_BYTES as u64)
                .read_to_end(&mut content)
        });
        match read {
            Ok(_) => parse_cgroup_file(&content),
            Err(_) => super::CgroupAttribution::default(),
        }
    }
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed stat line")
}

/// Where the exporter stands relative to the procfs it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// The procfs shows our own PID namespace.
    Own,
    /// It shows an ancestor namespace, in which ours is `namespace`, `level` levels down.
    Foreign { level: usize, namespace: u64 },
    /// It shows another namespace and ours cannot be located in it.
    Lost,
}

/// The exporter's own place in the procfs it reads, found once: a process does not move
/// between PID namespaces or change its capabilities.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// The procfs's PID for the exporter itself.
    own_pid: u32,
    position: Position,
    /// Whether a denied `readlink` of a descriptor makes the process unreadable. Listing
    /// another user's descriptors needs CAP_DAC_READ_SEARCH, reading where they point
    /// CAP_SYS_PTRACE: an exporter with only the first may list every process and read no
    /// link, and would miss holders in a scan that looks complete. With CAP_SYS_PTRACE a
    /// denial comes from beyond what capabilities grant (a process of a parent user
    /// namespace, such as a sandbox's own init) and is passed over.
    count_denied_links: bool,
}

impl Placement {
    /// Locate the exporter in `root`.
    pub fn locate(root: &ProcRoot) -> Placement {
        let ours = std::process::id();
        let own_pid = root.self_pid().unwrap_or(ours);
        let position = if own_pid == ours {
            Position::Own
        } else {
            let dir = root.pid_dir(own_pid);
            let level = root
                .status(&dir)
                .ok()
                .and_then(|status| status.nspid)
                .map(|levels| levels.len() - 1);
            match (level, root.pid_namespace(&dir)) {
                (Some(level), Some(namespace)) => Position::Foreign { level, namespace },
                _ => Position::Lost,
            }
        };
        let count_denied_links = fs::read(root.root.join("self/status"))
            .ok()
            .and_then(|status| parse::status(&status).effective_capabilities)
            .is_none_or(|caps| caps & (1 << parse::CAP_SYS_PTRACE) == 0);
        Placement {
            own_pid,
            position,
            count_denied_links,
        }
    }
}

/// What the exporter keeps of a process from one look to the next. A PID names a
/// process only with its start time, so an entry serves only the process it was read
/// from: any other start time under the PID is a stranger, read afresh.
#[derive(Debug, Clone)]
pub struct Remembered {
    start_time_ticks: u64,
    /// The last full reading, when one was made (holders and owners).
    facts: Option<ProcessFacts>,
    /// Whether it lives in a PID namespace nested in the procfs's: only then is its
    /// container's PID 1 looked up again (`None`: not known yet).
    nested: Option<bool>,
    /// Its descriptor count at the last scan; with the start time, what tells the scan
    /// that a process without NVIDIA files still has none.
    open_files: Option<u64>,
    /// Whether the last scan found NVIDIA files among its descriptors.
    held_nvidia: bool,
    /// An owner's stat file, held open: reading it again is one system call instead of
    /// three, and once the process is gone a read fails (ESRCH) rather than show another
    /// process that got its PID.
    stat_file: Option<Arc<fs::File>>,
}

impl Remembered {
    /// Whether it lives in a PID namespace nested in the procfs's (`None`: not known).
    pub fn nested(&self) -> Option<bool> {
        self.nested
    }

    /// Close the held stat file of a process that is no longer an owner.
    pub fn let_go_of_stat_file(&mut self) {
        self.stat_file = None;
    }

    /// This entry brought up to date by a newer look at the same PID: the newer wins, but
    /// a full reading it did not redo is kept while the process is the same.
    pub fn updated_by(self, newer: Remembered) -> Remembered {
        if self.start_time_ticks != newer.start_time_ticks {
            return newer;
        }
        Remembered {
            facts: newer.facts.or(self.facts),
            nested: newer.nested.or(self.nested),
            open_files: newer.open_files.or(self.open_files),
            stat_file: newer.stat_file.or(self.stat_file),
            ..newer
        }
    }
}

/// Processes remembered from earlier looks, by the procfs's PID.
pub type Memory = HashMap<u32, Remembered>;

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u32 = 0x0020_0000;

/// One look at a process: what was found, how many entries could not be read, and what
/// to remember of it.
#[derive(Debug)]
pub struct Looked {
    /// The facts, or why there are none.
    pub facts: Result<ProcessFacts, Unread>,
    /// Entries that existed but could not be read.
    pub errors: u64,
    /// Whether it lives in a nested PID namespace (`None`: not known).
    pub nested: Option<bool>,
    /// What to remember of it for the next look.
    pub remember: Option<Remembered>,
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
pub type OwnersRead = HashMap<u32, (u64, Vec<u32>)>;

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
    pub fn holding_stat_files(mut self, hold: bool) -> Reader<'a> {
        self.hold_stat_files = hold;
        self
    }

    /// This reader, told which owners were read in this collection (with their readings
    /// in its memory): the holder scan takes those readings as they are when they can
    /// blame the owner for no GPU, instead of reading every owner's mappings again.
    pub fn with_owners_read(mut self, owners_read: OwnersRead) -> Reader<'a> {
        self.owners_read = owners_read;
        self
    }

    /// The procfs this reader reads.
    pub fn root(&self) -> &'a ProcRoot {
        self.root
    }

    /// The procfs's PID for the exporter itself, which the holder scan leaves out.
    pub fn own_pid(&self) -> u32 {
        self.placement.own_pid
    }

    /// Whether the procfs shows our own PID namespace.
    pub fn view(&self) -> ProcfsView {
        match self.placement.position {
            Position::Own => ProcfsView::Own,
            Position::Foreign { .. } | Position::Lost => ProcfsView::Foreign,
        }
    }

    /// The procfs's PID of the process that is `pid` in our namespace (NVML's PIDs are
    /// ours); `None` when the procfs shows no such process.
    pub fn procfs_pid(&self, pid: u32) -> Option<u32> {
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

    /// The PID that the process `pid` of the procfs has in our namespace.
    fn local_pid(&self, pid: u32, dir: &Path, status: Option<&Status>) -> Option<u32> {
        let Position::Foreign { level, namespace } = self.placement.position else {
            return (self.placement.position == Position::Own).then_some(pid);
        };
        let read;
        let status = match status {
            Some(status) => status,
            None => {
                read = self.root.status(dir).ok()?;
                &read
            }
        };
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
                Err(error) => return Looked::failed(unread(error)),
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
        let known = self.remembered(pid, &stat);
        let Some(mut facts) = known.and_then(|known| known.facts.clone()) else {
            return self.read_afresh(pid, dir, stat, None);
        };
        let stale = stat.state == b'Z' || !gpus.iter().all(|&minor| facts.mappings.has_gpu(minor));
        refresh_from_stat(&mut facts, &stat);
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
        let nested = known.and_then(|known| known.nested);
        Looked {
            remember: Some(Remembered {
                facts: Some(facts.clone()),
                ..known.cloned().expect("a remembered process")
            }),
            facts: Ok(facts),
            errors,
            nested,
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
            Err(error) => return Looked::failed(unread(error)),
        };
        let open_files = descriptors.as_ref().map(|found| found.open_files as u64);
        let (descriptor_refs, mappings, mut errors) = match self.references(dir, &stat, descriptors)
        {
            Ok(references) => references,
            Err(unread) => return Looked::failed(unread),
        };
        if status.uid.is_none() {
            errors += 1;
        }
        let nested = status.nspid.as_ref().map(|levels| levels.len() >= 2);
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
                facts: Some(facts.clone()),
                nested,
                open_files,
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

    /// One process of the holder scan: `None` when it holds no NVIDIA file (or is gone),
    /// else its facts; with what to remember of it. A process remembered with no NVIDIA
    /// file, the same start time and as many descriptors as then is not listed again.
    pub(super) fn scan_one(&self, pid: u32) -> Scanned {
        if let Some((known, facts)) = self.owner_reading(pid) {
            return Scanned::Holder(Box::new(facts.clone()), known.clone());
        }
        let dir = self.root.pid_dir(pid);
        let stat = match self.root.stat(&dir) {
            Ok(stat) => stat,
            Err(error) if gone(&error) => return Scanned::Gone,
            Err(_) => return Scanned::Denied,
        };
        let known = self.remembered(pid, &stat);
        let remember = |open_files: Option<u64>| Remembered {
            start_time_ticks: stat.start_time_ticks,
            facts: None,
            nested: known.and_then(|known| known.nested),
            open_files,
            held_nvidia: false,
            stat_file: None,
        };
        // A kernel thread holds no file, ever.
        if stat.flags & PF_KTHREAD != 0 {
            return Scanned::Nothing(remember(None));
        }
        // The descriptor count, from the size the kernel gives the fd directory.
        let open_files = fs::metadata(dir.join("fd")).ok().map(|meta| meta.len());
        if let (Some(known), Some(count)) = (known, open_files) {
            if !known.held_nvidia && known.open_files == Some(count) && count > 0 {
                return Scanned::Nothing(remember(open_files));
            }
        }
        // An empty list is looked behind only when the main thread is a zombie.
        let descriptors = self.descriptors(&dir, stat.state == b'Z');
        match descriptors {
            Ok(found) if found.any() => {
                let looked = self.read_afresh(pid, &dir, stat, Some(found));
                match (looked.facts, looked.remember) {
                    (Ok(facts), Some(remember)) => Scanned::Holder(Box::new(facts), remember),
                    (Err(Unread::Missing), _) => Scanned::Gone,
                    _ => Scanned::Denied,
                }
            }
            Ok(_) => Scanned::Nothing(remember(open_files)),
            Err(error) if self.exited(&dir, &stat, &error) => Scanned::Gone,
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => Scanned::Denied,
            Err(_) => Scanned::Gone,
        }
    }

    /// The NVIDIA device files a process holds open: the one descriptor scanner. Through
    /// its own list or, when that is empty and the main thread is a zombie, its live
    /// threads' lists (a zombie leader's `/proc/PID/fd` is empty while its threads keep
    /// the files).
    pub fn descriptors(&self, dir: &Path, zombie_leader: bool) -> io::Result<Descriptors> {
        let mut found = Descriptors::default();
        self.scan_fd_dir(
            &dir.join("fd"),
            &mut found,
            self.placement.count_denied_links,
        )?;
        if found.open_files == 0 && zombie_leader {
            if let Ok(tasks) = fs::read_dir(dir.join("task")) {
                for task in tasks.flatten() {
                    // A denied thread list was already denied for the process itself.
                    let _ = self.scan_fd_dir(&task.path().join("fd"), &mut found, false);
                }
            }
        }
        Ok(found)
    }

    fn scan_fd_dir(
        &self,
        fd_dir: &Path,
        found: &mut Descriptors,
        count_denied_links: bool,
    ) -> io::Result<()> {
        // Links are read relative to the open directory: one path component to resolve
        // per descriptor instead of four, on the scan's hottest path.
        let directory = fs::File::open(fd_dir)?;
        let mut target = [0u8; LINK_PREFIX_BYTES];
        for entry in fs::read_dir(fd_dir)? {
            let Ok(entry) = entry else { continue };
            found.open_files += 1;
            let name = entry.file_name();
            let length = match read_link_at(&directory, &name, &mut target) {
                Ok(length) => length,
                Err(error)
                    if count_denied_links && error.kind() == io::ErrorKind::PermissionDenied =>
                {
                    return Err(error)
                }
                // Closed since the listing.
                Err(_) => continue,
            };
            if !target[..length].starts_with(&self.root.device_prefix) {
                continue;
            }
            // A long target may have been cut: read an NVIDIA one whole.
            let full;
            let path = if length == target.len() {
                full = fs::read_link(entry.path())?;
                full.as_os_str().as_bytes()
            } else {
                &target[..length]
            };
            let Some(mut node) = parse::nvidia_node(path, &self.root.device_prefix) else {
                continue;
            };
            // Following the descriptor's link gives the file itself: a device node's
            // numbers say which GPU it is whatever it is called in the process's /dev,
            // and its inode matches the process's mappings of it.
            if let Ok(file) = fs::metadata(entry.path()) {
                if file.file_type().is_char_device() {
                    let (major, minor) = parse::device_numbers(file.st_rdev());
                    node = parse::nvidia_node_by_number(major, minor).unwrap_or(node);
                }
                found.files.push(OpenFile {
                    device: parse::device_numbers(file.st_dev()),
                    inode: file.st_ino(),
                    node,
                });
            }
            found.nodes.insert(node);
        }
        Ok(())
    }

    /// The NVIDIA device files a process maps shared, matched to its open files by
    /// device and inode where it has them open, else by name. A zombie leader has no
    /// mappings of its own; a live thread's (they share one address space) are read.
    fn mappings(&self, dir: &Path, files: &[OpenFile], zombie_leader: bool) -> io::Result<NodeSet> {
        let mut maps = fs::read(dir.join("maps"))?;
        if maps.is_empty() && zombie_leader {
            if let Ok(tasks) = fs::read_dir(dir.join("task")) {
                for task in tasks.flatten() {
                    if let Ok(text) = fs::read(task.path().join("maps")) {
                        if !text.is_empty() {
                            maps = text;
                            break;
                        }
                    }
                }
            }
        }
        let mut nodes = BTreeSet::new();
        for mapping in parse::shared_mappings(&maps) {
            let by_file = files
                .iter()
                .find(|file| file.device == mapping.device && file.inode == mapping.inode)
                .map(|file| file.node);
            if let Some(node) =
                by_file.or_else(|| parse::nvidia_node(mapping.path, &self.root.device_prefix))
            {
                nodes.insert(node);
            }
        }
        Ok(node_set(&nodes))
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

/// Bytes of a descriptor's target read at first: enough to tell an NVIDIA node (whose
/// paths are short) from anything else, which needs no more.
const LINK_PREFIX_BYTES: usize = 96;

/// `readlinkat(2)` of `name` in `directory` into `buffer`: how many bytes it wrote (as
/// many as the buffer holds when the target is longer).
fn read_link_at(
    directory: &fs::File,
    name: &std::ffi::OsStr,
    buffer: &mut [u8],
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))?;
    // SAFETY: the directory descriptor is open for the call, the name is NUL-terminated,
    // and the kernel writes at most `buffer.len()` bytes into the buffer we own.
    let written = unsafe {
        libc::readlinkat(
            directory.as_raw_fd(),
            name.as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    usize::try_from(written).map_err(|_| io::Error::last_os_error())
}

/// A file a process holds open, identified as its mappings name it.
#[derive(Debug, Clone, Copy)]
struct OpenFile {
    device: (u32, u32),
    inode: u64,
    node: NvidiaNode,
}

/// What one process's descriptor lists showed.
#[derive(Debug, Default)]
pub struct Descriptors {
    /// Entries listed, NVIDIA or not.
    open_files: usize,
    nodes: BTreeSet<NvidiaNode>,
    files: Vec<OpenFile>,
}

impl Descriptors {
    /// Descriptors listed, NVIDIA or not.
    pub fn open_files(&self) -> usize {
        self.open_files
    }

    /// Whether any descriptor points at an NVIDIA device file.
    pub fn any(&self) -> bool {
        !self.nodes.is_empty()
    }

    fn nodes(&self) -> NodeSet {
        node_set(&self.nodes)
    }
}

/// What the scan found of one process.
#[derive(Debug)]
pub(super) enum Scanned {
    /// It holds NVIDIA files: its facts, and what to remember.
    Holder(Box<ProcessFacts>, Remembered),
    /// It holds none: what to remember.
    Nothing(Remembered),
    /// Its descriptors could not be read.
    Denied,
    /// It exited while it was looked at.
    Gone,
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

/// The stat line read again through a held file; `None` once the process is gone.
fn read_held_stat(file: &fs::File) -> Option<Stat> {
    use std::os::unix::fs::FileExt;
    let mut line = [0u8; 1024];
    let length = file.read_at(&mut line, 0).ok()?;
    // A line that fills the buffer may be cut: read it by path instead.
    (length < line.len()).then(|| parse::stat(&line[..length]))?
}

/// A process's stat file, opened for holding, if it is still the process that started at
/// `start_time_ticks`.
fn open_stat_file(dir: &Path, start_time_ticks: u64) -> Option<Arc<fs::File>> {
    let file = fs::File::open(dir.join("stat")).ok()?;
    let stat = read_held_stat(&file)?;
    (stat.start_time_ticks == start_time_ticks).then(|| Arc::new(file))
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

fn node_set(nodes: &BTreeSet<NvidiaNode>) -> NodeSet {
    let mut set = NodeSet::default();
    for node in nodes {
        match *node {
            NvidiaNode::Gpu(minor) => set.gpus.push(minor),
            NvidiaNode::Control => set.control = true,
            NvidiaNode::Uvm => set.uvm = true,
            NvidiaNode::Capability(minor) => set.capabilities.push(minor),
            NvidiaNode::Other => set.other = true,
        }
    }
    set
}

/// Whether an error says the process is gone: its entry vanished, or it exited between
/// the open and the read of a file (`ESRCH`).
pub fn gone(error: &io::Error) -> bool {
    const ESRCH: i32 = 3;
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(ESRCH)
}

/// Absence only when the kernel says so.
fn unread(error: io::Error) -> Unread {
    if gone(&error) {
        Unread::Missing
    } else {
        Unread::Unreadable(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_held_stat_file_reads_fresh_and_fails_once_its_process_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let dir = PathBuf::from(format!("/proc/{}", child.id()));
        let first = parse::stat(&fs::read(dir.join("stat")).unwrap()).unwrap();
        // Another start time under the PID is another process: not held.
        assert!(open_stat_file(&dir, first.start_time_ticks + 1).is_none());
        let file = open_stat_file(&dir, first.start_time_ticks).unwrap();
        let again = read_held_stat(&file).unwrap();
        assert_eq!(again.start_time_ticks, first.start_time_ticks);
        // Stopped: the held file shows it, so it is read afresh each time.
        let stop = std::process::Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stop.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut state = read_held_stat(&file).unwrap().state;
        while state != b'T' && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            state = read_held_stat(&file).unwrap().state;
        }
        assert_eq!(state, b'T');
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: whatever gets the PID next, the held file never shows it.
        assert!(read_held_stat(&file).is_none());
    }

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
}
