//! What the exporter keeps of processes from one look at `/proc` to the next
//! ([`EarlierLooks`]), so that a scrape reads again only what can have changed.

use super::parse::{self, Stat};
use super::reading::{ProcessFacts, WitnessedProcess};
use super::references::FdDirectory;
use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

/// What the exporter keeps of a process from one look to the next. A PID names a
/// process only with its start time, so an entry serves only the process it was read
/// from: any other start time under the PID is a stranger, read afresh.
#[derive(Debug, Clone)]
pub struct Remembered {
    pub(super) start_time_ticks: u64,
    /// The last full reading, when one was made (holders and owners).
    pub(super) facts: Option<Arc<ProcessFacts>>,
    /// Whether it lives in a PID namespace nested in the procfs's: only then is its
    /// container's PID 1 looked up again (`None`: not known yet).
    pub(super) nested: Option<bool>,
    /// Its descriptor directory at the last scan (which process it is, and how many
    /// descriptors it had): what tells the scan that a process without NVIDIA files still
    /// has none, without reading anything else of it.
    pub(super) fd_directory: Option<FdDirectory>,
    /// Whether the last scan found NVIDIA files among its descriptors.
    pub(super) held_nvidia: bool,
    /// Whether it is a kernel thread, which never holds a file.
    pub(super) kernel_thread: bool,
    /// The inode of its `/proc/PID` directory when the scan last listed it: a process
    /// that gets the PID later gets a directory of its own.
    pub(super) directory: Option<u64>,
    /// An owner's stat file, held open: reading it again is one system call instead of
    /// three, and once the process is gone a read fails (ESRCH) rather than show another
    /// process that got its PID.
    pub(super) stat_file: Option<Arc<fs::File>>,
    /// What an exporter saw of it before this one read it (the witness state), until it
    /// is read: its reading then carries it on.
    pub(super) witnessed: Option<Arc<WitnessedProcess>>,
}

impl Remembered {
    /// Whether it lives in a PID namespace nested in the procfs's (`None`: not known).
    pub(super) fn nested(&self) -> Option<bool> {
        self.nested
    }

    /// Whether the scan may take this process as it was without reading it again: it
    /// held no NVIDIA file, and its descriptor directory is the one seen then (the same
    /// process: a process that gets the PID later gets a directory of its own) with as
    /// many descriptors, and some (a count of 0 says nothing on kernels before 6.2), or
    /// it is a kernel thread. A process that opens one file and closes another in between
    /// is not seen: the price of not listing every process's descriptors on every scan.
    pub(super) fn holds_no_nvidia_file_still(&self, now: FdDirectory) -> bool {
        !self.held_nvidia && (now.size > 0 || self.kernel_thread) && self.fd_directory == Some(now)
    }

    /// This entry with a newer full reading of the same process (without copying the
    /// reading it replaces).
    pub(super) fn with_facts(&self, facts: Arc<ProcessFacts>) -> Remembered {
        Remembered {
            start_time_ticks: self.start_time_ticks,
            facts: Some(facts),
            nested: self.nested,
            fd_directory: self.fd_directory,
            held_nvidia: self.held_nvidia,
            kernel_thread: self.kernel_thread,
            directory: self.directory,
            stat_file: self.stat_file.clone(),
            witnessed: None,
        }
    }

    /// This entry without its reading and held file, for a look that read neither
    /// again: merged into the earlier looks, it keeps the reading and file they have.
    pub(super) fn unchanged(&self) -> Remembered {
        Remembered {
            start_time_ticks: self.start_time_ticks,
            facts: None,
            nested: self.nested,
            fd_directory: self.fd_directory,
            held_nvidia: self.held_nvidia,
            kernel_thread: self.kernel_thread,
            directory: self.directory,
            stat_file: None,
            witnessed: None,
        }
    }

    /// Close the held stat file of a process that is no longer an owner.
    pub(super) fn let_go_of_stat_file(&mut self) {
        self.stat_file = None;
    }

    /// This entry brought up to date by a newer look at the same PID: the newer wins, but
    /// a full reading it did not redo is kept while the process is the same.
    fn updated_by(self, newer: Remembered) -> Remembered {
        if self.start_time_ticks != newer.start_time_ticks {
            return newer;
        }
        // Until a full reading carries it on.
        let witnessed = match (&newer.facts, &self.facts) {
            (None, None) => newer.witnessed.clone().or(self.witnessed.clone()),
            _ => None,
        };
        Remembered {
            facts: newer.facts.or(self.facts),
            nested: newer.nested.or(self.nested),
            fd_directory: newer.fd_directory.or(self.fd_directory),
            directory: newer.directory.or(self.directory),
            stat_file: newer.stat_file.or(self.stat_file),
            witnessed,
            ..newer
        }
    }
}

/// Processes remembered from earlier looks, by the procfs's PID.
pub type EarlierLooks = HashMap<u32, Remembered>;

/// Remember what an exporter saw of `processes` before this one looked (the witness
/// state), as what earlier looks found: the first reading of each, if it is the same
/// process, carries it on.
pub fn remember_witnessed(earlier_looks: &mut EarlierLooks, processes: &[WitnessedProcess]) {
    for process in processes {
        earlier_looks
            .entry(process.pid)
            .or_insert_with(|| Remembered {
                start_time_ticks: process.start_time_ticks,
                facts: None,
                nested: None,
                fd_directory: None,
                held_nvidia: false,
                kernel_thread: false,
                directory: None,
                stat_file: None,
                witnessed: Some(Arc::new(process.clone())),
            });
    }
}

/// Add what a look learnt to the earlier looks, keeping a reading the look did not redo.
pub(super) fn remember(earlier_looks: &mut EarlierLooks, learnt: Vec<(u32, Remembered)>) {
    for (pid, newer) in learnt {
        let merged = match earlier_looks.remove(&pid) {
            Some(older) => older.updated_by(newer),
            None => newer,
        };
        earlier_looks.insert(pid, merged);
    }
}

/// The stat line read again through a held file; `None` once the process is gone.
pub(super) fn read_held_stat(file: &fs::File) -> Option<Stat> {
    use std::os::unix::fs::FileExt;
    let mut line = [0u8; 1024];
    let length = file.read_at(&mut line, 0).ok()?;
    // A line that fills the buffer may be cut: read it by path instead.
    (length < line.len()).then(|| parse::stat(&line[..length]))?
}

/// A process's stat file, opened for holding, if it is still the process that started at
/// `start_time_ticks`.
pub(super) fn open_stat_file(dir: &Path, start_time_ticks: u64) -> Option<Arc<fs::File>> {
    let file = fs::File::open(dir.join("stat")).ok()?;
    let stat = read_held_stat(&file)?;
    (stat.start_time_ticks == start_time_ticks).then(|| Arc::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
}
