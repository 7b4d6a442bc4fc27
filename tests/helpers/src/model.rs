//! The model processes: a Python program (`model.py` beside this file) that names
//! itself, opens and maps the files it is told to, then holds them, forks children that
//! inherit them, or lets its main thread exit. A CUDA process opens *and* maps its GPU's
//! node and the control node read-write (a context is read-write shared mappings of both,
//! measured on an H200); an NVML client such as a monitoring agent opens the same nodes
//! and maps nothing; the MPS control daemon maps the GPU's node only write-only and the
//! control node only read-only, and its server, its child, maps both read-write.

use crate::processes::{become_subreaper, effective_uid, proc_comm, proc_state, signal, Holder};
use crate::{require_tool, wait_until};
use serde_json::{json, Value};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The model program's source.
const MODEL: &str = include_str!("model.py");

/// The model program, for `python3 -c`.
pub fn model_program() -> &'static str {
    MODEL
}

/// A model process to start (see the module's documentation).
#[derive(Clone)]
pub struct Model {
    name: String,
    open: Vec<PathBuf>,
    map: Vec<PathBuf>,
    map_write_only: Vec<PathBuf>,
    map_read_only: Vec<PathBuf>,
    session_leader: bool,
}

impl Model {
    /// A CUDA process with a context on `device`'s GPU: it opens the GPU node, the
    /// control node and the UVM node, and maps the GPU node and the control node.
    pub fn cuda(name: &str, device: &Path) -> Model {
        Model {
            name: name.into(),
            open: vec![uvm_node(device)],
            map: vec![device.to_path_buf(), control_node(device)],
            map_write_only: Vec::new(),
            map_read_only: Vec::new(),
            session_leader: true,
        }
    }

    /// The MPS control daemon as the H200 showed it (`nvidia-cuda-mps-control -d`, whose
    /// command name is `nvidia-cuda-mps`): leading its own session, it holds `device`'s
    /// node and the control node open and maps the GPU's node write-only (two pages) and
    /// the control node read-only, which is a driver initialised without a context.
    pub fn mps_control_daemon(device: &Path) -> Model {
        Model {
            name: "nvidia-cuda-mps".into(),
            open: Vec::new(),
            map: Vec::new(),
            map_write_only: vec![device.to_path_buf(), device.to_path_buf()],
            map_read_only: vec![control_node(device)],
            session_leader: true,
        }
    }

    /// An NVML client (a monitoring agent, a device plugin): it opens the GPU node, the
    /// control node and the UVM node, and maps nothing.
    pub fn agent(name: &str, device: &Path) -> Model {
        Model {
            name: name.into(),
            open: vec![device.to_path_buf(), control_node(device), uvm_node(device)],
            map: Vec::new(),
            map_write_only: Vec::new(),
            map_read_only: Vec::new(),
            session_leader: true,
        }
    }

    /// Run in the session and process group of this test, as a process started by a
    /// launcher is, rather than leading its own as a job started from a shell does. The
    /// kernel keeps a PID from reuse while it names a live session or group, so only a
    /// dead owner that led neither can see its PID come round again.
    pub fn in_launchers_session(mut self) -> Model {
        self.session_leader = false;
        self
    }

    /// Also open `file` (another GPU's node, as the CUDA runtime opens every visible GPU's).
    pub fn also_opening(mut self, file: &Path) -> Model {
        self.open.push(file.to_path_buf());
        self
    }

    fn spec(&self, mode: &str) -> Value {
        json!({
            "name": self.name,
            "open": self.open,
            "map": self.map,
            "map_write_only": self.map_write_only,
            "map_read_only": self.map_read_only,
            "mode": mode,
            "children": 1,
            "child_name": self.name,
            "child_zombie_leader": false,
            "session_leader": self.session_leader,
        })
    }

    /// Its description for the model program, to start it some other way.
    pub fn spec_json(&self) -> String {
        self.spec("hold").to_string()
    }

    /// Its description for a model that forks `children` and then holds its files beside
    /// them (a container's PID 1 and a child), to start it some other way.
    pub fn spec_forking_and_staying(&self, children: usize) -> String {
        let mut spec = self.spec("fork-and-stay");
        spec["children"] = json!(children);
        spec.to_string()
    }

    /// Also map `device` (a context on a second GPU).
    pub fn also_mapping(mut self, device: &Path) -> Model {
        self.map.push(device.to_path_buf());
        self
    }

    fn command(spec: &Value) -> Command {
        let mut command = Command::new("python3");
        command
            .arg("-c")
            .arg(MODEL)
            .arg(spec.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        command
    }

    /// Start it, holding its files, and return once it holds them.
    pub fn spawn(&self) -> Holder {
        self.spawn_with(Self::command(&self.spec("hold")))
    }

    fn spawn_with(&self, mut command: Command) -> Holder {
        let mut child = command
            .spawn()
            .expect("spawn python3 (install it with: apt-get install -y python3)");
        let pid = child.id();
        ready(&first_line(&mut child), pid, 'S', "the model is asleep");
        Holder {
            pid,
            child: Some(child),
        }
    }

    /// Start it as the MPS control daemon with its server (see
    /// [`Model::mps_control_daemon`]): the server is its child, in its session, named
    /// `nvidia-cuda-mps` too, and maps `device`'s node and the control node read-write, as
    /// the server holding every client's context does. Returns once both hold their files.
    pub fn spawn_with_mps_server(&self, device: &Path) -> Mps {
        let mut spec = self.spec("mps-daemon");
        spec["child_name"] = json!("nvidia-cuda-mps");
        spec["server_map"] = json!([device, control_node(device)]);
        // The server reaches this process when the daemon is killed, to be reaped here.
        become_subreaper();
        let mut child = Self::command(&spec)
            .spawn()
            .expect("spawn python3 (install it with: apt-get install -y python3)");
        let pid = child.id();
        let line = first_line(&mut child);
        let server = line
            .strip_prefix("SERVER ")
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap_or_else(|| panic!("not a SERVER line: {line}"));
        ready(
            &first_line(&mut child),
            pid,
            'S',
            "the MPS daemon is asleep",
        );
        wait_until(
            "the MPS server is named and asleep",
            Duration::from_secs(10),
            || {
                proc_comm(server).as_deref() == Some("nvidia-cuda-mps")
                    && proc_state(server) == Some('S')
            },
        );
        Mps {
            daemon: Holder {
                pid,
                child: Some(child),
            },
            server,
        }
    }

    /// Start it as a live owner that has forked `children` named `child_name`, which keep
    /// its descriptors and mappings beside it; returns once all are asleep. The children
    /// reach this test (a subreaper) when the owner dies.
    pub fn spawn_with_children(&self, children: usize, child_name: &str) -> (Holder, Vec<Holder>) {
        let mut spec = self.spec("hold-and-fork");
        spec["children"] = json!(children);
        spec["child_name"] = json!(child_name);
        become_subreaper();
        let mut owner = Self::command(&spec).spawn().expect("spawn python3");
        let pids: Vec<u32> = (0..children).map(|_| child_pid(&mut owner)).collect();
        let pid = owner.id();
        ready(&first_line(&mut owner), pid, 'S', "the owner is asleep");
        let children = named_children(pids, child_name, &['S']);
        (
            Holder {
                pid,
                child: Some(owner),
            },
            children,
        )
    }

    /// Start it as a live owner that forks `children` named `child_name` and exits when
    /// told ([`ForkingOwner::orphan_now`]).
    pub fn spawn_forking_later(&self, children: usize, child_name: &str) -> ForkingOwner {
        let mut spec = self.spec("hold-then-fork");
        spec["children"] = json!(children);
        spec["child_name"] = json!(child_name);
        // Children must reach this process when the owner exits.
        become_subreaper();
        ForkingOwner {
            owner: self.spawn_with(Self::command(&spec)),
            children,
            child_name: child_name.into(),
        }
    }

    /// Start it at exactly `pid` (free, as a reaped process's PID is): how a dead owner's
    /// PID comes round again. `clone3` with `set_tid` asks the kernel for that PID alone,
    /// so no other process of the test run is steered onto it meanwhile (as writing
    /// `/proc/sys/kernel/ns_last_pid` would). Needs root.
    pub fn spawn_at(&self, pid: u32) -> Holder {
        use std::ffi::CString;
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        assert_eq!(
            effective_uid(),
            0,
            "starting a process at a chosen PID (clone3 with set_tid) needs the tests to run as root"
        );
        // Everything the child needs, made before the clone: after it, in a copy of this
        // multithreaded process, only async-signal-safe calls are allowed.
        let program = CString::new(
            require_tool("python3", "python3")
                .into_os_string()
                .into_vec(),
        )
        .unwrap();
        let spec = self.spec("hold").to_string();
        let argv_owned: Vec<CString> = ["python3", "-c", MODEL, spec.as_str()]
            .iter()
            .map(|arg| CString::new(*arg).unwrap())
            .collect();
        let mut argv: Vec<*const libc::c_char> =
            argv_owned.iter().map(|arg| arg.as_ptr()).collect();
        argv.push(std::ptr::null());
        let env_owned: Vec<CString> = std::env::vars_os()
            .map(|(key, value)| {
                let mut pair = key.as_bytes().to_vec();
                pair.push(b'=');
                pair.extend_from_slice(value.as_bytes());
                CString::new(pair).unwrap()
            })
            .collect();
        let mut envp: Vec<*const libc::c_char> =
            env_owned.iter().map(|pair| pair.as_ptr()).collect();
        envp.push(std::ptr::null());
        let mut pipe = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0,
            "pipe2"
        );
        let tid = [pid as libc::pid_t];
        // SAFETY: clone_args is plain data; zero is "not set" for every field we leave.
        let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
        args.exit_signal = libc::SIGCHLD as u64;
        args.set_tid = tid.as_ptr() as u64;
        args.set_tid_size = 1;
        // SAFETY: a fork-like clone (no shared memory); the child below only duplicates a
        // descriptor, execs and exits, all async-signal-safe, on data made before.
        let cloned = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const libc::clone_args,
                std::mem::size_of::<libc::clone_args>(),
            )
        };
        if cloned == 0 {
            // SAFETY: see above.
            unsafe {
                libc::dup2(pipe[1], 1);
                libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
                libc::_exit(127);
            }
        }
        let error = std::io::Error::last_os_error();
        // SAFETY: closing the write end we own; the child has its copy.
        unsafe { libc::close(pipe[1]) };
        assert!(
            cloned == i64::from(pid),
            "could not start a process at PID {pid}: {error}"
        );
        // SAFETY: the read end is ours; File closes it when dropped.
        let mut output = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
        ready(&read_line(&mut output), pid, 'S', "the model is asleep");
        // Not a std Child: it is reaped with waitpid when dropped, as an adopted one is.
        Holder { pid, child: None }
    }

    /// An inference server as vLLM and SGLang start theirs (see `model.py`, mode
    /// "server"): it leads its own session, holds nothing, and starts `workers`
    /// `multiprocessing` spawn workers named `worker_name`, each opening and mapping this
    /// model's files. Returns once every worker holds them; the workers are this test's
    /// (a subreaper's) to reap once the server is gone.
    pub fn spawn_server(&self, workers: usize, worker_name: &str) -> Server {
        self.spawn_server_with(workers, worker_name, "spawn", None)
    }

    /// Like [`Model::spawn_server`], its workers started with `start_method` (`spawn` or
    /// `fork`) and retitled `title` with `setproctitle` from the Python registry (installed
    /// by `tests/tools.sh`), as SGLang's schedulers and vLLM's engine core retitle theirs:
    /// the title replaces their command line, and its first 15 bytes are their command
    /// name.
    pub fn spawn_titled_server(&self, workers: usize, start_method: &str, title: &str) -> Server {
        self.spawn_server_with(
            workers,
            &title[..title.len().min(15)],
            start_method,
            Some(title),
        )
    }

    fn spawn_server_with(
        &self,
        workers: usize,
        worker_name: &str,
        start_method: &str,
        title: Option<&str>,
    ) -> Server {
        become_subreaper();
        let mut spec = self.spec("server");
        spec["start_method"] = json!(start_method);
        spec["title"] = json!(title);
        spec["open"] = json!([]);
        spec["map"] = json!([]);
        spec["worker_open"] = json!(self.open);
        spec["worker_map"] = json!(self.map);
        spec["children"] = json!(workers);
        spec["child_name"] = json!(worker_name);
        let mut command = Self::command(&spec);
        if title.is_some() {
            command.env("PYTHONPATH", setproctitle_path());
        }
        let mut server = command.spawn().expect("spawn python3");
        let pids: Vec<u32> = (0..workers)
            .map(|_| {
                let line = first_line(&mut server);
                line.strip_prefix("WORKER ")
                    .and_then(|pid| pid.trim().parse().ok())
                    .unwrap_or_else(|| panic!("not a WORKER line: {line}"))
            })
            .collect();
        let pid = server.id();
        ready(&first_line(&mut server), pid, 'S', "the server is asleep");
        let workers = pids
            .into_iter()
            .map(|pid| {
                wait_until("the worker is named", Duration::from_secs(10), || {
                    proc_comm(pid).as_deref() == Some(worker_name)
                });
                Holder { pid, child: None }
            })
            .collect();
        Server {
            server: Holder {
                pid,
                child: Some(server),
            },
            workers,
        }
    }

    /// A daemon holding this model's files that double-forked (fork, setsid, fork) as
    /// classic daemons do: the holder, named `name`, leads neither its group nor its
    /// session, whose leader exited at once, and this test (a subreaper) adopted it.
    pub fn spawn_daemon(&self, name: &str) -> Holder {
        self.detached("daemon", name)
    }

    /// A service holding this model's files, started by a launcher that gives it a
    /// session of its own and exits: the holder, named `name`, leads its session and
    /// group, and this test (a subreaper) adopted it.
    pub fn launch_service(&self, name: &str) -> Holder {
        self.detached("launch-service", name)
    }

    fn detached(&self, mode: &str, name: &str) -> Holder {
        become_subreaper();
        let mut spec = self.spec(mode);
        spec["child_name"] = json!(name);
        let mut launcher = Self::command(&spec).spawn().expect("spawn python3");
        let pid = child_pid(&mut launcher);
        launcher.wait().expect("reap the launcher");
        wait_until(
            "the holder is named and asleep",
            Duration::from_secs(10),
            || proc_comm(pid).as_deref() == Some(name) && proc_state(pid) == Some('S'),
        );
        Holder { pid, child: None }
    }

    /// A parent holding this model's files with a child named `child_name` holding them
    /// too; on SIGUSR1 the parent execs another program under the same PID.
    pub fn spawn_reexecing_parent(&self, child_name: &str) -> (Holder, Holder) {
        let mut spec = self.spec("reexec");
        spec["child_name"] = json!(child_name);
        let mut parent = Self::command(&spec).spawn().expect("spawn python3");
        let child = child_pid(&mut parent);
        let pid = parent.id();
        ready(&first_line(&mut parent), pid, 'S', "the parent is asleep");
        wait_until("the child is named", Duration::from_secs(10), || {
            proc_comm(child).as_deref() == Some(child_name)
        });
        (
            Holder {
                pid,
                child: Some(parent),
            },
            Holder {
                pid: child,
                child: None,
            },
        )
    }

    /// The fork-inherited orphan: it forks `children` named `child_name` that inherit its
    /// descriptors and mappings, and exits. Returns the dead (and reaped) owner's PID and
    /// the live children, whose parent becomes this test process (a child subreaper).
    pub fn fork_orphan(&self, children: usize, child_name: &str) -> (u32, Vec<Holder>) {
        self.fork(children, child_name, false)
    }

    /// Like [`Model::fork_orphan`] with one child whose main thread then calls
    /// pthread_exit while another thread lives on: state Z, empty `/proc/PID/fd` and
    /// `/proc/PID/maps`, the files and mappings only in the live thread's lists.
    pub fn fork_orphan_with_zombie_leader(&self, child_name: &str) -> (u32, Holder) {
        let (owner, mut children) = self.fork(1, child_name, true);
        let child = children.remove(0);
        wait_until(
            "the child's main thread is a zombie",
            Duration::from_secs(10),
            || proc_state(child.pid) == Some('Z'),
        );
        (owner, child)
    }

    fn fork(&self, children: usize, child_name: &str, zombie_leader: bool) -> (u32, Vec<Holder>) {
        become_subreaper();
        let mut spec = self.spec("fork");
        spec["children"] = json!(children);
        spec["child_name"] = json!(child_name);
        spec["child_zombie_leader"] = json!(zombie_leader);
        let mut owner = Self::command(&spec).spawn().expect("spawn python3");
        // A child whose main thread is to exit may already have done so.
        let holders = orphaned_children(&mut owner, children, child_name, &['S', 'Z']);
        (owner.id(), holders)
    }

    /// Start it and let its main thread exit while another thread lives on with the
    /// files: state Z, an empty `/proc/PID/fd`, the files only in a thread's list.
    pub fn zombie_leader(&self) -> Holder {
        let mut child = Self::command(&self.spec("zombie-leader"))
            .spawn()
            .expect("spawn python3");
        let pid = child.id();
        ready(
            &first_line(&mut child),
            pid,
            'Z',
            "the main thread is a zombie",
        );
        Holder {
            pid,
            child: Some(child),
        }
    }
}

/// Where `tests/tools.sh` installed `setproctitle`, for PYTHONPATH.
fn setproctitle_path() -> PathBuf {
    let output = Command::new(crate::repository().join("tests/tools.sh"))
        .args(["path", "setproctitle"])
        .output()
        .expect("run tests/tools.sh");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// The next line a model prints on its standard output.
fn first_line(child: &mut Child) -> String {
    read_line(child.stdout.as_mut().expect("piped stdout"))
}

/// The PID of the child the model says it started, from its next line (`CHILD PID`).
fn child_pid(model: &mut Child) -> u32 {
    let line = first_line(model);
    line.strip_prefix("CHILD ")
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a CHILD line: {line}"))
}

/// The next line from `output`, read byte by byte so that nothing after it is taken from
/// the pipe.
fn read_line(output: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8];
    while output.read(&mut byte).expect("read the model's output") == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// Check that the model at `pid` said `line` `READY <pid>`, then wait until it is in
/// `state` (saying `what` if it never gets there).
fn ready(line: &str, pid: u32, state: char, what: &str) {
    assert_eq!(
        line.trim(),
        format!("READY {pid}"),
        "the model did not start"
    );
    wait_until(what, Duration::from_secs(10), || {
        proc_state(pid) == Some(state)
    });
}

/// The `children` a forking model `owner` announces (`CHILD <pid>` lines) before it
/// exits: the owner is reaped, and each child is returned once it runs as `child_name`
/// in one of `states`. Their parent is now this test process (a child subreaper).
fn orphaned_children(
    owner: &mut Child,
    children: usize,
    child_name: &str,
    states: &[char],
) -> Vec<Holder> {
    let pids: Vec<u32> = (0..children).map(|_| child_pid(owner)).collect();
    owner.wait().expect("reap the owner");
    named_children(pids, child_name, states)
}

/// The children `pids`, each once it runs as `child_name` in one of `states`.
fn named_children(pids: Vec<u32>, child_name: &str, states: &[char]) -> Vec<Holder> {
    pids.into_iter()
        .map(|pid| {
            wait_until(
                "the child is named and asleep",
                Duration::from_secs(10),
                || {
                    proc_comm(pid).as_deref() == Some(child_name)
                        && proc_state(pid).is_some_and(|state| states.contains(&state))
                },
            );
            Holder { pid, child: None }
        })
        .collect()
}

/// A model server and its spawned workers; each is killed and reaped when dropped.
pub struct Server {
    pub server: Holder,
    pub workers: Vec<Holder>,
}

/// A model MPS control daemon and its server, both killed and reaped when dropped.
pub struct Mps {
    /// The control daemon.
    pub daemon: Holder,
    /// The server's PID: the daemon's child.
    pub server: u32,
}

impl Drop for Mps {
    fn drop(&mut self) {
        // The server first, while its start time is still the one the daemon gave it; once
        // the daemon is killed and reaped, its dead server is this process's to reap.
        // SAFETY: kill(2) and waitpid(2) have no memory-safety preconditions; the status
        // pointer may be null.
        unsafe {
            libc::kill(self.server as libc::pid_t, libc::SIGKILL);
            libc::kill(self.daemon.pid as libc::pid_t, libc::SIGKILL);
        }
        if let Some(mut daemon) = self.daemon.child.take() {
            let _ = daemon.wait();
        }
        // SAFETY: as above; the dead server is this process's now (a child subreaper).
        unsafe { libc::waitpid(self.server as libc::pid_t, std::ptr::null_mut(), 0) };
    }
}

/// A live model CUDA owner that becomes a fork-inherited orphan when told to.
pub struct ForkingOwner {
    /// The owner, alive.
    pub owner: Holder,
    children: usize,
    child_name: String,
}

impl ForkingOwner {
    /// Fork the children (they inherit the descriptors and mappings) and exit; returns
    /// the dead (and reaped) owner's PID and the live children.
    pub fn orphan_now(mut self) -> (u32, Vec<Holder>) {
        become_subreaper();
        let pid = self.owner.pid;
        signal(pid, libc::SIGUSR1);
        let mut owner = self.owner.child.take().expect("our own child");
        let children = orphaned_children(&mut owner, self.children, &self.child_name, &['S']);
        (pid, children)
    }
}

/// The UVM node beside a GPU node (`nvidia-uvm` in the same folder).
pub(super) fn uvm_node(device: &Path) -> PathBuf {
    device.with_file_name("nvidia-uvm")
}

/// The control node beside a GPU node (`nvidiactl` in the same folder).
pub(super) fn control_node(device: &Path) -> PathBuf {
    device.with_file_name("nvidiactl")
}
