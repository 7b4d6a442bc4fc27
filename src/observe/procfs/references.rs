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
use std::ffi::CStr;
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::linux::fs::MetadataExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

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
    // The directory is opened once, listed through that descriptor and its links read
    // relative to it: one path component to resolve per descriptor instead of four, and
    // no allocation per entry, on the scan's hottest path (one `readlinkat` per open file
    // of every process is most of a first scan).
    let directory = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(fd_dir)?;
    let mut listing = Listing::new(&directory);
    let mut target = [0u8; LINK_PREFIX_BYTES];
    while let Some(name) = listing.next_name() {
        found.open_files += 1;
        let length = match read_link_at(&directory, name, &mut target) {
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
            full = fs::read_link(fd_dir.join(std::ffi::OsStr::from_bytes(name.to_bytes())))?;
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
        if let Ok(file) = stat_at(&directory, name) {
            if file.st_mode & libc::S_IFMT == libc::S_IFCHR {
                let (major, minor) = parse::device_numbers(file.st_rdev);
                node = parse::nvidia_node_by_number(major, minor).unwrap_or(node);
            }
            found.files.push(OpenFile {
                device: parse::device_numbers(file.st_dev),
                inode: file.st_ino,
                node,
            });
        }
        found.nodes.insert(node);
    }
    Ok(())
}

/// What a process's descriptor directory says without being listed: which directory it
/// is (inode and change time; `/proc` makes it when first asked, for that process alone,
/// so a process that gets the PID later gets another), and its size, which on `/proc` is
/// the number of descriptors open (Linux 6.2 and later; before, 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdDirectory {
    pub(super) inode: u64,
    pub(super) changed: (i64, i64),
    pub(super) size: u64,
}

/// The descriptor directory of the process directory `dir`, from one `statx`.
pub(super) fn fd_directory(dir: &Path) -> io::Result<FdDirectory> {
    let meta = fs::metadata(dir.join("fd"))?;
    Ok(FdDirectory {
        inode: meta.st_ino(),
        changed: (meta.st_ctime(), meta.st_ctime_nsec()),
        size: meta.len(),
    })
}

/// The entries of an open directory, read with `getdents64` into a buffer of its own;
/// `.` and `..` left out. A read that fails ends the listing, as a process that exits
/// meanwhile ends its descriptor list.
struct Listing<'a> {
    directory: &'a fs::File,
    buffer: [u8; LISTING_BUFFER_BYTES],
    filled: usize,
    at: usize,
    ended: bool,
}

/// Bytes read from a directory at a time: a process's whole descriptor list in one read
/// for up to about 300 descriptors.
const LISTING_BUFFER_BYTES: usize = 8192;
/// Where a `linux_dirent64` record's length and name start.
const DIRENT_RECORD_LENGTH_AT: usize = 16;
const DIRENT_NAME_AT: usize = 19;

impl<'a> Listing<'a> {
    fn new(directory: &'a fs::File) -> Listing<'a> {
        Listing {
            directory,
            buffer: [0; LISTING_BUFFER_BYTES],
            filled: 0,
            at: 0,
            ended: false,
        }
    }

    /// The next entry's name, without its terminating NUL.
    fn next_name(&mut self) -> Option<&CStr> {
        loop {
            if self.at >= self.filled {
                if self.ended {
                    return None;
                }
                // SAFETY: the directory descriptor is open for the call, and the kernel
                // writes at most the buffer's length into the buffer we own.
                let read = unsafe {
                    libc::syscall(
                        libc::SYS_getdents64,
                        self.directory.as_raw_fd(),
                        self.buffer.as_mut_ptr(),
                        self.buffer.len(),
                    )
                };
                match usize::try_from(read) {
                    Ok(read) if read > 0 => {
                        self.filled = read.min(self.buffer.len());
                        self.at = 0;
                    }
                    _ => {
                        self.ended = true;
                        return None;
                    }
                }
            }
            let start = self.at;
            let length = self.buffer[start..self.filled]
                .get(DIRENT_RECORD_LENGTH_AT..DIRENT_RECORD_LENGTH_AT + 2)
                .map_or(0, |bytes| {
                    usize::from(u16::from_ne_bytes([bytes[0], bytes[1]]))
                });
            if length <= DIRENT_NAME_AT || start + length > self.filled {
                // Not a record as the kernel writes them: stop rather than misread.
                self.ended = true;
                self.filled = 0;
                return None;
            }
            self.at += length;
            let name = &self.buffer[start + DIRENT_NAME_AT..start + length];
            let Some(end) = name.iter().position(|&byte| byte == 0) else {
                continue;
            };
            if name[..end] == *b"." || name[..end] == *b".." {
                continue;
            }
            let with_nul = start + DIRENT_NAME_AT..start + DIRENT_NAME_AT + end + 1;
            return CStr::from_bytes_with_nul(&self.buffer[with_nul]).ok();
        }
    }
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
    let mut nodes: BTreeMap<NvidiaNode, Access> = BTreeMap::new();
    let mut add = |mapping: parse::SharedMapping| {
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
    };
    let mut file = fs::File::open(dir.join("maps"))?;
    let asked = !zombie_leader
        && !KERNEL_LACKS_PROCMAP_QUERY.load(Ordering::Relaxed)
        && query_shared_mappings(&file, &mut add)?;
    if !asked {
        // The query moves no file position: the file reads from its start.
        let mut maps = Vec::new();
        file.read_to_end(&mut maps)?;
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
        parse::shared_mappings(&maps).for_each(&mut add);
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

/// `struct procmap_query` of Linux's `linux/fs.h` (6.11 and later).
#[repr(C)]
#[derive(Debug, Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as u64) << 16) | ((b'f' as u64) << 8) | 17;
/// The query's flags: the mapping at the address or the next one, backed by a file and
/// shared (the `s` of the maps file).
const PROCMAP_QUERY_SHARED_FILES: u64 = 0x10 | 0x20 | PROCMAP_QUERY_VMA_SHARED;
/// The answer's `vma_flags`: the mapping may be read (`r` of the maps file), written
/// (`w`), and is shared (`s`); the last is also a query flag.
const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
/// Room for a mapped file's path (the kernel's `PATH_MAX`).
const MAPPING_NAME_BYTES: usize = 4096;

/// The shared file mappings of the process whose maps file is `maps`, each given to
/// `add` as [`parse::shared_mappings`] gives the maps file's, asked of the kernel one mapping at a time (`PROCMAP_QUERY`, Linux 6.11 and
/// later) instead of reading the maps file: the kernel then formats only those (a CUDA
/// context's 30 or so) and not every mapping of the process (thousands for a PyTorch
/// job, about a microsecond each). `Ok(false)` when the kernel cannot answer so: the
/// caller reads the maps file instead.
fn query_shared_mappings(
    file: &fs::File,
    add: &mut impl FnMut(parse::SharedMapping),
) -> io::Result<bool> {
    let mut name = [0u8; MAPPING_NAME_BYTES];
    let mut address = 0;
    loop {
        let mut query = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: PROCMAP_QUERY_SHARED_FILES,
            query_addr: address,
            vma_name_addr: name.as_mut_ptr() as u64,
            vma_name_size: MAPPING_NAME_BYTES as u32,
            ..ProcmapQuery::default()
        };
        // SAFETY: the maps file is open for the call, `query` is the kernel's layout with
        // its own size in it, and the kernel writes at most `vma_name_size` bytes of the
        // name into the buffer we own, which outlives the call.
        let status = unsafe { libc::ioctl(file.as_raw_fd(), PROCMAP_QUERY as _, &mut query) };
        if status != 0 {
            return Ok(match io::Error::last_os_error().raw_os_error() {
                // No more such mappings.
                Some(libc::ENOENT) => true,
                // No address space (the process exited since the open): nothing mapped,
                // as its maps file would read empty.
                Some(libc::ESRCH) => true,
                // A kernel without the query: it will not have it next time either.
                Some(libc::ENOTTY) => {
                    KERNEL_LACKS_PROCMAP_QUERY.store(true, Ordering::Relaxed);
                    false
                }
                // A path longer than the buffer: the maps file says it all.
                _ => false,
            });
        }
        let length = (query.vma_name_size as usize).min(MAPPING_NAME_BYTES);
        let path = name[..length]
            .split(|&byte| byte == 0)
            .next()
            .unwrap_or(&[]);
        // As the maps file's reading: a mapping with no inode or no name is left out.
        if query.inode != 0 && !path.is_empty() {
            add(parse::SharedMapping {
                device: (query.dev_major, query.dev_minor),
                inode: query.inode,
                path,
                read: query.vma_flags & PROCMAP_QUERY_VMA_READABLE != 0,
                write: query.vma_flags & PROCMAP_QUERY_VMA_WRITABLE != 0,
            });
        }
        if query.vma_end <= address {
            return Ok(false);
        }
        address = query.vma_end;
    }
}

/// Set once the kernel has answered `PROCMAP_QUERY` with ENOTTY (before Linux 6.11): every
/// later read goes straight to the maps file instead of asking again.
static KERNEL_LACKS_PROCMAP_QUERY: AtomicBool = AtomicBool::new(false);

/// `readlinkat(2)` of `name` in `directory` into `buffer`: how many bytes it wrote (as
/// many as the buffer holds when the target is longer).
fn read_link_at(directory: &fs::File, name: &CStr, buffer: &mut [u8]) -> io::Result<usize> {
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

/// `fstatat(2)` of `name` in `directory`, following a link: the file a descriptor is.
fn stat_at(directory: &fs::File, name: &CStr) -> io::Result<libc::stat> {
    let mut file = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the directory descriptor is open for the call, the name is NUL-terminated,
    // and the kernel fills the `stat` we own; it is read only when the call succeeded.
    let status =
        unsafe { libc::fstatat(directory.as_raw_fd(), name.as_ptr(), file.as_mut_ptr(), 0) };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded, so the kernel filled it.
    Ok(unsafe { file.assume_init() })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// The kernel's release as (major, minor).
    fn kernel_release() -> (u32, u32) {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|part| part.parse().unwrap_or(0));
        (numbers.next().unwrap(), numbers.next().unwrap())
    }

    /// A shared mapping of one page of `file` with `protection`.
    fn map_shared(file: &fs::File, protection: libc::c_int) -> *mut libc::c_void {
        // SAFETY: a fresh shared mapping of a file we own, unmapped by the caller and
        // never read or written.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                protection,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(mapped, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        mapped
    }

    #[test]
    fn shared_mappings_asked_of_the_kernel_are_those_of_the_maps_file() {
        // This test's own process maps stand-in nodes shared, as the H200 showed them: a
        // context's GPU node read-write beside a write-only mapping, the MPS control
        // daemon's GPU node only write-only and its control node read-only beside one
        // without access, and one GPU node mapped without access at all.
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            let node = dir.path().join(name);
            fs::write(&node, [0u8; 4096]).unwrap();
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&node)
                .unwrap()
        };
        let (context, daemon, control, unmapped) = (
            open("nvidia5"),
            open("nvidia6"),
            open("nvidiactl"),
            open("nvidia7"),
        );
        let mapped = [
            map_shared(&context, libc::PROT_READ | libc::PROT_WRITE),
            map_shared(&context, libc::PROT_WRITE),
            map_shared(&daemon, libc::PROT_WRITE),
            map_shared(&control, libc::PROT_READ),
            map_shared(&control, libc::PROT_NONE),
            map_shared(&unmapped, libc::PROT_NONE),
        ];
        let prefix = dir
            .path()
            .join("nvidia")
            .into_os_string()
            .into_encoded_bytes();
        let proc_self = Path::new("/proc/self");
        // Each mapping of ours as the kernel answers it, and as the maps file lists it.
        let mut asked = Vec::new();
        let answered = query_shared_mappings(
            &fs::File::open(proc_self.join("maps")).unwrap(),
            &mut |mapping| {
                if mapping.path.starts_with(&prefix) {
                    asked.push((
                        String::from_utf8_lossy(mapping.path).into_owned(),
                        mapping.read,
                        mapping.write,
                    ));
                }
            },
        )
        .unwrap();
        let maps = fs::read(proc_self.join("maps")).unwrap();
        let mut listed: Vec<_> = parse::shared_mappings(&maps)
            .filter(|mapping| mapping.path.starts_with(&prefix))
            .map(|mapping| {
                (
                    String::from_utf8_lossy(mapping.path).into_owned(),
                    mapping.read,
                    mapping.write,
                )
            })
            .collect();
        let queried = mappings(&prefix, proc_self, &[], false).unwrap();
        // A zombie leader's path reads the maps file (ours is not empty).
        let read = mappings(&prefix, proc_self, &[], true).unwrap();
        for mapped in mapped {
            // SAFETY: a mapping made above, no longer used.
            unsafe { libc::munmap(mapped, 4096) };
        }
        // Linux 6.11 and later answer the query; before, the maps file is read.
        assert_eq!(answered, kernel_release() >= (6, 11));
        if answered {
            asked.sort();
            listed.sort();
            assert_eq!(asked, listed);
        }
        assert_eq!(listed.len(), 6, "{listed:?}");
        assert_eq!(queried.gpus, [5, 6, 7]);
        assert!(queried.control);
        assert_eq!(
            queried.gpus_without_read_write,
            BTreeMap::from([(6, NarrowAccess::WriteOnly), (7, NarrowAccess::NoAccess)])
        );
        assert_eq!(
            queried.control_without_read_write,
            Some(NarrowAccess::ReadOnly)
        );
        assert_eq!(queried, read);
    }

    #[test]
    fn every_descriptor_is_listed_however_many_reads_the_listing_takes() {
        // Far more entries than one read of the directory returns.
        let dir = tempfile::tempdir().unwrap();
        let fd = dir.path().join("fd");
        fs::create_dir(&fd).unwrap();
        let entries = LISTING_BUFFER_BYTES;
        for number in 0..entries {
            let target = match number {
                7 => "/dev/nvidiactl".to_string(),
                4000 => "/dev/nvidia3".to_string(),
                // A long target is read whole before it is named.
                number if number == entries - 1 => {
                    format!("/dev/nvidia-caps/{}/x", "y".repeat(200))
                }
                _ => format!("/tmp/file-{number}"),
            };
            symlink(target, fd.join(number.to_string())).unwrap();
        }
        let found = descriptors(b"/dev/nvidia", dir.path(), false, true).unwrap();
        assert_eq!(found.open_files, entries);
        let nodes = found.nodes();
        assert_eq!(nodes.gpus, [3]);
        assert!(nodes.control && nodes.other, "{nodes:?}");
    }
}
