//! Whether the container a process runs in still exists, from the kernel's view of its
//! PID namespace: a container with its own PID namespace ends when the namespace's PID 1
//! does (see [`NamespaceInit`]).
//!
//! A cgroup cannot tell this: the kernel refuses to remove a cgroup that still has a
//! live process in it (`rmdir` fails with `EBUSY`, on v1 and v2 alike), so the directory
//! of a leftover process's cgroup always exists.

use super::parse::PF_EXITING;
use super::reading::NamespaceInit;
use super::root::ProcRoot;
use std::collections::HashMap;
use std::fs;
use std::time::Instant;

/// Most ancestors to climb looking for a namespace's PID 1 before searching every process.
const MAX_ANCESTORS: usize = 64;

/// Finds PID 1 of nested PID namespaces for one observation, remembering what it found.
pub(super) struct NamespaceInits<'a> {
    root: &'a ProcRoot,
    deadline: Instant,
    /// Namespace inode to the PID (in our namespace) of its PID 1, when known.
    found: HashMap<u64, Option<u32>>,
    /// PID 1 of every nested namespace, from one pass over `/proc`; built on first need.
    index: Option<HashMap<u64, u32>>,
}

impl<'a> NamespaceInits<'a> {
    /// A finder that gives up searching every process once `deadline` has passed.
    pub(super) fn new(root: &'a ProcRoot, deadline: Instant) -> Self {
        NamespaceInits {
            root,
            deadline,
            found: HashMap::new(),
            index: None,
        }
    }

    /// Where PID 1 of `pid`'s PID namespace stands; `None` when `pid` lives in the
    /// namespace of the procfs we read (the host's, for an exporter run as documented) or
    /// its status cannot be read (it exited).
    pub(super) fn of(&mut self, pid: u32) -> Option<NamespaceInit> {
        let dir = self.root.pid_dir(pid);
        let levels = self.root.status(&dir).ok()?.nspid?;
        if levels.len() < 2 {
            return None;
        }
        let init = if levels.last() == Some(&1) {
            Some(pid)
        } else {
            let Some(namespace) = self.root.pid_namespace(&dir) else {
                // Reading another user's namespace link needs CAP_SYS_PTRACE.
                return Some(NamespaceInit::Unknown);
            };
            match self.found.get(&namespace) {
                Some(init) => *init,
                None => {
                    let init = self
                        .among_ancestors(pid, namespace, levels.len())
                        .or_else(|| self.indexed(namespace));
                    self.found.insert(namespace, init);
                    init
                }
            }
        };
        Some(init.map_or(NamespaceInit::Unknown, |init| self.state_of(init)))
    }

    /// PID 1 of `namespace`, climbing from `pid` through parents in the same namespace:
    /// a container's processes descend from its PID 1, except those entered from outside
    /// (`docker exec`), whose parents are outside.
    fn among_ancestors(&self, pid: u32, namespace: u64, depth: usize) -> Option<u32> {
        let mut current = self.parent_of(pid)?;
        for _ in 0..MAX_ANCESTORS {
            let dir = self.root.pid_dir(current);
            let levels = self.root.status(&dir).ok()?.nspid?;
            if levels.len() != depth || self.root.pid_namespace(&dir)? != namespace {
                return None;
            }
            if levels.last() == Some(&1) {
                return Some(current);
            }
            current = self.parent_of(current)?;
        }
        None
    }

    /// PID 1 of `namespace` from one pass over every process, made once per observation.
    fn indexed(&mut self, namespace: u64) -> Option<u32> {
        let root = self.root;
        let deadline = self.deadline;
        let index = self.index.get_or_insert_with(|| {
            let mut index = HashMap::new();
            for pid in root.pids().unwrap_or_default() {
                if Instant::now() > deadline {
                    break;
                }
                let dir = root.pid_dir(pid);
                let Some(levels) = root.status(&dir).ok().and_then(|status| status.nspid) else {
                    continue;
                };
                if levels.len() >= 2 && levels.last() == Some(&1) {
                    if let Some(namespace) = root.pid_namespace(&dir) {
                        index.insert(namespace, pid);
                    }
                }
            }
            index
        });
        index.get(&namespace).copied()
    }

    /// Exited when every thread of `init` is exiting; running when one is not.
    fn state_of(&self, init: u32) -> NamespaceInit {
        let Ok(tasks) = fs::read_dir(self.root.pid_dir(init).join("task")) else {
            return NamespaceInit::Unknown;
        };
        let mut threads = 0;
        for task in tasks.flatten() {
            let Ok(fields) = self.root.stat(&task.path()) else {
                continue;
            };
            if fields.flags & PF_EXITING == 0 {
                return NamespaceInit::Running { pid: init };
            }
            threads += 1;
        }
        if threads == 0 {
            NamespaceInit::Unknown
        } else {
            NamespaceInit::Exited { pid: init }
        }
    }

    fn parent_of(&self, pid: u32) -> Option<u32> {
        let stat = self.root.stat(&self.root.pid_dir(pid)).ok()?;
        Some(stat.ppid).filter(|&ppid| ppid != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A procfs tree with just the files the finder reads.
    struct FakeProc(tempfile::TempDir);

    impl FakeProc {
        fn new() -> FakeProc {
            FakeProc(tempfile::tempdir().unwrap())
        }

        /// Process `pid` with `nspid` levels, parent `ppid`, PID namespace `namespace`
        /// and one line of `PF_*` flags per thread.
        fn process(&self, pid: u32, nspid: &[u32], ppid: u32, namespace: u64, threads: &[u32]) {
            let dir = self.0.path().join(pid.to_string());
            fs::create_dir_all(dir.join("ns")).unwrap();
            let levels: Vec<String> = nspid.iter().map(u32::to_string).collect();
            fs::write(
                dir.join("status"),
                format!("Name:\tx\nNSpid:\t{}\n", levels.join("\t")),
            )
            .unwrap();
            let stat = |flags: u32| {
                format!(
                    "{pid} (x) S {ppid} {pid} {pid} 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 500 0"
                )
            };
            fs::write(dir.join("stat"), stat(threads[0])).unwrap();
            std::os::unix::fs::symlink(format!("pid:[{namespace}]"), dir.join("ns/pid")).unwrap();
            for (index, flags) in threads.iter().enumerate() {
                let task = dir.join(format!("task/{}", pid + index as u32));
                fs::create_dir_all(&task).unwrap();
                fs::write(task.join("stat"), stat(*flags)).unwrap();
            }
        }

        fn init_of(&self, pid: u32) -> Option<NamespaceInit> {
            let root = ProcRoot {
                root: self.0.path().to_path_buf(),
                device_prefix: b"/dev/nvidia".to_vec(),
                stand_in: false,
            };
            NamespaceInits::new(&root, Instant::now() + Duration::from_secs(5)).of(pid)
        }
    }

    const HOST: u64 = 4_026_531_836;
    const CONTAINER: u64 = 4_026_532_177;
    const LIVE: u32 = 0x0040_0100;
    const EXITING: u32 = 0x0040_060C;

    #[test]
    fn a_process_of_our_namespace_has_no_container_init() {
        let proc = FakeProc::new();
        proc.process(100, &[100], 1, HOST, &[LIVE]);
        assert_eq!(proc.init_of(100), None);
    }

    #[test]
    fn a_live_pid_1_means_the_container_runs() {
        let proc = FakeProc::new();
        proc.process(150, &[150, 1], 90, CONTAINER, &[LIVE]);
        proc.process(200, &[200, 5], 150, CONTAINER, &[LIVE]);
        assert_eq!(proc.init_of(200), Some(NamespaceInit::Running { pid: 150 }));
        assert_eq!(proc.init_of(150), Some(NamespaceInit::Running { pid: 150 }));
    }

    #[test]
    fn an_exiting_pid_1_means_the_container_has_ended() {
        let proc = FakeProc::new();
        proc.process(150, &[150, 1], 90, CONTAINER, &[EXITING]);
        proc.process(200, &[200, 5], 150, CONTAINER, &[LIVE]);
        assert_eq!(proc.init_of(200), Some(NamespaceInit::Exited { pid: 150 }));
    }

    #[test]
    fn a_pid_1_whose_main_thread_exited_but_another_lives_still_runs() {
        let proc = FakeProc::new();
        proc.process(150, &[150, 1], 90, CONTAINER, &[EXITING, LIVE]);
        proc.process(200, &[200, 5], 150, CONTAINER, &[LIVE]);
        assert_eq!(proc.init_of(200), Some(NamespaceInit::Running { pid: 150 }));
    }

    #[test]
    fn a_process_entered_from_outside_is_matched_by_namespace() {
        let proc = FakeProc::new();
        proc.process(90, &[90], 1, HOST, &[LIVE]);
        proc.process(150, &[150, 1], 90, CONTAINER, &[EXITING]);
        // `docker exec`: its parent is the runtime's shim, outside the namespace.
        proc.process(300, &[300, 9], 90, CONTAINER, &[LIVE]);
        proc.process(310, &[310, 1], 90, CONTAINER + 1, &[LIVE]);
        assert_eq!(proc.init_of(300), Some(NamespaceInit::Exited { pid: 150 }));
    }

    #[test]
    fn a_pid_1_that_cannot_be_found_is_unknown_never_ended() {
        let proc = FakeProc::new();
        proc.process(300, &[300, 9], 90, CONTAINER, &[LIVE]);
        assert_eq!(proc.init_of(300), Some(NamespaceInit::Unknown));
        fs::remove_file(proc.0.path().join("300/ns/pid")).unwrap();
        assert_eq!(proc.init_of(300), Some(NamespaceInit::Unknown));
    }

    #[test]
    fn a_process_that_exited_has_nothing_to_say() {
        assert_eq!(FakeProc::new().init_of(4242), None);
    }
}
