//! Real processes holding device files ([`Holder`]), and what `/proc` says about a process.

use crate::model::Model;
use crate::wait_until;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

/// A real process holding a device file, killed and reaped when dropped.
pub struct Holder {
    pub pid: u32,
    /// Our own child, waited for when it is killed; `None` for a process this test
    /// adopted as subreaper, reaped with waitpid instead.
    pub(super) child: Option<Child>,
}

impl Holder {
    /// A model CUDA process named `cuda-job` with a context on `device`'s GPU.
    pub fn spawn(device: &Path) -> Holder {
        Model::cuda("cuda-job", device).spawn()
    }

    /// A `sleep` process with just `file` open: a process that never touched a GPU when
    /// `file` is not a device node.
    pub fn opening(file: &Path) -> Holder {
        let child = Command::new("sh")
            .arg("-c")
            .arg("exec 3<\"$1\"; exec sleep 1000")
            .arg("sh")
            .arg(file)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn holder");
        let pid = child.id();
        wait_until(
            "the process has opened its file",
            Duration::from_secs(10),
            || holds(pid, file) && proc_state(pid) == Some('S'),
        );
        Holder {
            pid,
            child: Some(child),
        }
    }

    /// The fork-inherited orphan: a model CUDA process `cuda-job` forks one child,
    /// `dataloader`, that inherits its descriptors and mappings, and exits. Returns the
    /// dead (and reaped) owner's PID and the live child.
    pub fn fork_orphan(device: &Path) -> (u32, Holder) {
        let (owner, mut children) = Model::cuda("cuda-job", device).fork_orphan(1, "dataloader");
        (owner, children.remove(0))
    }

    /// A model CUDA owner `cuda-job` whose main thread called pthread_exit while another
    /// thread lives on with its context: state Z, an empty `/proc/PID/fd`.
    pub fn zombie_main_thread(device: &Path) -> Holder {
        Model::cuda("cuda-job", device).zombie_leader()
    }

    /// A model CUDA process in a MIG instance: it maps `files[0]`, the GPU's node (and the
    /// control node), and holds the rest open, the instance's capability nodes.
    pub fn holding(files: &[&Path]) -> Holder {
        mig_model(files).spawn()
    }

    /// The fork-inherited orphan of such a process: the owner forks a child `dataloader`
    /// that inherits its files and mappings, and exits. Returns the dead (and reaped)
    /// owner's PID and the live child.
    pub fn fork_orphan_holding(files: &[&Path]) -> (u32, Holder) {
        let (owner, mut children) = mig_model(files).fork_orphan(1, "dataloader");
        (owner, children.remove(0))
    }

    /// Stop it with SIGSTOP and wait until the kernel says so.
    pub fn stop(&self) {
        signal(self.pid, libc::SIGSTOP);
        wait_until("the process is stopped", Duration::from_secs(10), || {
            proc_state(self.pid) == Some('T')
        });
    }

    /// SIGKILL it and reap it.
    pub fn kill(mut self) {
        self.kill_and_reap();
    }

    /// SIGKILL it and leave it unreaped, as a parent that does not reap (a stopped or hung
    /// server, a container's PID 1 that reaps nothing) leaves it: returns once it is a
    /// zombie. It is reaped when the result is dropped.
    pub fn kill_leaving_unreaped(mut self) -> Unreaped {
        signal(self.pid, libc::SIGKILL);
        wait_until(
            "the killed process is a zombie",
            Duration::from_secs(10),
            || proc_state(self.pid) == Some('Z'),
        );
        let unreaped = Unreaped(Holder {
            pid: self.pid,
            child: self.child.take(),
        });
        // This holder's own drop would reap it now.
        std::mem::forget(self);
        unreaped
    }

    fn kill_and_reap(&mut self) {
        let _ = unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        match self.child.take() {
            Some(mut child) => {
                let _ = child.wait();
            }
            None => {
                // Our adopted child (we are its subreaper): reap it ourselves.
                // SAFETY: waitpid on a PID we adopted; the status pointer may be null.
                unsafe { libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0) };
            }
        }
    }
}

/// A killed process that nobody has reaped yet (state Z); reaped when dropped.
pub struct Unreaped(Holder);

impl Unreaped {
    /// Its PID, which NVML may go on charging.
    pub fn pid(&self) -> u32 {
        self.0.pid
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if self.child.is_some() || proc_state(self.pid).is_some() {
            self.kill_and_reap();
        }
    }
}

/// A model CUDA process mapping `files[0]` and holding the others open.
fn mig_model(files: &[&Path]) -> Model {
    files[1..]
        .iter()
        .fold(Model::cuda("cuda-job", files[0]), |model, file| {
            model.also_opening(file)
        })
}

/// Send `signal` to `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal}) failed");
}

/// The one-letter state of `pid`, or `None` once it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Whether `pid` has `path` open.
pub fn holds(pid: u32, path: &Path) -> bool {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    entries
        .flatten()
        .any(|entry| fs::read_link(entry.path()).is_ok_and(|target| target == path))
}

/// Make this test process adopt orphaned grandchildren, so their parent PID is ours
/// (not init's) and the tests can reap them.
pub(super) fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument.
        let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(result, 0, "prctl(PR_SET_CHILD_SUBREAPER)");
    });
}

/// A PID that no process has: above the kernel's pid_max.
pub fn nonexistent_pid() -> u32 {
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(4_194_304);
    max + 1
}

/// The command name of `pid`, or `None` once it is gone.
pub fn proc_comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|comm| comm.trim_end().to_string())
}

/// The start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process exists");
    let after_comm = stat.rsplit_once(") ").expect("stat format").1;
    // Fields after the command name start at field 3 (the state).
    after_comm
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|ticks| ticks.parse().ok())
        .expect("start time")
}

/// The effective user id of this test process (the owner of every process it spawns).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The name the host's password file gives `uid`.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.get(2)?.parse::<u32>().ok()? == uid).then(|| fields[0].to_string())
    })
}

/// The process group and session of `pid`, from `/proc/PID/stat`.
pub fn process_group_and_session(pid: u32) -> (u32, u32) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat.rsplit_once(") ").expect("comm").1.split(' ').collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap())
}

/// The PIDs whose parent is `pid`, from every `/proc/PID/stat`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(") ")?.1.to_string();
                    after.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The kernel's `PF_*` flags of `pid` (field 9 of `/proc/PID/stat`), `None` once it is gone.
pub fn task_flags(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(6)?.parse().ok()
}

/// The threads of process `pid`, as `/proc/PID/status` counts them.
pub fn thread_count(pid: u32) -> u32 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("a live process");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("a Threads line")
}
