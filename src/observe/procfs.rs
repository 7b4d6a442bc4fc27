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

/// Reads processes for one observation; cheap to make, shared by the scan's threads.
#[derive(Debug)]
pub struct Reader<'a> {
    root: &'a ProcRoot,
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
    /// The host's password file, read once when a user name is first needed.
    passwd: OnceLock<Option<String>>,
    /// Our PIDs to the procfs's, when it shows another namespace; built on first need.
    translation: OnceLock<HashMap<u32, u32>>,
}

impl<'a> Reader<'a> {
    /// A reader of `root`, locating the exporter in it.
    pub fn new(root: &'a ProcRoot) -> Reader<'a> {
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
        Reader {
            root,
            own_pid,
            position,
            count_denied_links,
            passwd: OnceLock::new(),
            translation: OnceLock::new(),
        }
    }

    /// The procfs this reader reads.
    pub fn root(&self) -> &'a ProcRoot {
        self.root
    }

    /// The procfs's PID for the exporter itself, which the holder scan leaves out.
    pub fn own_pid(&self) -> u32 {
        self.own_pid
    }

    /// Whether the procfs shows our own PID namespace.
    pub fn view(&self) -> ProcfsView {
        match self.position {
            Position::Own => ProcfsView::Own,
            Position::Foreign { .. } | Position::Lost => ProcfsView::Foreign,
        }
    }

    /// The procfs's PID of the process that is `pid` in our namespace (NVML's PIDs are
    /// ours); `None` when the procfs shows no such process.
    pub fn procfs_pid(&self, pid: u32) -> Option<u32> {
        match self.position {
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
        let Position::Foreign { level, namespace } = self.position else {
            return (self.position == Position::Own).then_some(pid);
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

    /// Everything about process `pid` of the procfs, and how many of its entries could not
    /// be read. `descriptors` are passed in when the caller already scanned them.
    pub fn read(
        &self,
        pid: u32,
        descriptors: Option<Descriptors>,
    ) -> Result<(ProcessFacts, u64), Unread> {
        let dir = self.root.pid_dir(pid);
        let stat = self.root.stat(&dir).map_err(unread)?;
        let zombie_leader = stat.state == b'Z';
        let status = self.root.status(&dir).map_err(unread)?;
        let mut errors = 0;
        let descriptors = match descriptors {
            Some(descriptors) => Ok(descriptors),
            None => self.descriptors(&dir, zombie_leader),
        };
        let (descriptor_refs, files) = match descriptors {
            Ok(descriptors) => (References::Read(descriptors.nodes()), descriptors.files),
            Err(error) if gone(&error) => return Err(Unread::Missing),
            Err(_) => {
                errors += 1;
                (References::Unreadable, Vec::new())
            }
        };
        let mappings = match self.mappings(&dir, &files, zombie_leader) {
            Ok(nodes) => References::Read(nodes),
            Err(error) if gone(&error) => return Err(Unread::Missing),
            Err(_) => {
                errors += 1;
                References::Unreadable
            }
        };
        if status.uid.is_none() {
            errors += 1;
        }
        let wchan = (stat.state == b'D')
            .then(|| fs::read_to_string(dir.join("wchan")).ok())
            .flatten()
            .filter(|name| !name.is_empty() && name != "0");
        Ok((
            ProcessFacts {
                pid,
                local_pid: self.local_pid(pid, &dir, Some(&status)),
                start_time_ticks: stat.start_time_ticks,
                comm: stat.comm,
                state: char::from(stat.state),
                ppid: stat.ppid,
                pgid: stat.pgrp,
                sid: stat.session,
                threads: stat.threads,
                uid: status.uid,
                user: status.uid.and_then(|uid| self.user_name(uid)),
                wchan,
                descriptors: descriptor_refs,
                mappings,
                cgroup: self.root.cgroup(&dir),
                pid_namespace_init: None,
            },
            errors,
        ))
    }

    /// The NVIDIA device files a process holds open: the one descriptor scanner. Through
    /// its own list or, when that is empty and the main thread is a zombie, its live
    /// threads' lists (a zombie leader's `/proc/PID/fd` is empty while its threads keep
    /// the files).
    pub fn descriptors(&self, dir: &Path, zombie_leader: bool) -> io::Result<Descriptors> {
        let mut found = Descriptors::default();
        self.scan_fd_dir(&dir.join("fd"), &mut found, self.count_denied_links)?;
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

    /// Whether the main thread of the process in `dir` is a zombie (or its state cannot
    /// be read): only then can an empty descriptor list hide live threads' files.
    pub fn may_be_zombie_leader(&self, dir: &Path) -> bool {
        !matches!(self.root.stat(dir), Ok(stat) if stat.state != b'Z')
    }

    fn scan_fd_dir(
        &self,
        fd_dir: &Path,
        found: &mut Descriptors,
        count_denied_links: bool,
    ) -> io::Result<()> {
        for entry in fs::read_dir(fd_dir)? {
            let Ok(entry) = entry else { continue };
            found.open_files += 1;
            let path = entry.path();
            let target = match fs::read_link(&path) {
                Ok(target) => target,
                Err(error)
                    if count_denied_links && error.kind() == io::ErrorKind::PermissionDenied =>
                {
                    return Err(error)
                }
                // Closed since the listing.
                Err(_) => continue,
            };
            let Some(mut node) =
                parse::nvidia_node(target.as_os_str().as_bytes(), &self.root.device_prefix)
            else {
                continue;
            };
            // Following the descriptor's link gives the file itself: a device node's
            // numbers say which GPU it is whatever it is called in the process's /dev,
            // and its inode matches the process's mappings of it.
            if let Ok(file) = fs::metadata(&path) {
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
