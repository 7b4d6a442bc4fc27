//! Slurm: a real one-node cluster (Debian's munge, slurmctld and slurmd, started by the
//! test as its own processes with a configuration it writes), the rig its tests share.
//! `jobs.rs` names a job's processes; `hooks.rs` runs vram-exporter's Epilog, Prolog and
//! HealthCheckProgram (deploy/slurm) on a node whose GPUs are gres.
//!
//! Slurm's cgroup plugins must be able to make the job's cgroups: on a cgroup v1 or
//! hybrid host (this project's test machines) cgroup/v1 in the writable v1 hierarchies;
//! on a cgroup v2 host cgroup/v2 without systemd (`IgnoreSystemd=yes`). Where neither can
//! work the test fails, saying why and what fixes it. Needs root (Slurm's daemons and a
//! job run as another user).

mod hooks;
mod jobs;

use crate::helpers::free_port;
use crate::helpers::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The Debian packages the cluster needs.
const PACKAGES: &str = "slurmd slurmctld slurm-client munge";
/// `nobody`: the job's user.
const NOBODY: u32 = 65534;
/// How long Slurm may take to start, schedule or end something.
const SLURM_TIMEOUT: Duration = Duration::from_secs(60);

/// A Slurm program, from `PATH` or the sbin folders Debian puts daemons in.
fn slurm_tool(program: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|folder| Path::new(folder).join(program))
        .find(|candidate| candidate.is_file());
    found.unwrap_or_else(|| {
        panic!("{program} is not installed; install it with: apt-get install -y {PACKAGES}")
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The mount point and type of the cgroup filesystem at `/sys/fs/cgroup` or under it.
fn cgroup_mounts() -> Vec<(String, String, String)> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("/proc/self/mountinfo");
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut right = right.split(' ');
            let (kind, _source, options) = (right.next()?, right.next()?, right.next()?);
            let point = left.split(' ').nth(4)?;
            kind.starts_with("cgroup")
                .then(|| (point.to_string(), kind.to_string(), options.to_string()))
        })
        .collect()
}

/// Whether a directory can be made (and is then removed) in `folder`.
fn writable(folder: &Path) -> Result<(), String> {
    let probe = folder.join(format!("vram-exporter-probe-{}", std::process::id()));
    fs::create_dir(&probe)
        .map(|_| {
            let _ = fs::remove_dir(&probe);
        })
        .map_err(|error| format!("mkdir {}: {error}", probe.display()))
}

/// The cgroup plugin Slurm can run here, with its `cgroup.conf` lines, or why none can
/// and what fixes it.
fn cgroup_plugin() -> Result<(&'static str, &'static str), String> {
    const FIX: &str = "run the tests as root where the cgroup tree is writable: on the host, or in a container started with --privileged (or --cgroupns=host with -v /sys/fs/cgroup:/sys/fs/cgroup:rw)";
    let mounts = cgroup_mounts();
    let v2_root = mounts
        .iter()
        .any(|(point, kind, _)| point == "/sys/fs/cgroup" && kind == "cgroup2");
    if v2_root {
        writable(Path::new("/sys/fs/cgroup")).map_err(|error| {
            format!("Slurm's cgroup/v2 plugin cannot make a job's cgroup: the cgroup v2 tree is not writable ({error}); {FIX}")
        })?;
        // slurmd started by hand, without systemd to make its scope: Slurm's own
        // settings for that, its developer options.
        return Ok((
            "cgroup/v2",
            "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nEnableControllers=yes\n",
        ));
    }
    let v1 = |controller: &str| {
        mounts.iter().find_map(|(point, kind, options)| {
            (kind == "cgroup" && options.split(',').any(|option| option == controller))
                .then(|| PathBuf::from(point))
        })
    };
    match (v1("cpuset"), v1("devices")) {
        (Some(cpuset), Some(devices)) => {
            for hierarchy in [&cpuset, &devices] {
                writable(hierarchy).map_err(|error| {
                    format!("Slurm's cgroup/v1 plugin cannot make a job's cgroup: the {} hierarchy is not writable ({error}); {FIX}", hierarchy.display())
                })?;
            }
            Ok(("cgroup/v1", "CgroupPlugin=cgroup/v1\n"))
        }
        _ => Err(format!(
            "no cgroup hierarchy Slurm can use: /sys/fs/cgroup is neither cgroup v2 nor has the v1 cpuset and devices controllers mounted (mounts: {mounts:?}); {FIX}"
        )),
    }
}

/// A one-node Slurm cluster in a folder of its own: munged, slurmctld and slurmd, stopped
/// when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    node: String,
    daemons: Vec<Child>,
    /// The hooks' settings every rewrite keeps: where the exporter, its fake NVML and
    /// the log are.
    settings: String,
}

/// What a cluster's node has besides CPUs: GPUs as gres, and vram-exporter's hooks
/// (deploy/slurm) in slurm.conf, each run through a wrapper that names the settings.
#[derive(Default)]
struct Setup<'a> {
    /// The rig whose fake NVML and stand-ins the hooks look at; with one, the node has
    /// four GPUs as gres (`/dev/nvidia0` to `3`, as character devices of the cluster's
    /// own, so that gres/gpu takes them).
    rig: Option<&'a Rig>,
    epilog: bool,
    prolog: bool,
    /// HealthCheckInterval, in seconds.
    health_check: Option<u32>,
    /// Lines added to the hooks' settings.
    settings: &'a [&'a str],
}

/// Tells apart the clusters that tests of one run start side by side.
static CLUSTERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(Setup::default())
    }

    fn start_with(setup: Setup) -> Cluster {
        assert_eq!(
            effective_uid(),
            0,
            "a Slurm cluster (its daemons, a job run as another user) needs the tests to run as root"
        );
        let (plugin, cgroup_conf) = cgroup_plugin().unwrap_or_else(|why| panic!("{why}"));
        let dir = tempfile::tempdir().expect("temporary folder");
        let root = dir.path().to_path_buf();
        let root = root.as_path();
        // munged wants every user to reach its socket's folder, and a key only it reads.
        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        for folder in ["spool", "state", "out"] {
            fs::create_dir(root.join(folder)).unwrap();
        }
        // The job, as nobody, writes its output here.
        fs::set_permissions(root.join("out"), fs::Permissions::from_mode(0o777)).unwrap();
        let key = root.join("munge.key");
        fs::write(&key, (0..128).map(|byte| byte as u8).collect::<Vec<u8>>()).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        // The node's name is in every cgroup path of its jobs (`/slurm_<node>/...` with
        // Debian's multiple-slurmd build): one of its own keeps concurrent runs apart.
        let node = format!(
            "vx{}n{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let socket = root.join("munge.sock");
        let mut cluster = Cluster {
            dir,
            node,
            daemons: Vec::new(),
            settings: String::new(),
        };
        let (gres, hooks) = cluster.gpus_and_hooks(&setup);
        cluster.daemon(
            Command::new(slurm_tool("munged"))
                .arg("--foreground")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--pid-file={}", root.join("munged.pid").display()))
                .arg(format!(
                    "--seed-file={}",
                    root.join("munged.seed").display()
                ))
                .arg(format!("--log-file={}", root.join("munged.log").display())),
            "munged.out",
        );
        wait_until("munged makes its socket", SLURM_TIMEOUT, || socket.exists());
        let conf = cluster.conf();
        fs::write(
            &conf,
            format!(
                "ClusterName=vramtest\n\
                 SlurmctldHost=localhost\n\
                 SlurmctldPort={ctld_port}\n\
                 SlurmdPort={slurmd_port}\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={socket}\n\
                 CredType=cred/munge\n\
                 StateSaveLocation={root}/state\n\
                 SlurmdSpoolDir={root}/spool\n\
                 SlurmctldPidFile={root}/slurmctld.pid\n\
                 SlurmdPidFile={root}/slurmd.pid\n\
                 SlurmctldLogFile={root}/slurmctld.log\n\
                 SlurmdLogFile={root}/slurmd.log\n\
                 # linuxproc tracks a step's processes by parentage, as many sites do: a\n\
                 # fork orphan leaves it, and outlives its job. task/cgroup puts every\n\
                 # task in the job's cgroups.\n\
                 ProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/cgroup\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 MpiDefault=none\n\
                 SchedulerType=sched/builtin\n\
                 SelectType=select/cons_tres\n\
                 ReturnToService=2\n\
                 {hooks}\
                 NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 RealMemory=500{gres} State=UNKNOWN\n\
                 PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
                ctld_port = free_port(),
                slurmd_port = free_port(),
                socket = socket.display(),
                root = root.display(),
                node = cluster.node,
            ),
        )
        .unwrap();
        fs::write(
            root.join("cgroup.conf"),
            format!(
                "{cgroup_conf}ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=no\n"
            ),
        )
        .unwrap();
        cluster.daemon(
            Command::new(slurm_tool("slurmctld"))
                .arg("-D")
                .arg("-f")
                .arg(&conf),
            "slurmctld.out",
        );
        cluster.daemon(
            Command::new(slurm_tool("slurmd"))
                .args(["-D", "-N", &cluster.node, "-f"])
                .arg(&conf),
            "slurmd.out",
        );
        let started = std::time::Instant::now();
        loop {
            let state = cluster.slurm("sinfo", &["-h", "-N", "-n", &cluster.node, "-o", "%t"]);
            if text(&state.stdout).trim() == "idle" {
                break;
            }
            if started.elapsed() > SLURM_TIMEOUT {
                panic!(
                    "the Slurm node never became idle ({plugin}): sinfo said {:?}\n{}",
                    text(&state.stdout),
                    cluster.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// The node's GPUs (gres.conf and the character devices it names) and hooks (their
    /// wrappers and settings) for `setup`: the node's `Gres=` and slurm.conf's lines.
    fn gpus_and_hooks(&mut self, setup: &Setup) -> (String, String) {
        let root = self.dir.path().to_path_buf();
        let mut lines = String::new();
        let Some(rig) = setup.rig else {
            return (String::new(), lines);
        };
        // gres/gpu takes only character or block devices; major 195 is NVIDIA's, which
        // no driver claims on a machine without a GPU. The model processes use the rig's
        // stand-ins, which the fake NVML names.
        fs::create_dir(root.join("gres")).unwrap();
        for minor in 0..4 {
            let device = root.join("gres").join(format!("nvidia{minor}"));
            let path = std::ffi::CString::new(device.to_str().unwrap()).unwrap();
            // SAFETY: mknod(2) with a valid path.
            let made = unsafe {
                libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | 0o600,
                    libc::makedev(195, minor),
                )
            };
            assert_eq!(
                made,
                0,
                "mknod {}: {}",
                device.display(),
                std::io::Error::last_os_error()
            );
        }
        fs::write(
            root.join("gres.conf"),
            format!(
                "NodeName={} Name=gpu File={}/gres/nvidia[0-3]\n",
                self.node,
                root.display()
            ),
        )
        .unwrap();
        lines.push_str("GresTypes=gpu\n");
        // The hooks run as root with Slurm's scant environment; their temporary files
        // go where the tests can see them.
        fs::create_dir(root.join("tmp")).unwrap();
        self.settings = format!(
            "VRAM_EXPORTER={exporter}\n\
             VRAM_EXPORTER_CHECK_ARGS=\"--nvml.library {library} --test.device-prefix {prefix}\"\n\
             VRAM_EXPORTER_LOG={root}/hooks.log\n\
             export FAKE_NVML_SCENARIO={scenario}\n\
             export SLURM_CONF={root}/slurm.conf\n\
             export TMPDIR={root}/tmp\n",
            exporter = exporter_binary().display(),
            library = rig.library.display(),
            prefix = rig.device_prefix().display(),
            root = root.display(),
            scenario = rig.scenario.display(),
        );
        self.settings_with(setup.settings);
        let hooks = [
            ("Epilog", "epilog", setup.epilog),
            ("Prolog", "prolog", setup.prolog),
            (
                "HealthCheckProgram",
                "healthcheck",
                setup.health_check.is_some(),
            ),
        ];
        for (parameter, hook, wanted) in hooks {
            if !wanted {
                continue;
            }
            let wrapper = root.join(hook);
            fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nVRAM_EXPORTER_SLURM_SETTINGS={}/hooks.settings exec {}\n",
                    root.display(),
                    repository().join("deploy/slurm").join(hook).display()
                ),
            )
            .unwrap();
            fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
            lines.push_str(&format!("{parameter}={}\n", wrapper.display()));
        }
        if let Some(seconds) = setup.health_check {
            lines.push_str(&format!("HealthCheckInterval={seconds}\n"));
        }
        (" Gres=gpu:4".into(), lines)
    }

    /// The hooks' settings from now on: the cluster's own, then `lines`.
    fn settings_with(&self, lines: &[&str]) {
        let mut settings = self.settings.clone();
        for line in lines {
            settings.push_str(line);
            settings.push('\n');
        }
        let path = self.dir.path().join("hooks.settings");
        let partial = path.with_extension("partial");
        fs::write(&partial, settings).unwrap();
        fs::rename(&partial, &path).unwrap();
    }

    /// What the hooks have logged so far.
    fn hooks_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("hooks.log")).unwrap_or_default()
    }

    /// The node's state as sinfo abbreviates it (`idle`, `drain`, `comp`...) and its
    /// reason, whole.
    fn node_state(&self) -> (String, String) {
        let said = self.slurm("sinfo", &["-h", "-N", "-n", &self.node, "-o", "%t|%E"]);
        let said = text(&said.stdout);
        let (state, reason) = said.trim().split_once('|').unwrap_or((said.trim(), ""));
        (state.to_string(), reason.to_string())
    }

    /// Wait until the node's state is `state`, or fail with the logs.
    fn wait_for_node(&self, state: &str, why: &str) {
        let started = std::time::Instant::now();
        while self.node_state().0 != state {
            if started.elapsed() > SLURM_TIMEOUT {
                panic!(
                    "the node never became {state} ({why}): it is {:?}\n{}",
                    self.node_state(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A field of `scontrol show job`, e.g. `JobState`.
    fn job_field(&self, job: u64, field: &str) -> String {
        let said = self.slurm("scontrol", &["-o", "show", "job", &job.to_string()]);
        let said = text(&said.stdout);
        let key = format!("{field}=");
        said.split_whitespace()
            .find_map(|pair| pair.strip_prefix(key.as_str()))
            .unwrap_or_default()
            .to_string()
    }

    /// Start a daemon of the cluster, its output in `log`.
    fn daemon(&mut self, command: &mut Command, log: &str) {
        let output = fs::File::create(self.dir.path().join(log)).unwrap();
        let child = command
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .unwrap_or_else(|error| panic!("start {command:?}: {error}"));
        self.daemons.push(child);
    }

    /// A Slurm command against this cluster.
    fn slurm(&self, program: &str, args: &[&str]) -> Output {
        Command::new(slurm_tool(program))
            .env("SLURM_CONF", self.conf())
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("run {program}: {error}"))
    }

    /// The end of each daemon's log, to say why something did not happen.
    fn logs(&self) -> String {
        let mut said = String::new();
        for log in [
            "munged.out",
            "slurmctld.out",
            "slurmctld.log",
            "slurmd.out",
            "slurmd.log",
            "hooks.log",
        ] {
            let content = fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            said.push_str(&format!("--- {log}\n{tail}\n"));
        }
        // What the job wrote.
        for entry in fs::read_dir(self.dir.path().join("out"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let content = fs::read_to_string(entry.path()).unwrap_or_default();
            said.push_str(&format!("--- {}\n{content}\n", entry.path().display()));
        }
        said
    }

    /// Submit `script` as `nobody`; returns the job id.
    fn submit(&self, script: &Path) -> u64 {
        self.submit_with(script, &[])
    }

    /// Submit `script` as `nobody` with sbatch's `options` too (`--gres=gpu:1`).
    fn submit_with(&self, script: &Path, options: &[&str]) -> u64 {
        let out = self.dir.path().join("out");
        let mut args = vec![
            "--parsable".to_string(),
            format!("--uid={NOBODY}"),
            format!("--gid={NOBODY}"),
            format!("--chdir={}", out.display()),
            format!("--output={}", out.join("job-%j.out").display()),
        ];
        args.extend(options.iter().map(|option| option.to_string()));
        args.push(script.display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = self.slurm("sbatch", &args);
        let said = text(&output.stdout);
        said.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "sbatch failed: {said}{}\n{}",
                    text(&output.stderr),
                    self.logs()
                )
            })
    }

    /// The PIDs of the slurmstepds of `job`.
    fn slurmstepds_of(job: u64) -> Vec<u32> {
        let title = format!("[{job}.");
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                proc_comm(*pid).as_deref() == Some("slurmstepd")
                    && fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmdline| text(&cmdline).contains(&title))
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The jobs first, then the daemons, newest first.
        let _ = self.slurm("scancel", &["--full", "--partition=test"]);
        for daemon in self.daemons.iter_mut().rev() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
            let _ = daemon.wait();
        }
        // What Slurm's v1 plugin leaves of the node's cgroups once their processes are
        // gone: the empty folders, deepest first.
        for (point, kind, _) in cgroup_mounts() {
            let top = if kind == "cgroup2" {
                PathBuf::from(&point)
                    .join("system.slice")
                    .join(format!("{}_slurmstepd.scope", self.node))
            } else {
                PathBuf::from(&point).join(format!("slurm_{}", self.node))
            };
            remove_empty_tree(&top);
        }
    }
}

fn remove_empty_tree(folder: &Path) {
    if let Ok(entries) = fs::read_dir(folder) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove_empty_tree(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(folder);
}

/// A process the job left behind, killed (and reaped, if this test adopted it) when dropped.
struct LeftBehind(u32);

impl Drop for LeftBehind {
    fn drop(&mut self) {
        // SAFETY: kill(2) and waitpid(2) on a PID the test found; waitpid answers ECHILD
        // at once for a process that is not ours.
        unsafe {
            libc::kill(self.0 as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.0 as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// The one line of `file` that starts with `prefix`, once it is there: the number after it.
fn number_in(file: &Path, prefix: &str, cluster: &Cluster) -> u32 {
    let mut found = None;
    let started = std::time::Instant::now();
    while found.is_none() {
        found = fs::read_to_string(file).ok().and_then(|content| {
            content
                .lines()
                .find_map(|line| line.strip_prefix(prefix)?.trim().parse().ok())
        });
        if found.is_none() && started.elapsed() > SLURM_TIMEOUT {
            panic!(
                "the job never wrote {prefix:?} to {}:\n{}",
                file.display(),
                cluster.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    found.unwrap()
}
