//! The NVIDIA device files a process holds open and maps: the one descriptor scanner,
//! and the reading of its maps matched against what it holds.
//!
//! What a real H200 showed (see the project's GPU facts) decides what is read: every NVML
//! client holds the GPU's device files open, but only a CUDA context, own or inherited
//! by fork, *maps* them shared. So each process is read for both: the descriptors say
//! who holds a file, the mappings say who holds a context.

use super::parse::{self, NvidiaNode};
use super::reading::{NarrowAccess, NodeSet};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::linux::fs::MetadataExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Bytes of a descriptor's target read at first: enough to tell an NVIDIA node (whose
/// paths are short) from anything else, which needs no more.
const LINK_PREFIX_BYTES: usize = 96;

/// A file a process holds open, identified as its mappings name it.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenFile {
    device: (u32, u32),
    inode: u64,
    node: NvidiaNode,
}

/// What one process's descriptor lists showed.
#[derive(Debug, Default)]
pub(super) struct Descriptors {
    /// Entries listed, NVIDIA or not.
    pub(super) open_files: usize,
    nodes: BTreeSet<NvidiaNode>,
    /// The NVIDIA files among them, for matching the process's mappings.
    pub(super) files: Vec<OpenFile>,
}

impl Descriptors {
    /// Whether any descriptor points at an NVIDIA device file.
    pub(super) fn any(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// The NVIDIA nodes held open.
    pub(super) fn nodes(&self) -> NodeSet {
        node_set(&self.nodes)
    }
}

/// The NVIDIA device files a process holds open, with `prefix` the device paths' (see
/// [`parse::nvidia_node`]). Through its own list or, when that is empty and the main
/// thread is a zombie, its live threads' lists (a zombie leader's `/proc/PID/fd` is empty
/// while its threads keep the files). A denied link fails the whole list only when
/// `count_denied_links` (see [`super::Placement`]).
pub(super) fn descriptors(
    prefix: &[u8],
    dir: &Path,
    zombie_leader: bool,
    count_denied_links: bool,
) -> io::Result<Descriptors> {
    let mut found = Descriptors::default();
    scan_fd_dir(prefix, &dir.join("fd"), &mut found, count_denied_links)?;
    if found.open_files == 0 && zombie_leader {
        if let Ok(tasks) = fs::read_dir(dir.join("task")) {
            for task in tasks.flatten() {
                // A denied thread list was already denied for the process itself.
                let _ = scan_fd_dir(prefix, &task.path().join("fd"), &mut found, false);
            }
        }
    }
    Ok(found)
}

fn scan_fd_dir(
    prefix: &[u8],
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
            Err(error) if count_denied_links && error.kind() == io::ErrorKind::PermissionDenied => {
                return Err(error)
            }
            // Closed since the listing.
            Err(_) => continue,
        };
        if !target[..length].starts_with(prefix) {
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
        let Some(mut node) = parse::nvidia_node(path, prefix) else {
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

/// The NVIDIA device files a process maps shared, matched to its open `files` by device
/// and inode where it has them open, else by name, with how each GPU node and the control
/// node are mapped where no mapping of them is read-write. A zombie leader has no mappings
/// of its own; a live thread's (they share one address space) are read.
pub(super) fn mappings(
    prefix: &[u8],
    dir: &Path,
    files: &[OpenFile],
    zombie_leader: bool,
) -> io::Result<NodeSet> {
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
    let mut nodes: BTreeMap<NvidiaNode, Access> = BTreeMap::new();
    for mapping in parse::shared_mappings(&maps) {
        let by_file = files
            .iter()
            .find(|file| file.device == mapping.device && file.inode == mapping.inode)
            .map(|file| file.node);
        if let Some(node) = by_file.or_else(|| parse::nvidia_node(mapping.path, prefix)) {
            nodes
                .entry(node)
                .or_default()
                .add(mapping.read, mapping.write);
        }
    }
    let mut set = node_set(&nodes.keys().copied().collect());
    for (node, access) in &nodes {
        match (*node, access.narrow()) {
            (NvidiaNode::Gpu(minor), Some(narrow)) => {
                set.gpus_without_read_write.insert(minor, narrow);
            }
            (NvidiaNode::Control, narrow) => set.control_without_read_write = narrow,
            _ => {}
        }
    }
    Ok(set)
}

/// What the shared mappings of one node allow, over all of them.
#[derive(Debug, Default, Clone, Copy)]
struct Access {
    read_write: bool,
    write: bool,
    read: bool,
}

impl Access {
    fn add(&mut self, read: bool, write: bool) {
        self.read_write |= read && write;
        self.write |= write;
        self.read |= read;
    }

    /// How the node is mapped when no mapping of it is read-write.
    fn narrow(self) -> Option<NarrowAccess> {
        if self.read_write {
            None
        } else if self.write {
            Some(NarrowAccess::WriteOnly)
        } else if self.read {
            Some(NarrowAccess::ReadOnly)
        } else {
            Some(NarrowAccess::NoAccess)
        }
    }
}

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
