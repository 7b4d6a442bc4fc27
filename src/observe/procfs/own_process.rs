//! The exporter's own process, for the `process_*` series every exporter of the
//! Prometheus ecosystem serves (CPU time, memory, descriptors, start time), read from
//! `/proc/self` of the procfs the exporter itself runs under: `--path.procfs` names where
//! the host's processes are, which may not show this one as `self`.

use super::parse;
use super::root::ProcRoot;
use crate::sync::lock;
use procfs_core::process::{LimitValue, Limits};
use procfs_core::FromRead;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest one reading may take. The files are read one after another and the budget is
/// checked between them and while counting descriptors; what is left when it runs out
/// (the limits, the count) is left out rather than waited for.
const BUDGET: Duration = Duration::from_millis(100);
/// Descriptors counted between two looks at the clock.
const FDS_PER_CHECK: usize = 64;

/// What `/proc/self` says of the exporter's process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnProcessReading {
    /// CPU time spent in user and kernel mode, in clock ticks.
    pub cpu_ticks: u64,
    /// Clock ticks per second (`USER_HZ`), the unit of `cpu_ticks` and start times.
    pub ticks_per_second: u64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// When the process started, in clock ticks after boot.
    pub start_time_ticks: u64,
    /// When the host booted, in seconds since the Unix epoch; `None` when unreadable.
    pub boot_time_unix_seconds: Option<u64>,
    /// Open descriptors; `None` when they could not be counted in time.
    pub open_fds: Option<u64>,
    /// The soft limit of open descriptors; `None` when unlimited or unreadable.
    pub max_fds: Option<u64>,
}

/// How long a reading of the limit of open files is served before it is read again: it
/// changes only when someone runs `prlimit` on the exporter.
const LIMITS_FOR: Duration = Duration::from_secs(60);

/// Reads the exporter's own process; the boot time and the system's units are read once.
///
/// A scrape reads it each time, so each reading costs as few system calls as it can:
/// `stat` is held open and read with `pread` (the kernel writes it afresh for each read),
/// the descriptors are counted from the size `/proc` gives their folder (Linux 6.2 and
/// later; one `statx` instead of listing them), and the limits file is read once a minute.
#[derive(Debug)]
pub struct OwnProcess {
    /// `/proc/self`, or its stand-in in tests.
    own: PathBuf,
    boot_time_unix_seconds: Option<u64>,
    ticks_per_second: u64,
    page_size: u64,
    /// `own`'s `stat`, once opened.
    stat: Mutex<Option<fs::File>>,
    /// The soft limit of open files and when it was read.
    limits: Mutex<Option<(Instant, Option<u64>)>>,
    /// Whether `own` is on a procfs, whose descriptor folder's size is its count (a stand-in
    /// folder's size is not).
    on_procfs: bool,
}

impl OwnProcess {
    /// Reads `self` of the procfs mounted at `root` (the system's `/proc` outside tests).
    pub fn new(root: &Path) -> OwnProcess {
        let proc_root = ProcRoot {
            root: root.to_path_buf(),
            device_prefix: Vec::new(),
            stand_in: false,
        };
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let own = root.join("self");
        OwnProcess {
            on_procfs: on_procfs(&own),
            own,
            boot_time_unix_seconds: proc_root.boot_time(),
            ticks_per_second: u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100),
            page_size: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            stat: Mutex::new(None),
            limits: Mutex::new(None),
        }
    }

    /// One reading, within a budget of 100 ms; `None` when `stat` cannot be read.
    pub fn read(&self) -> Option<OwnProcessReading> {
        let deadline = Instant::now() + BUDGET;
        let stat = parse::stat_usage(&self.stat_line()?)?;
        let max_fds = in_time(deadline).then(|| self.max_fds()).flatten();
        let open_fds = in_time(deadline).then(|| self.open_fds(deadline)).flatten();
        Some(OwnProcessReading {
            cpu_ticks: stat.user_ticks.saturating_add(stat.system_ticks),
            ticks_per_second: self.ticks_per_second,
            resident_bytes: stat.resident_pages.saturating_mul(self.page_size),
            virtual_bytes: stat.virtual_bytes,
            start_time_ticks: stat.start_time_ticks,
            boot_time_unix_seconds: self.boot_time_unix_seconds,
            open_fds,
            max_fds,
        })
    }
}

impl OwnProcess {
    /// `stat`'s line, read through the file held open; opened again when a read fails.
    fn stat_line(&self) -> Option<Vec<u8>> {
        let mut held = lock(&self.stat);
        let mut line = vec![0; STAT_BYTES];
        for _ in 0..2 {
            if held.is_none() {
                *held = Some(fs::File::open(self.own.join("stat")).ok()?);
            }
            match held.as_ref()?.read_at(&mut line, 0) {
                Ok(read) if read > 0 && read < line.len() => {
                    line.truncate(read);
                    return Some(line);
                }
                // Longer than the buffer (not seen) or unreadable: read it whole by path.
                Ok(read) if read > 0 => return fs::read(self.own.join("stat")).ok(),
                _ => *held = None,
            }
        }
        None
    }

    /// The soft limit of open files, read at most once every [`LIMITS_FOR`].
    fn max_fds(&self) -> Option<u64> {
        let mut limits = lock(&self.limits);
        if let Some((read_at, max_fds)) = *limits {
            if read_at.elapsed() < LIMITS_FOR {
                return max_fds;
            }
        }
        let max_fds = fs::read(self.own.join("limits"))
            .ok()
            .and_then(|limits| max_open_files(&limits));
        *limits = Some((Instant::now(), max_fds));
        max_fds
    }

    /// The open descriptors: the size of their folder on a procfs that gives it (the
    /// kernel's count of descriptor numbers taken, one being opened included), else
    /// counted.
    fn open_fds(&self, deadline: Instant) -> Option<u64> {
        let folder = self.own.join("fd");
        if self.on_procfs {
            match fs::metadata(&folder).map(|meta| meta.len()) {
                Ok(count) if count > 0 => return Some(count),
                Err(_) => return None,
                Ok(_) => {} // Linux before 6.2 says 0: count them.
            }
        }
        count_entries(&folder, deadline)
    }
}

/// Bytes `stat` is read into: its line is about 300.
const STAT_BYTES: usize = 1024;

/// Whether `path` is on a procfs (`PROC_SUPER_MAGIC`).
fn on_procfs(path: &Path) -> bool {
    const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut fs_stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: the path is NUL-terminated and the kernel writes one statfs into memory we
    // own; it is read only when the call succeeded.
    let answered = unsafe { libc::statfs(path.as_ptr(), fs_stats.as_mut_ptr()) } == 0;
    answered && unsafe { fs_stats.assume_init() }.f_type as libc::c_long == PROC_SUPER_MAGIC
}

fn in_time(deadline: Instant) -> bool {
    Instant::now() < deadline
}

/// The soft limit of open files of a limits file, parsed by procfs-core (the kernel
/// writes this process's file whole, which its parser needs); `None` when unlimited or
/// unreadable.
fn max_open_files(limits: &[u8]) -> Option<u64> {
    match Limits::from_read(limits).ok()?.max_open_files.soft_limit {
        LimitValue::Value(limit) => Some(limit),
        LimitValue::Unlimited => None,
    }
}

/// How many entries `folder` has, or `None` when it cannot be read or `deadline` passes.
fn count_entries(folder: &Path, deadline: Instant) -> Option<u64> {
    let mut count = 0u64;
    for (seen, entry) in fs::read_dir(folder).ok()?.enumerate() {
        if seen % FDS_PER_CHECK == 0 && !in_time(deadline) {
            return None;
        }
        entry.ok()?;
        count += 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line as the kernel writes it, for a name with `) ` inside.
    const STAT: &[u8] = b"4242 (vram) (x) S 1 4242 4242 0 -1 4194560 2390 0 0 0 150 25 0 0 20 0 6 0 48213 1073741824 5000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn the_stat_line_gives_cpu_time_memory_and_start() {
        assert_eq!(
            parse::stat_usage(STAT),
            Some(parse::Usage {
                user_ticks: 150,
                system_ticks: 25,
                start_time_ticks: 48_213,
                virtual_bytes: 1 << 30,
                resident_pages: 5_000,
            })
        );
        for bad in [&b""[..], b"1 (x) S 1 2", b"1 (x) S 1 2 3 4 5 6 7 8 9 x 25"] {
            assert_eq!(
                parse::stat_usage(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A limits file as the kernel writes it, with `open_files` as the soft limit of open
    /// files.
    fn limits(open_files: &str) -> String {
        format!(
            "Limit                     Soft Limit           Hard Limit           Units     \n\
             Max cpu time              unlimited            unlimited            seconds   \n\
             Max file size             unlimited            unlimited            bytes     \n\
             Max data size             unlimited            unlimited            bytes     \n\
             Max stack size            8388608              unlimited            bytes     \n\
             Max core file size        0                    unlimited            bytes     \n\
             Max resident set          unlimited            unlimited            bytes     \n\
             Max processes             63432                63432                processes \n\
             Max open files            {open_files:<20} 524288               files     \n\
             Max locked memory         8388608              8388608              bytes     \n\
             Max address space         unlimited            unlimited            bytes     \n\
             Max file locks            unlimited            unlimited            locks     \n\
             Max pending signals       63432                63432                signals   \n\
             Max msgqueue size         819200               819200               bytes     \n\
             Max nice priority         0                    0                    \n\
             Max realtime priority     0                    0                    \n\
             Max realtime timeout      unlimited            unlimited            us        \n"
        )
    }

    #[test]
    fn the_limits_file_gives_the_soft_limit_of_open_files() {
        assert_eq!(max_open_files(limits("1024").as_bytes()), Some(1024));
        assert_eq!(max_open_files(limits("unlimited").as_bytes()), None);
        assert_eq!(max_open_files(b"Max processes 5 5\n"), None);
        assert_eq!(max_open_files(b""), None);
    }

    #[test]
    fn a_procfs_tree_reads_to_its_figures() {
        let root = tempfile::tempdir().unwrap();
        let own = root.path().join("self");
        fs::create_dir_all(own.join("fd")).unwrap();
        fs::write(own.join("stat"), STAT).unwrap();
        fs::write(own.join("limits"), limits("4096")).unwrap();
        for fd in ["0", "1", "2", "7"] {
            fs::write(own.join("fd").join(fd), "").unwrap();
        }
        fs::write(
            root.path().join("stat"),
            "cpu  1 2 3 4 5 6 7 0 0 0\ncpu0 1 2 3 4 5 6 7 0 0 0\nintr 5\nctxt 88\nbtime 1796218200\nprocesses 9\nprocs_running 1\nprocs_blocked 0\n",
        )
        .unwrap();
        let process = OwnProcess::new(root.path());
        let reading = process.read().unwrap();
        assert_eq!(
            reading,
            OwnProcessReading {
                cpu_ticks: 175,
                ticks_per_second: process.ticks_per_second,
                resident_bytes: 5_000 * process.page_size,
                virtual_bytes: 1 << 30,
                start_time_ticks: 48_213,
                boot_time_unix_seconds: Some(1_796_218_200),
                open_fds: Some(4),
                max_fds: Some(4096),
            }
        );
        // Counted on a stand-in: its folder's size is not the count.
        fs::write(own.join("fd").join("9"), "").unwrap();
        assert_eq!(process.read().unwrap().open_fds, Some(5));
        // The limit is served for a minute; a new reader reads it again.
        fs::write(own.join("limits"), limits("8192")).unwrap();
        assert_eq!(process.read().unwrap().max_fds, Some(4096));
        assert_eq!(
            OwnProcess::new(root.path()).read().unwrap().max_fds,
            Some(8192)
        );
        // Without the limits and descriptors, the rest is still read; without stat, nothing.
        fs::remove_file(own.join("limits")).unwrap();
        fs::remove_dir_all(own.join("fd")).unwrap();
        let process = OwnProcess::new(root.path());
        let reading = process.read().unwrap();
        assert_eq!((reading.open_fds, reading.max_fds), (None, None));
        fs::remove_file(own.join("stat")).unwrap();
        assert_eq!(OwnProcess::new(root.path()).read(), None);
    }

    #[test]
    fn counting_stops_at_the_deadline() {
        let folder = tempfile::tempdir().unwrap();
        fs::write(folder.path().join("0"), "").unwrap();
        assert_eq!(count_entries(folder.path(), Instant::now()), None);
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(count_entries(folder.path(), later), Some(1));
    }

    /// `/proc` gives the count of open descriptors as their folder's size (Linux 6.2 and
    /// later), which is read instead of listing them; before, they are counted. Asked of
    /// a child, whose descriptors stay put while it sleeps (this test process's own count
    /// moves with the other tests, which also leak a few into the child). The kernel's count is of every descriptor number taken,
    /// which includes one that a thread blocked in `open` has reserved (another test's,
    /// here, copied into the child by `fork`) and a listing does not show: so at least
    /// the listing, and never a folder's byte size.
    #[test]
    fn the_descriptors_of_a_process_on_procfs_are_its_open_files() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(format!("/proc/{}", child.id()), root.path().join("self"))
            .unwrap();
        let process = OwnProcess::new(root.path());
        assert!(process.on_procfs);
        // The child may still be the test's fork, with its descriptors, until it execs.
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_link(format!("/proc/{}/exe", child.id()))
            .is_ok_and(|exe| !exe.ends_with("sleep"))
            && Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        let counted = process.open_fds(Instant::now() + BUDGET).unwrap();
        let listed = fs::read_dir(format!("/proc/{}/fd", child.id()))
            .unwrap()
            .count() as u64;
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            (listed..listed + 16).contains(&counted),
            "{counted} against {listed}"
        );
    }

    #[test]
    fn this_process_reads_as_itself() {
        let process = OwnProcess::new(Path::new("/proc"));
        assert!(process.on_procfs);
        let reading = process.read().unwrap();
        // The stat line comes from the file held open, read again for each reading.
        let again = process.read().unwrap();
        assert!(again.cpu_ticks >= reading.cpu_ticks, "{again:?}");
        assert_eq!(again.start_time_ticks, reading.start_time_ticks);
        let open = reading.open_fds.unwrap();
        assert!(open >= 3, "{reading:?}");
        assert!(open <= reading.max_fds.unwrap_or(u64::MAX), "{reading:?}");
        assert!(reading.resident_bytes > 0, "{reading:?}");
        assert!(
            reading.virtual_bytes >= reading.resident_bytes,
            "{reading:?}"
        );
        assert!(reading.boot_time_unix_seconds.is_some(), "{reading:?}");
    }
}
