//! Containers: the container and pod a holder or owner runs in, read from its real
//! cgroup, and a holder that outlived its container, made from a real PID namespace
//! whose PID 1 is killed while the holder cannot die. The tests make cgroups named the
//! way container runtimes name them, so they run as root.

use crate::helpers::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const CONTAINER: &str = "3f2a9c0b1d2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90";
const SHORT: &str = "3f2a9c0b1d2e";
const POD: &str = "1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e";
/// `PF_EXITING`: the task has begun to exit.
const PF_EXITING: u32 = 0x4;

/// The mount point of a cgroup hierarchy whose fstype is `fstype` and, for v1, whose
/// super options include `option`.
fn cgroup_mount(fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        let (kind, _source, options) = (right.next()?, right.next()?, right.next()?);
        let wanted = kind == fstype
            && option.is_none_or(|option| options.split(',').any(|item| item == option));
        if !wanted {
            return None;
        }
        Some(PathBuf::from(left.split(' ').nth(4)?))
    })
}

/// A cgroup made for one test, named like a container runtime's, removed when dropped.
pub(crate) struct Cgroup {
    mount: PathBuf,
    top: PathBuf,
    leaf: PathBuf,
}

impl Cgroup {
    /// `relative` (such as `kubepods/burstable/pod<uid>/<id>`) under a directory of this
    /// test's own, in the cgroup v2 hierarchy, else a v1 one.
    pub(crate) fn create(relative: &str) -> Cgroup {
        let mount = cgroup_mount("cgroup2", None)
            .or_else(|| cgroup_mount("cgroup", Some("name=systemd")))
            .or_else(|| cgroup_mount("cgroup", Some("memory")))
            .expect("no cgroup hierarchy is mounted (see /proc/self/mountinfo)");
        Cgroup::create_in(mount, relative)
    }

    fn create_in(mount: PathBuf, relative: &str) -> Cgroup {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let top = mount.join(format!(
            "vram-exporter-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let leaf = top.join(relative);
        fs::create_dir_all(&leaf).unwrap_or_else(|error| {
            panic!(
                "cannot make the cgroup {} ({error}); these tests run as root",
                leaf.display()
            )
        });
        Cgroup { mount, top, leaf }
    }

    /// Move `pid` into this cgroup.
    pub(crate) fn add(&self, pid: u32) {
        write_cgroup_file(&self.leaf.join("cgroup.procs"), &pid.to_string());
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Processes still inside go back to the root; then the empty folders go.
        if let Ok(procs) = fs::read_to_string(self.leaf.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = fs::write(self.mount.join("cgroup.procs"), pid);
            }
        }
        let mut dir = self.leaf.clone();
        while dir.starts_with(&self.top) {
            let _ = fs::remove_dir(&dir);
            if !dir.pop() {
                break;
            }
        }
    }
}

fn write_cgroup_file(path: &Path, value: &str) {
    fs::write(path, value)
        .unwrap_or_else(|error| panic!("write {value} to {}: {error}", path.display()));
}

/// `check --json`, which scans for holders; `expected` is its exit status.
fn check_json(rig: &Rig, expected: i32) -> Value {
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(expected), "{outcome:?}");
    outcome.json()
}

fn holder_of(gpu: &Value, pid: u32) -> &Value {
    gpu["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|holder| holder["pid"] == pid)
        .unwrap_or_else(|| panic!("PID {pid} is not named as a holder: {gpu:#}"))
}

#[test]
fn holder_in_a_pod_container_is_named_with_its_container_and_pod() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let (other_dead_owner, host_child) = Holder::fork_orphan(&rig.device(1));
    // The cgroupfs driver's layout: /kubepods/<qos>/pod<uid>/<container id>.
    let cgroup = Cgroup::create(&format!("kubepods/burstable/pod{POD}/{CONTAINER}"));
    cgroup.add(child.pid);
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, other_dead_owner))
            .into_json(),
    );

    let document = check_json(&rig, 1);
    let holder = holder_of(&document["gpus"][0], child.pid);
    assert_eq!(holder["container_id"], CONTAINER, "{holder:#}");
    assert_eq!(holder["pod_uid"], POD);
    assert!(holder["cgroup"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/kubepods/burstable/pod{POD}/{CONTAINER}")));
    // A holder on the host, and a container that runs, add nothing.
    let on_host = holder_of(&document["gpus"][1], host_child.pid);
    for key in ["container_id", "pod_uid", "cgroup", "pid_namespace_init"] {
        assert!(on_host.get(key).is_none(), "{key}: {on_host:#}");
    }
    assert!(holder.get("pid_namespace_init").is_none(), "{holder:#}");
    assert!(document["gpus"][0]
        .get("exited_container_processes")
        .is_none());

    let text = rig.run(&["check", "--gpu", "0"]);
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!("PID {} (dataloader, sleeping, started ", child.pid))
            && sentence.contains(&format!(
                " UTC, user root, parent {}, container {SHORT}, pod {POD}, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group and session of exited PID {dead_owner})",
                std::process::id()
            )),
        "{}",
        text.stdout
    );
    let header = text
        .stdout
        .lines()
        .find(|line| line.trim_start().starts_with("PID") && line.contains("PARENT"))
        .expect("holders table");
    assert_eq!(
        columns(header),
        ["PID", "COMMAND", "STATE", "PARENT", "CONTAINER"]
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&child.pid.to_string().as_str()))
        .expect("holder row");
    assert_eq!(columns(row).last(), Some(&SHORT));

    let metrics = rig.start(&[]).scrape();
    let pid = child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("container_id", CONTAINER),
                ("pod_uid", POD)
            ]
        ),
        1.0
    );
    let host_pid = host_child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "1"),
                ("pid", &host_pid),
                ("container_id", ""),
                ("pod_uid", "")
            ]
        ),
        1.0
    );
    assert_eq!(
        metrics.value("vram_exited_container_processes", &[("gpu", "0")]),
        0.0
    );
    assert_promtool_clean(&metrics.text);
    drop(cgroup);
}

#[test]
fn live_owner_in_a_docker_container_is_labelled_on_its_per_process_series() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    // Docker's systemd driver: a scope named after the container.
    let cgroup = Cgroup::create(&format!("system.slice/docker-{CONTAINER}.scope"));
    cgroup.add(owner.pid);
    rig.charge_gpu0(owner.pid, Some(CHARGED));

    let metrics = rig.start(&["--collector.processes"]).scrape();
    let pid = owner.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("state", "running"),
                ("container_id", CONTAINER),
                ("pod_uid", "")
            ]
        ),
        CHARGED as f64
    );

    let document = check_json(&rig, 0);
    let listed = &document["gpus"][0]["owners"][0]["process"];
    assert_eq!(listed["container_id"], CONTAINER, "{listed:#}");
    assert!(listed.get("pod_uid").is_none());
    assert!(document["gpus"][0]["owners"][0]
        .get("container_exited")
        .is_none());
    let text = rig.run(&["check"]);
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&pid.as_str()))
        .expect("owner row");
    assert_eq!(columns(row).last(), Some(&SHORT), "{}", text.stdout);
    drop(cgroup);
}

/// What util-linux 2.38's `unshare --fork` (Debian 12's) says on standard error when the
/// child it forked, here PID 1 of the namespace, dies of SIGKILL, as `EndingNamespace::end`
/// makes it: to die of the same signal, unshare resets the signal's handler to the
/// default first, which the kernel refuses for SIGKILL (`rt_sigaction` fails with EINVAL),
/// and the message names the next step. unshare then exits 1 instead. Later util-linux
/// skips the reset for SIGKILL and says nothing.
const UNSHARE_ON_A_CHILD_KILLED_BY_SIGKILL: &str =
    "unshare: sigprocmask unblock failed: Invalid argument";

/// A PID namespace made by `unshare --pid --fork`, whose PID 1 (a model CUDA process
/// named `holder` with a context on GPUs 0 and 1) and its child both hold the context;
/// the child is frozen in a cgroup v1 freezer, which is
/// the one way a test can make a process that SIGKILL cannot end (as a process stuck in
/// the driver is). Dropping it thaws the holder, which then dies of the kill the kernel
/// sent it, and reaps everything.
struct EndingNamespace {
    unshare: Child,
    init: u32,
    holder: u32,
    freezer: Cgroup,
}

impl EndingNamespace {
    fn start(device: &Path) -> EndingNamespace {
        let freezer_mount = cgroup_mount("cgroup", Some("freezer")).expect(
            "this test needs the cgroup v1 freezer (mount -t cgroup -o freezer freezer DIR): a frozen process is the only one a test can make that SIGKILL does not end",
        );
        let model = Model::cuda("holder", device).also_mapping(&device.with_file_name("nvidia1"));
        let unshare = Command::new(require_tool("unshare", "util-linux"))
            .args(["--pid", "--fork", "python3", "-c", model_program()])
            .arg(model.spec_forking_and_staying(1))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare --pid --fork");
        let mut init = 0;
        let mut holder = 0;
        wait_until(
            "PID 1 of the new namespace and its child hold the device",
            Duration::from_secs(10),
            || {
                let Some(&first) = children_of(unshare.id()).first() else {
                    return false;
                };
                init = first;
                let Some(&child) = children_of(init).first() else {
                    return false;
                };
                holder = child;
                [init, holder].iter().all(|&pid| {
                    proc_comm(pid).as_deref() == Some("holder")
                        && holds(pid, device)
                        && proc_state(pid) == Some('S')
                })
            },
        );
        let freezer = Cgroup::create_in(freezer_mount, "holder");
        let ending = EndingNamespace {
            unshare,
            init,
            holder,
            freezer,
        };
        ending.freezer.add(holder);
        write_cgroup_file(&ending.freezer.leaf.join("freezer.state"), "FROZEN");
        wait_until("the holder is frozen", Duration::from_secs(10), || {
            fs::read_to_string(ending.freezer.leaf.join("freezer.state"))
                .is_ok_and(|state| state.trim() == "FROZEN")
        });
        ending
    }

    /// SIGKILL PID 1: the kernel kills the namespace's other processes, and PID 1 waits
    /// in its exit path for the frozen holder, its files already closed.
    fn end(&self, device: &Path) {
        signal(self.init, libc::SIGKILL);
        wait_until(
            "PID 1 is exiting and has closed its files",
            Duration::from_secs(10),
            || {
                task_flags(self.init).is_some_and(|flags| flags & PF_EXITING != 0)
                    && !holds(self.init, device)
            },
        );
    }
}

impl Drop for EndingNamespace {
    fn drop(&mut self) {
        let _ = unsafe { libc::kill(self.init as libc::pid_t, libc::SIGKILL) };
        let _ = fs::write(self.freezer.leaf.join("freezer.state"), "THAWED");
        let _ = self.unshare.wait();
        let holder = self.holder;
        wait_until("the thawed holder is gone", Duration::from_secs(10), || {
            proc_state(holder).is_none()
        });
        // Every process that could write to unshare's standard error is gone: read it all.
        let mut said = String::new();
        if let Some(mut stderr) = self.unshare.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
        }
        let unexpected: Vec<&str> = said
            .lines()
            .filter(|line| *line != UNSHARE_ON_A_CHILD_KILLED_BY_SIGKILL)
            .collect();
        if !std::thread::panicking() {
            assert!(
                unexpected.is_empty(),
                "unshare or the namespace's processes said:\n{said}"
            );
        }
    }
}

#[test]
fn holder_that_outlived_its_container_is_called_out() {
    let rig = Rig::new();
    let namespace = EndingNamespace::start(&rig.device(0));
    let cgroup = Cgroup::create(&format!("system.slice/docker-{CONTAINER}.scope"));
    cgroup.add(namespace.holder);
    // GPU 0's memory is charged to an owner that no longer exists; on GPU 1 the holder is
    // itself a listed owner.
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, nonexistent_pid()))
            .gpu(Gpu::one_owner(1, namespace.holder))
            .into_json(),
    );

    // While PID 1 lives, the container runs.
    let document = check_json(&rig, 1);
    let holder = holder_of(&document["gpus"][0], namespace.holder);
    assert_eq!(
        holder["pid_namespace_init"],
        serde_json::json!({"state": "running", "pid": namespace.init}),
        "{holder:#}"
    );
    assert!(document["gpus"][0]
        .get("exited_container_processes")
        .is_none());

    namespace.end(&rig.device(0));
    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    let holder = holder_of(gpu, namespace.holder);
    assert_eq!(
        holder["state"], "disk_sleep",
        "a frozen process sleeps uninterruptibly"
    );
    assert_eq!(holder["container_id"], CONTAINER);
    assert_eq!(
        holder["pid_namespace_init"],
        serde_json::json!({"state": "exited", "pid": namespace.init})
    );
    assert_eq!(gpu["exited_container_processes"], 1);
    let sentence = gpu["verdict"]["sentence"].as_str().unwrap();
    assert!(
        sentence.contains(&format!("container {SHORT}, whose container has ended, ")),
        "{sentence}"
    );
    let notes: Vec<&str> = gpu["verdict"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|note| note.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|note| note.starts_with(&format!(
            "The container of PID {} has ended, and the kernel SIGKILLs every process of a container that ends",
            namespace.holder
        ))),
        "{notes:#?}"
    );
    // The same process as a listed owner on GPU 1: live, stuck, its container gone. The
    // kernel SIGKILLed it when the container ended, and the kill waits while it is
    // frozen: killed, not merely uninterruptible.
    let owner = &document["gpus"][1]["owners"][0];
    assert_eq!(owner["state"], "killed", "{owner:#}");
    assert!(owner["process"]["kill_pending_since_unix_seconds"].is_u64());
    assert_eq!(owner["container_exited"], true);
    assert_eq!(document["gpus"][1]["exited_container_processes"], 1);
    assert!(document["gpus"][1]["verdict"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|note| note
            .as_str()
            .unwrap()
            .contains("still owns its memory although its container has ended")));

    let metrics = rig.start(&[]).scrape();
    for gpu in ["0", "1"] {
        assert_eq!(
            metrics.value("vram_exited_container_processes", &[("gpu", gpu)]),
            1.0,
            "GPU {gpu}"
        );
    }
    drop(namespace);
    drop(cgroup);
}
