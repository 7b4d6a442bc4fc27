//! Slurm: a real one-node cluster (Debian's munge, slurmctld and slurmd, started by the
//! test as its own processes with a configuration it writes) runs a batch job as `nobody`
//! whose model process opens and maps the device-file stand-ins, forks a `dataloader` and
//! exits, leaving the fork orphan; the script then runs a live owner as step 0. The
//! exporter names the job, step and user of both from their real cgroups, suggests
//! `scancel` while the job runs, and after `scancel` (proctrack/linuxproc loses the
//! orphan, as it does on real clusters) says the job has ended and suggests the kill.
//!
//! Slurm's cgroup plugins must be able to make the job's cgroups: on a cgroup v1 or
//! hybrid host (this project's test machines) cgroup/v1 in the writable v1 hierarchies;
//! on a cgroup v2 host cgroup/v2 without systemd (`IgnoreSystemd=yes`). Where neither can
//! work the test fails, saying why and what fixes it. Needs root (Slurm's daemons and a
//! job run as another user).

use crate::helpers::free_port;
use crate::helpers::*;
use serde_json::Value;
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
}

impl Cluster {
    fn start() -> Cluster {
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
        let node = format!("vx{}", std::process::id());
        let socket = root.join("munge.sock");
        let mut cluster = Cluster {
            dir,
            node,
            daemons: Vec::new(),
        };
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
                 NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 RealMemory=500 State=UNKNOWN\n\
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
        let out = self.dir.path().join("out");
        let output = self.slurm(
            "sbatch",
            &[
                "--parsable",
                &format!("--uid={NOBODY}"),
                &format!("--gid={NOBODY}"),
                &format!("--chdir={}", out.display()),
                &format!("--output={}", out.join("job.out").display()),
                &script.display().to_string(),
            ],
        );
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

fn culprit(document: &Value, gpu: usize, pid: u32) -> &Value {
    document["gpus"][gpu]["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|holder| holder["pid"] == pid)
        .unwrap_or_else(|| panic!("PID {pid} is not a culprit: {document:#}"))
}

#[test]
fn a_slurm_jobs_fork_orphan_and_live_owner_are_named_with_the_job() {
    let cluster = Cluster::start();
    let rig = Rig::new();
    // The job runs as nobody: it must reach the stand-ins and the model program.
    for folder in [rig.dir.path(), rig.devices.as_path()] {
        fs::set_permissions(folder, fs::Permissions::from_mode(0o755)).unwrap();
    }
    for entry in fs::read_dir(&rig.devices).unwrap().flatten() {
        fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o666)).unwrap();
    }
    let model = rig.dir.path().join("model.py");
    fs::write(&model, model_program()).unwrap();
    fs::set_permissions(&model, fs::Permissions::from_mode(0o644)).unwrap();
    let out = cluster.dir.path().join("out");
    let orphaning = Model::cuda("cuda-job", &rig.device(0))
        .spec_json()
        .replace("\"hold\"", "\"fork\"");
    let orphaning = orphaning.replace(
        "\"child_name\":\"cuda-job\"",
        "\"child_name\":\"dataloader\"",
    );
    // srun makes each task lead its own session already.
    let owning = Model::cuda("trainer", &rig.device(1))
        .in_launchers_session()
        .spec_json();
    let python = "/usr/bin/python3";
    let script = cluster.dir.path().join("job.sh");
    // The batch step's model forks the orphan and exits; step 0 is a live owner that
    // keeps the job running.
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             {python} {model} '{orphaning}' > {out}/children &\n\
             echo \"OWNER $!\" > {out}/owner\n\
             wait\n\
             exec srun --output={out}/step0 {python} {model} '{owning}'\n",
            model = model.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();

    let job = cluster.submit(&script);
    let dead_owner = number_in(&out.join("owner"), "OWNER ", &cluster);
    let orphan = LeftBehind(number_in(&out.join("children"), "CHILD ", &cluster));
    let live_owner = number_in(&out.join("step0"), "READY ", &cluster);
    wait_until(
        "the orphan and the live owner hold their files",
        SLURM_TIMEOUT,
        || {
            proc_comm(orphan.0).as_deref() == Some("dataloader")
                && holds(orphan.0, &rig.device(0))
                && holds(live_owner, &rig.device(1))
                && Cluster::slurmstepds_of(job).len() >= 2
        },
    );
    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", orphan.0)).unwrap();
    assert!(
        cgroup.contains(&format!("/job_{job}/step_batch")),
        "the orphan is not in the batch step's cgroup:\n{cgroup}"
    );
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).process(dead_owner, Some(CHARGED)))
            .gpu(Gpu::idle(1).used(USED).process(live_owner, Some(CHARGED)))
            .into_json(),
    );
    let job_text = job.to_string();

    // While the job runs: its batch step holds GPU 0, so cancelling the job frees it.
    let text = rig.run(&["check", "--gpu", "0"]);
    assert_eq!(text.status, Some(1), "{text:?}");
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!("PID {} (dataloader, sleeping, started ", orphan.0))
            && sentence.contains(", user nobody, parent ")
            && sentence.contains(&format!(
                ", Slurm job {job} step batch of user nobody, running, holds a context on GPU 0"
            ))
            && sentence.ends_with(&format!(" - cancelling Slurm job {job} should free it.")),
        "{}",
        text.stdout
    );
    let suggestion = text
        .stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("suggested: "))
        .expect("a suggestion");
    assert!(
        suggestion.starts_with(&format!(
            "scancel {job}   # job {job} of user nobody still runs the step that holds it: {} is dataloader, started ",
            orphan.0
        )),
        "{suggestion}"
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&orphan.0.to_string().as_str()))
        .expect("the culprit's row");
    assert_eq!(columns(row).last(), Some(&format!("{job}.batch").as_str()));
    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(
        culprit(&document, 0, orphan.0)["slurm_job"],
        serde_json::json!({"job_id": job, "step": "batch", "user": "nobody", "state": "running"})
    );
    assert_eq!(document["gpus"][0]["remedy"]["action"], "cancel_jobs");
    let owner = &document["gpus"][1]["owners"][0];
    assert_eq!(owner["pid"], live_owner);
    assert_eq!(owner["process"]["slurm_job"]["step"], "0", "{owner:#}");

    let exporter = rig.start(&["--collector.processes"]);
    let metrics = exporter.scrape();
    let pid = orphan.0.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("slurm_job_id", &job_text),
                ("slurm_step", "batch"),
                ("slurm_user", "nobody"),
            ]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[
                ("gpu", "1"),
                ("pid", &live_owner.to_string()),
                ("slurm_job_id", &job_text),
                ("slurm_step", "0"),
                ("slurm_user", "nobody"),
            ]
        ),
        CHARGED as f64
    );
    assert_per_gpu_series_carry_no_workload_labels(&metrics);
    assert_promtool_clean(&metrics.text);
    drop(exporter);

    // scancel ends the job; linuxproc does not know the orphan, which survives it.
    let cancelled = cluster.slurm("scancel", &[&job_text]);
    assert!(
        cancelled.status.success(),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    wait_until("the job's slurmstepds are gone", SLURM_TIMEOUT, || {
        Cluster::slurmstepds_of(job).is_empty()
    });
    assert_eq!(proc_comm(orphan.0).as_deref(), Some("dataloader"));
    let text = rig.run(&["check", "--gpu", "0"]);
    assert_eq!(text.status, Some(1), "{text:?}");
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!(
            ", Slurm job {job} step batch of user nobody, a job that has ended, holds"
        )) && sentence.ends_with(&format!(" - killing {} should free it.", orphan.0)),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!(
            "note: PID {} is of Slurm job {job} (step batch), which has ended: the process survived its job",
            orphan.0
        )),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!(
            "suggested: kill {}   # {} is dataloader",
            orphan.0, orphan.0
        )),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&orphan.0.to_string().as_str()))
        .expect("the culprit's row");
    assert_eq!(
        columns(row).last(),
        Some(&format!("{job}.batch (ended)").as_str())
    );
    drop(orphan);
    drop(cluster);
}
