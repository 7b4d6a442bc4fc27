//! The rig: a test's world in a temporary folder (the fake NVML, its scenario, the files
//! standing in for `/dev/nvidia*`) and the exporter commands that run in it.

use crate::exporter::{start, Exporter, Outcome, Running};
use crate::model::{control_node, uvm_node};
use crate::processes::{effective_uid, holds};
use crate::scenario::{Gpu, Gpus};
use crate::{exporter_binary, fake_nvml_library, require_tool, wait_until, USED};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A test's world: a temporary folder with the fake NVML linked as `libnvidia-ml.so.1`,
/// a scenario file, and files standing in for `/dev/nvidia*`.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub scenario: PathBuf,
    pub library: PathBuf,
    pub devices: PathBuf,
}

impl Default for Rig {
    fn default() -> Rig {
        Rig::new()
    }
}

impl Rig {
    /// A rig with four GPU nodes, the control node and the UVM node.
    pub fn new() -> Rig {
        let dir = tempfile::tempdir().expect("temporary folder");
        let library = dir.path().join("libnvidia-ml.so.1");
        std::os::unix::fs::symlink(fake_nvml_library(), &library).expect("link fake NVML");
        let devices = dir.path().join("dev");
        fs::create_dir(&devices).unwrap();
        for node in [
            "nvidia0",
            "nvidia1",
            "nvidia2",
            "nvidia3",
            "nvidiactl",
            "nvidia-uvm",
        ] {
            // A page, so that model CUDA processes can map it as they map the real node.
            fs::write(devices.join(node), [0u8; 4096]).unwrap();
        }
        let rig = Rig {
            scenario: dir.path().join("scenario.json"),
            dir,
            library,
            devices,
        };
        rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
        rig
    }

    /// Replace the scenario atomically, so the fake never reads half a file.
    pub fn write_scenario(&self, scenario: &Value) {
        let temporary = self.scenario.with_extension("tmp");
        fs::write(&temporary, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
        fs::rename(&temporary, &self.scenario).unwrap();
    }

    /// One GPU with the H200's figures for one 8 GiB owner: `USED` in use, `bytes`
    /// charged to `pid` (`None`: unavailable).
    pub fn charge_gpu0(&self, pid: u32, bytes: Option<u64>) {
        self.write_scenario(
            &Gpus::new()
                .gpu(Gpu::idle(0).used(USED).process(pid, bytes))
                .into_json(),
        );
    }

    /// Stand-ins for `/dev/nvidia0` to `/dev/nvidia<count - 1>`, for a host of more GPUs
    /// than the rig's four.
    pub fn with_gpu_nodes(self, count: u32) -> Rig {
        for minor in 0..count {
            let node = self.device(minor);
            if !node.exists() {
                // A page, as the rig's own nodes, so that model CUDA processes can map it.
                fs::write(node, [0u8; 4096]).unwrap();
            }
        }
        self
    }

    /// The stand-in for `/dev/nvidia<minor>`.
    pub fn device(&self, minor: u32) -> PathBuf {
        self.devices.join(format!("nvidia{minor}"))
    }

    /// The stand-in for `/dev/nvidiactl`.
    pub fn control_device(&self) -> PathBuf {
        self.devices.join("nvidiactl")
    }

    /// The device prefix the exporter must use to recognise these files.
    pub fn device_prefix(&self) -> PathBuf {
        self.devices.join("nvidia")
    }

    /// The stand-in for `/dev/nvidia-caps/nvidia-cap<minor>`, created on first use.
    pub fn capability(&self, minor: u32) -> PathBuf {
        let folder = self.devices.join("nvidia-caps");
        fs::create_dir_all(&folder).unwrap();
        let node = folder.join(format!("nvidia-cap{minor}"));
        if !node.exists() {
            fs::write(&node, b"").unwrap();
        }
        node
    }

    /// A `mig-minors` table for `--test.mig-minors`, one line per (GPU minor, GPU
    /// instance, compute instance, minor of the GPU instance's node, minor of the
    /// compute instance's node).
    pub fn mig_minors(&self, instances: &[(u32, u32, u32, u32, u32)]) -> PathBuf {
        let mut text = String::from("config 1\nmonitor 2\n");
        for &(gpu, gi, ci, gi_minor, ci_minor) in instances {
            text.push_str(&format!("gpu{gpu}/gi{gi}/access {gi_minor}\n"));
            text.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {ci_minor}\n"));
        }
        let path = self.dir.path().join("mig-minors");
        fs::write(&path, text).unwrap();
        path
    }

    /// A procfs for `--path.procfs` whose only entry, `self/ns/pid`, is not the host's
    /// `pid:[4026531836]`: an exporter reading it is blind.
    pub fn blind_procfs(&self) -> PathBuf {
        let procfs = self.dir.path().join("proc");
        fs::create_dir_all(procfs.join("self/ns")).unwrap();
        std::os::unix::fs::symlink("pid:[4026532999]", procfs.join("self/ns/pid")).unwrap();
        procfs
    }

    /// A procfs for `--path.procfs` with one process, `pid`, that holds `device` (and
    /// the control node beside it) open and whose `maps` blocks every reader until
    /// [`BlockingMaps::unblock`].
    ///
    /// A real blocked `/proc` read (a process in uninterruptible sleep holding its
    /// memory map lock, so that reading its maps blocks) cannot be made safely in a test.
    /// A FIFO is an honest stand-in: opening it for reading blocks until a writer
    /// appears, exactly where the exporter reads the maps of a process that holds a GPU's
    /// device file.
    pub fn procfs_whose_maps_block(&self, pid: u32, device: &Path) -> BlockingMaps {
        let procfs = self.procfs_with_owner(pid, device, ('D', 4_194_560), "", "");
        let process = procfs.join(pid.to_string());
        let maps = process.join("maps");
        fs::remove_file(&maps).unwrap();
        let path = std::ffi::CString::new(maps.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
        BlockingMaps { procfs, maps }
    }

    /// A procfs for `--path.procfs` with one owner, `pid` (`stuck-job`), holding `device`
    /// and the control node beside it open and mapped read-write (a context), whose stat
    /// line says `state` with the kernel's `flags`, whose status adds `status` and whose
    /// wait channel is `wchan`.
    ///
    /// What only a GPU makes cannot be made here: a process that stays in uninterruptible
    /// sleep inside the driver with a SIGKILL pending, or one caught in its exit path while
    /// the driver frees its context. The exporter reads such a process from these files,
    /// so a tree of them is an honest stand-in for the `/proc` it would read.
    pub fn procfs_with_owner(
        &self,
        pid: u32,
        device: &Path,
        (state, flags): (char, u32),
        status: &str,
        wchan: &str,
    ) -> PathBuf {
        let procfs = self.dir.path().join("proc");
        fs::create_dir_all(procfs.join("self/ns")).unwrap();
        std::os::unix::fs::symlink("pid:[4026531836]", procfs.join("self/ns/pid")).unwrap();
        let process = procfs.join(pid.to_string());
        fs::create_dir_all(process.join("fd")).unwrap();
        std::os::unix::fs::symlink(device, process.join("fd/5")).unwrap();
        std::os::unix::fs::symlink(control_node(device), process.join("fd/6")).unwrap();
        fs::write(
            process.join("stat"),
            format!(
                "{pid} (stuck-job) {state} 1 {pid} {pid} 0 -1 {flags} 1000 0 0 0 100 20 0 0 20 0 4 0 \
                 123456 8388608000 20000 18446744073709551615 1 1 0 0 0 0 0 4096 16386 0 0 0 \
                 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
            ),
        )
        .unwrap();
        fs::write(
            process.join("status"),
            format!("Name:\tstuck-job\nUid:\t0\t0\t0\t0\nThreads:\t4\n{status}"),
        )
        .unwrap();
        fs::write(process.join("wchan"), wchan).unwrap();
        fs::write(
            process.join("maps"),
            format!(
                "7f00a0000000-7f00a0001000 rw-s 00000000 00:05 1065 {}\n\
                 7f00b0000000-7f00b0001000 rw-s 00000000 00:05 2000 {}\n",
                control_node(device).display(),
                device.display()
            ),
        )
        .unwrap();
        procfs
    }

    // The exporter in this world: as a server, a one-shot command, or a process holding
    // GPU files; as root or as a user without privileges.

    /// The exporter binary with this rig's NVML, scenario and device prefix.
    pub fn command(&self) -> Command {
        let mut command = Command::new(exporter_binary());
        self.in_this_world(&mut command, &self.library);
        command
    }

    /// Start the exporter on a free loopback port and wait until it serves.
    pub fn start(&self, extra: &[&str]) -> Exporter {
        let mut command = self.command();
        command
            .args(["--web.listen-address", "127.0.0.1:0"])
            .args(extra);
        start(command)
    }

    /// Run a one-shot command (`check`, `snapshot`, `textfile`) to completion.
    pub fn run(&self, args: &[&str]) -> Outcome {
        Outcome::from(self.command().args(args).output().expect("run exporter"))
    }

    /// The exporter binary in this world, but with its witness state in `state` (an
    /// empty folder: none; another server's).
    pub fn command_with_state(&self, state: &Path) -> Command {
        let mut command = Command::new(exporter_binary());
        self.in_world_with_state(&mut command, &self.library, state);
        command
    }

    /// Run a one-shot command with its witness state in `state`.
    pub fn run_with_state(&self, state: &Path, args: &[&str]) -> Outcome {
        Outcome::from(
            self.command_with_state(state)
                .args(args)
                .output()
                .expect("run exporter"),
        )
    }

    /// Start the exporter with its witness state in `state`.
    pub fn start_with_state(&self, state: &Path, extra: &[&str]) -> Exporter {
        let mut command = self.command_with_state(state);
        command
            .args(["--web.listen-address", "127.0.0.1:0"])
            .args(extra);
        start(command)
    }

    /// The warning `check` gives on standard error when no exporter keeps a witness state
    /// in `state`.
    pub fn no_state_warning(state: &Path) -> String {
        format!(
            "vram-exporter: warning: no witness state at {}: no exporter serving on this host keeps one there (see --path.state), so only what this look sees is judged\n",
            state.join("witness.json").display()
        )
    }

    /// Start a one-shot command in the background, collecting its output as it comes.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running::spawn(self.command().args(args))
    }

    /// The exporter started through a shell that opens `device` and the UVM node beside
    /// it and then execs it: the exporter holds the files itself, as a CUDA process
    /// does. It runs under the name `gpu-watch`, because `vram-exporter` is a known NVML
    /// client that is never called a culprit, which would hide a scan that does not
    /// leave itself out. The process keeps the shell's PID.
    pub fn command_holding(&self, device: &Path) -> Command {
        let renamed = self.dir.path().join("gpu-watch");
        if !renamed.exists() {
            std::os::unix::fs::symlink(exporter_binary(), &renamed).expect("link the binary");
        }
        let mut command = Command::new("sh");
        command
            .env("DEVICE", device)
            .env("UVM", uvm_node(device))
            .arg("-c")
            .arg("exec 5<\"$DEVICE\" 6<\"$UVM\"; exec \"$0\" \"$@\"")
            .arg(renamed);
        self.in_this_world(&mut command, &self.library);
        command
    }

    /// The exporter as a user without the right to read other users' descriptors: run as
    /// `nobody` when the tests run as root, from copies every user may read.
    pub fn unprivileged_command(&self, args: &[&str]) -> Command {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let folder = self.dir.path().join("shared");
        fs::create_dir_all(&folder).unwrap();
        let binary = folder.join("vram-exporter");
        let library = folder.join("libnvidia-ml.so.1");
        copy_for_exec(&exporter_binary(), &binary);
        copy_for_exec(&fake_nvml_library(), &library);
        for (path, mode) in [
            (self.dir.path(), 0o755),
            (folder.as_path(), 0o755),
            (binary.as_path(), 0o755),
            (library.as_path(), 0o644),
            (self.scenario.as_path(), 0o644),
        ] {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        }
        let mut command = Command::new(&binary);
        self.in_this_world(&mut command, &library);
        command.args(args);
        if effective_uid() == 0 {
            command.uid(65534).gid(65534);
        }
        command
    }

    /// The exporter as `nobody` (through util-linux's `setpriv`) holding only
    /// `capabilities` (names as `setpriv` takes them: `sys_ptrace`, `dac_read_search`),
    /// in its effective, inheritable and ambient sets; the tests must run as root.
    pub fn command_as_nobody_with(&self, capabilities: &[&str], args: &[&str]) -> Command {
        assert_eq!(
            effective_uid(),
            0,
            "switching to nobody with chosen capabilities needs the tests to run as root"
        );
        let prepared = self.unprivileged_command(args);
        let setpriv = require_tool("setpriv", "util-linux");
        let mut wanted = String::from("-all");
        for capability in capabilities {
            wanted.push_str(",+");
            wanted.push_str(capability);
        }
        let mut command = Command::new(setpriv);
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps={wanted}"))
            .arg(format!("--ambient-caps={wanted}"))
            .arg(prepared.get_program())
            .args(prepared.get_args());
        for (key, value) in prepared.get_envs() {
            if let Some(value) = value {
                command.env(key, value);
            }
        }
        command
    }

    /// Point an exporter `command` at `library` (this rig's fake NVML or a copy of it),
    /// this rig's scenario and its device files.
    fn in_this_world(&self, command: &mut Command, library: &Path) {
        self.in_world_with_state(command, library, &self.state_directory());
    }

    /// [`Rig::in_this_world`], with the witness state in `state` instead.
    fn in_world_with_state(&self, command: &mut Command, library: &Path, state: &Path) {
        command
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .arg("--nvml.library")
            .arg(library)
            .arg("--test.device-prefix")
            .arg(self.device_prefix())
            .arg("--path.state")
            .arg(state);
    }

    /// The witness state's directory in this world: a server started here keeps it, and
    /// `check` run here reads it, as on a host they share `/run/vram-exporter`.
    pub fn state_directory(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

/// A synthetic procfs in which one process's maps block their readers.
pub struct BlockingMaps {
    /// For `--path.procfs`.
    pub procfs: PathBuf,
    maps: PathBuf,
}

impl BlockingMaps {
    /// End the blocked reads: the readers waiting get `contents`, and the maps become a
    /// plain file with them for every later read.
    pub fn unblock(&self, contents: &str) {
        // A reader waits in its open, so opening for writing succeeds at once (without
        // one it fails, rather than block the test).
        use std::os::unix::fs::OpenOptionsExt;
        let mut fifo = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.maps)
            .expect("a reader blocked on the maps");
        let plain = self.maps.with_extension("plain");
        fs::write(&plain, contents).unwrap();
        fs::rename(&plain, &self.maps).unwrap();
        std::io::Write::write_all(&mut fifo, contents.as_bytes()).unwrap();
    }
}

/// Copy `from` to `to` once, for executing or loading. The copy's write descriptor is
/// close-on-exec, but a process that another test thread forks while the copy is being
/// written holds it until that process calls exec; executing the copy meanwhile fails
/// with ETXTBSY ("Text file busy"). So wait until no process holds it open.
fn copy_for_exec(from: &Path, to: &Path) {
    if to.exists() {
        return;
    }
    let partial = to.with_extension("partial");
    fs::copy(from, &partial).unwrap();
    fs::rename(&partial, to).unwrap();
    wait_until(
        &format!("no process holds {} open", to.display()),
        Duration::from_secs(10),
        || {
            fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
                .all(|pid| !holds(pid, to) && !holds(pid, &partial))
        },
    );
}
