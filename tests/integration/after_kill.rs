//! After a kill: the workers a killed server leaves behind, and the processes that must
//! never be called left behind. Real processes: a model server starts its workers through
//! Python's multiprocessing (spawn, as vLLM and SGLang do) and is SIGKILLed; the workers
//! live on, adopted by this test process (a subreaper, as init would adopt them on a host).

use crate::containers::Cgroup;
use crate::helpers::*;
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use crate::kubernetes::{path, pod_logs, CONTAINER, POD_UID};
use serde_json::Value;
use std::time::Duration;

/// Each worker's charge.
const WORKER_BYTES: u64 = 4 * GIB;

/// GPU 0 with `owners` charged `WORKER_BYTES` each, GPU 1 idle.
fn charged_to(rig: &Rig, owners: &[u32]) {
    let gpu = owners.iter().fold(
        Gpu::idle(0).used(owners.len() as u64 * WORKER_BYTES + 9 * 1024 * 1024),
        |gpu, &pid| gpu.process(pid, Some(WORKER_BYTES)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).gpu(Gpu::idle(1)).into_json());
}

fn left_behind_bytes(metrics: &Metrics) -> f64 {
    metrics.value("vram_left_behind_bytes", &[("gpu", "0")])
}

#[test]
fn a_killed_servers_two_workers_are_left_behind_named_and_counted() {
    let rig = Rig::new();
    let Server { server, workers } =
        Model::cuda("api-server", &rig.device(0)).spawn_server(2, "engine-core");
    let pids: Vec<u32> = workers.iter().map(|worker| worker.pid).collect();
    charged_to(&rig, &pids);
    let exporter = rig.start(&[]);

    // The server lives: its workers are its own.
    let metrics = exporter.scrape();
    assert_eq!(left_behind_bytes(&metrics), 0.0);
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        2.0
    );

    let server_pid = server.pid;
    server.kill();
    let mut metrics = exporter.scrape();
    wait_until(
        "the exporter sees the workers left behind",
        Duration::from_secs(10),
        || {
            metrics = exporter.scrape();
            left_behind_bytes(&metrics) == (2 * WORKER_BYTES) as f64
        },
    );
    // Nothing is orphaned: the memory has live owners, which killing frees.
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        0.0
    );
    let named = metrics.find("vram_left_behind_since_timestamp_seconds", &[("gpu", "0")]);
    let mut named_pids: Vec<u32> = named
        .iter()
        .map(|(_, labels, _)| labels["pid"].parse().unwrap())
        .collect();
    named_pids.sort_unstable();
    assert_eq!(named_pids, pids, "{}", metrics.text);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for (_, labels, seen) in named {
        assert_eq!(labels["parent_pid"], server_pid.to_string());
        assert_eq!(labels["parent_comm"], "api-server");
        assert_eq!(labels["comm"], "engine-core");
        assert!((now - 60.0..=now + 1.0).contains(seen), "seen at {seen}");
    }
    assert_eq!(
        metrics.value("vram_left_behind_bytes", &[("gpu", "1")]),
        0.0
    );
    assert_per_gpu_series_carry_no_workload_labels(&metrics);
    assert_promtool_clean(&metrics.text);

    // `check` beside it goes by what the exporter witnessed (its state): the same two
    // workers, left behind by the server it saw exit, and the same kill: exit status 4.
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(4), "{outcome:?}");
    let line = verdict_line(&outcome.stdout, 0);
    assert!(
        line.starts_with(
            "GPU 0: 8.0 GiB (8,192 MiB) held by 2 processes left behind by a server that exited:"
        ),
        "{line}"
    );
    for pid in &pids {
        assert!(line.contains(&format!("PID {pid} (engine-core")), "{line}");
    }
    assert!(
        line.contains(&format!("a worker of PID {server_pid} (api-server, ")),
        "{line}"
    );
    let expected_kill = format!("kill {} {}", pids[0], pids[1]);
    assert!(
        suggestion(&outcome.stdout, 0).is_some_and(|line| line.starts_with(&expected_kill)),
        "{}",
        outcome.stdout
    );
    assert!(outcome.stdout.contains("exit status 4: memory left behind"));
    assert_eq!(outcome.stderr, "", "the state was found and trusted");

    let document = rig.run(&["check", "--json"]);
    assert_eq!(document.status, Some(4));
    let document = document.json();
    let gpu: Value = document["gpus"][0].clone();
    assert_eq!(gpu["finding"], "left_behind", "{gpu:#}");
    assert_eq!(gpu["left_behind_bytes"], 2 * WORKER_BYTES);
    assert_eq!(gpu["remedy"]["action"], "kill_left_behind");
    assert_eq!(
        pids_of(&gpu["remedy"]["targets"]),
        pids.iter().map(|&pid| u64::from(pid)).collect::<Vec<_>>()
    );
    for worker in gpu["left_behind"].as_array().unwrap() {
        assert_eq!(worker["seen"]["certainty"], "parent_exited");
        assert_eq!(worker["seen"]["parent"]["pid"], server_pid);
        // The parent and its exit are what the exporter witnessed, not what check saw.
        assert_eq!(
            worker["process"]["from_witness"],
            serde_json::json!(["parent", "parent_exit"]),
            "{worker:#}"
        );
    }
    assert!(
        document["witness"]["written_unix_seconds"].is_u64(),
        "{document:#}"
    );

    // A look that goes by no witness (another state folder, empty) never saw the
    // server: it names both workers and the server's group, possibly left behind, and
    // says it judged from its own look alone.
    let elsewhere = rig.dir.path().join("no-state");
    let outcome = rig.run_with_state(&elsewhere, &["check"]);
    assert_eq!(outcome.status, Some(4), "{outcome:?}");
    assert_eq!(outcome.stderr, Rig::no_state_warning(&elsewhere));
    let line = verdict_line(&outcome.stdout, 0);
    assert!(
        line.starts_with("GPU 0: 8.0 GiB (8,192 MiB) held by 2 processes possibly left behind by a server that exited:"),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "a worker spawned by Python's multiprocessing, never meant to run without its parent, and the leader of its process group, PID {server_pid} (the process that started it), has exited"
        )),
        "{line}"
    );
    assert!(
        suggestion(&outcome.stdout, 0).is_some_and(|line| line.starts_with(&expected_kill)),
        "{}",
        outcome.stdout
    );
    let gpu: Value = rig.run_with_state(&elsewhere, &["check", "--json"]).json()["gpus"][0].clone();
    for worker in gpu["left_behind"].as_array().unwrap() {
        assert_eq!(worker["seen"]["certainty"], "possibly");
        assert_eq!(worker["seen"]["clue"], "spawned_worker");
        assert_eq!(worker["seen"]["group_leader"], server_pid);
        assert_eq!(worker["used_bytes"], WORKER_BYTES);
        assert!(
            worker["process"].get("from_witness").is_none(),
            "{worker:#}"
        );
    }

    // An exporter started after the kill with no state never saw the server: its
    // series count the workers as possibly left behind, never paged on.
    let late = rig.start_with_state(&elsewhere, &[]);
    let metrics = late.scrape();
    assert_eq!(left_behind_bytes(&metrics), 0.0);
    assert_eq!(
        metrics.value("vram_possibly_left_behind_bytes", &[("gpu", "0")]),
        (2 * WORKER_BYTES) as f64
    );
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        2.0
    );
    drop(workers);
}

#[test]
fn check_waits_for_left_behind_memory_to_be_freed_after_the_suggested_kill() {
    let rig = Rig::new();
    let Server { server, workers } =
        Model::cuda("api-server", &rig.device(0)).spawn_server(2, "engine-core");
    let pids: Vec<u32> = workers.iter().map(|worker| worker.pid).collect();
    charged_to(&rig, &pids);
    server.kill();
    let check = rig.spawn(&[
        "check",
        "--gpu",
        "0",
        "--wait",
        "30s",
        "--wait.interval",
        "50ms",
    ]);
    wait_until(
        "check has printed its first verdict and polls",
        Duration::from_secs(20),
        || check.stdout().contains("should free it.") && check.stderr().contains("waiting: "),
    );
    // Left behind, never called orphaned, also while waiting.
    assert!(
        check.stderr().contains("waiting: 8.0 GiB still held ("),
        "{}",
        check.stderr()
    );
    // The person runs the suggested kill; the driver frees the memory and drops the PIDs.
    for worker in workers {
        worker.kill();
    }
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    let outcome = check.finish(Duration::from_secs(20));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert!(
        outcome.stderr.contains("held memory freed after "),
        "{}",
        outcome.stderr
    );
}

/// Serve and `check` a host whose GPU 0 `owner` holds, and find nothing left behind: no
/// bytes, no named process, and `check` exits 0 with the memory owned.
fn assert_never_left_behind(rig: &Rig, exporter: &Exporter, owner: u32) {
    let metrics = exporter.scrape();
    assert_eq!(left_behind_bytes(&metrics), 0.0, "{}", metrics.text);
    assert!(
        metrics
            .find("vram_left_behind_since_timestamp_seconds", &[])
            .is_empty(),
        "{}",
        metrics.text
    );
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    let line = verdict_line(&outcome.stdout, 0);
    assert!(
        line.starts_with("GPU 0: 4.0 GiB (4,096 MiB) owned by 1 live process; nothing orphaned."),
        "{line}"
    );
    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(document["gpus"][0]["left_behind"], serde_json::json!([]));
    assert_eq!(document["gpus"][0]["owners"][0]["pid"], owner);
}

#[test]
fn a_service_whose_launcher_exited_is_not_left_behind() {
    // A launcher gives the service a session of its own and exits, as `systemd-run`, a
    // `setsid` wrapper or an init script does: the service leads its session.
    let rig = Rig::new();
    let service = Model::cuda("launcher", &rig.device(0)).launch_service("inference-svc");
    charged_to(&rig, &[service.pid]);
    let exporter = rig.start(&[]);
    assert_never_left_behind(&rig, &exporter, service.pid);
}

#[test]
fn a_daemon_that_double_forked_before_the_exporter_started_is_not_left_behind() {
    // fork, setsid, fork: the daemon leads nothing, its group's leader exited at once,
    // and its parent is whoever adopted it; but its group is its session.
    let rig = Rig::new();
    let daemon = Model::cuda("daemonize", &rig.device(0)).spawn_daemon("gpu-daemon");
    let (group, session) = process_group_and_session(daemon.pid);
    assert_eq!(group, session);
    assert_ne!(group, daemon.pid);
    charged_to(&rig, &[daemon.pid]);
    let exporter = rig.start(&[]);
    assert_never_left_behind(&rig, &exporter, daemon.pid);
}

#[test]
fn a_worker_whose_parent_merely_re_execs_is_not_left_behind() {
    let rig = Rig::new();
    let (parent, worker) = Model::cuda("launcher", &rig.device(0))
        .in_launchers_session()
        .spawn_reexecing_parent("worker");
    charged_to(&rig, &[worker.pid]);
    let exporter = rig.start(&[]);
    exporter.scrape();
    // The parent becomes another program under the same PID and start time.
    signal(parent.pid, libc::SIGUSR1);
    wait_until("the parent has exec'd", Duration::from_secs(10), || {
        proc_comm(parent.pid).as_deref() == Some("python3")
    });
    assert_never_left_behind(&rig, &exporter, worker.pid);
}

#[test]
fn a_slurm_step_under_its_live_slurmstepd_is_not_left_behind() {
    // Slurm's step daemon starts the job's tasks and lives as long as they run.
    let rig = Rig::new();
    let (_stepd, task) = Model::cuda("slurmstepd", &rig.device(0))
        .in_launchers_session()
        .spawn_reexecing_parent("python3-task");
    charged_to(&rig, &[task.pid]);
    let exporter = rig.start(&[]);
    exporter.scrape();
    assert_never_left_behind(&rig, &exporter, task.pid);
}

/// `PF_EXITING` and a flag every user process has (`PF_RANDOMIZE`, as in a real stat line).
const PF_EXITING: u32 = 0x4;
const USER_FLAGS: u32 = 4_194_560;

#[test]
fn an_owner_killed_but_stuck_in_the_driver_is_named_with_its_wait() {
    // Branch 4: a SIGKILL pending (bit 8, signal 9, of ShdPnd) while the process sleeps
    // uninterruptibly in the driver. No process can be put in that state without a GPU
    // driver to sleep in, so the exporter reads it from a /proc fixture tree
    // (`Rig::procfs_with_owner`), through `--path.procfs` as it reads the real one.
    let rig = Rig::new();
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        ('D', USER_FLAGS),
        "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n",
        "uvm_va_space_destroy",
    );
    rig.charge_gpu0(4242, Some(CHARGED));
    let procfs = procfs.to_str().unwrap();

    let outcome = rig.run(&["check", "--test.procfs-stand-in", "--path.procfs", procfs]);
    assert_eq!(outcome.status, Some(4), "{outcome:?}");
    let line = verdict_line(&outcome.stdout, 0);
    assert!(
        line.starts_with(
            "GPU 0: 8.6 GiB (8,802 MiB) held by PID 4242, which was killed but stuck in the driver (a SIGKILL pending in uninterruptible sleep): PID 4242 (stuck-job) in uvm_va_space_destroy, killed since "
        ),
        "{line}"
    );
    // Seen for the first time by this look: too soon to give up on the kill.
    assert!(
        line.ends_with(
            "a kill is delivered only when the call it waits in returns: wait, and look again."
        ),
        "{line}"
    );
    assert_eq!(
        suggestion(&outcome.stdout, 0),
        Some("vram-exporter check --gpu 0 --wait 60s")
    );
    let document = rig
        .run(&[
            "check",
            "--json",
            "--test.procfs-stand-in",
            "--path.procfs",
            procfs,
        ])
        .json();
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["finding"], "killed_stuck");
    assert_eq!(gpu["owners"][0]["state"], "killed");
    assert_eq!(gpu["owners"][0]["process"]["wchan"], "uvm_va_space_destroy");
    assert!(gpu["owners"][0]["process"]["kill_pending_since_unix_seconds"].is_u64());
    assert_eq!(gpu["remedy"]["action"], "wait");

    let exporter = rig.start(&["--test.procfs-stand-in", "--path.procfs", procfs]);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "0"), ("state", "killed")]),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "uninterruptible")]
        ),
        0.0
    );
    assert_eq!(
        metrics.value("vram_owned_bytes", &[("gpu", "0"), ("state", "killed")]),
        CHARGED as f64
    );

    // The same sleep without a pending kill is the plain uninterruptible owner it was.
    let rig = Rig::new();
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        ('D', USER_FLAGS),
        "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n",
        "uvm_va_space_destroy",
    );
    rig.charge_gpu0(4242, Some(CHARGED));
    let outcome = rig.run(&[
        "check",
        "--json",
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs.to_str().unwrap(),
    ]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        outcome.json()["gpus"][0]["owners"][0]["state"],
        "uninterruptible"
    );
}

#[test]
fn an_owner_in_its_exit_path_is_being_freed_never_orphaned() {
    // Branch 2: SIGKILL delivered, the main thread in its exit path (PF_EXITING) while the
    // driver frees the context; a fixture tree, as the moment lasts 0.12-0.20 s on an H100 or H200.
    let rig = Rig::new();
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        ('D', USER_FLAGS | PF_EXITING),
        "SigPnd:\t0000000000000100\nShdPnd:\t0000000000000100\n",
        "uvm_va_space_destroy",
    );
    rig.charge_gpu0(4242, Some(CHARGED));
    let procfs = procfs.to_str().unwrap();
    let outcome = rig.run(&["check", "--test.procfs-stand-in", "--path.procfs", procfs]);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 8.6 GiB (8,802 MiB) being freed: owner PID 4242 is exiting and the driver is freeing its memory (0.12-0.20 s after a SIGKILL on an H100 or H200); nothing orphaned."
    );
    let exporter = rig.start(&["--test.procfs-stand-in", "--path.procfs", procfs]);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "exiting")]
        ),
        1.0
    );
    for reason in ["owner_gone", "unattributed"] {
        assert_eq!(
            metrics.value("vram_orphaned_bytes", &[("gpu", "0"), ("reason", reason)]),
            0.0
        );
    }
}

#[test]
fn a_left_behind_worker_in_a_pod_carries_its_pod_in_the_series_and_the_words() {
    let rig = Rig::new();
    let Server { server, workers } =
        Model::cuda("api-server", &rig.device(0)).spawn_server(1, "engine-core");
    let worker = &workers[0];
    // The worker's real cgroup is a pod's (the cgroupfs driver's layout).
    let cgroup = Cgroup::create(&format!("kubepods/burstable/pod{POD_UID}/{CONTAINER}"));
    cgroup.add(worker.pid);
    charged_to(&rig, &[worker.pid]);
    let logs = pod_logs(&rig, &[("ml", "sglang-0", POD_UID)]);
    let kubelet = StandInKubelet::start(Behaviour::Answer(vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&Gpu::uuid(0)])])
    ]));
    let flags = [
        "--kubelet.pod-resources-path",
        &kubelet.socket_arg(),
        "--path.pod-logs",
        &path(&logs),
    ];
    let exporter = rig.start(&flags);
    assert_eq!(left_behind_bytes(&exporter.scrape()), 0.0);

    let server_pid = server.pid.to_string();
    server.kill();
    let mut metrics = exporter.scrape();
    wait_until(
        "the exporter sees the worker left behind",
        Duration::from_secs(10),
        || {
            metrics = exporter.scrape();
            left_behind_bytes(&metrics) == WORKER_BYTES as f64
        },
    );
    let pid = worker.pid.to_string();
    let series = metrics.find(
        "vram_left_behind_since_timestamp_seconds",
        &[("gpu", "0"), ("pid", &pid), ("parent_pid", &server_pid)],
    );
    assert_eq!(series.len(), 1, "{}", metrics.text);
    let labels = &series[0].1;
    assert_eq!(
        (
            labels["pod_uid"].as_str(),
            labels["namespace"].as_str(),
            labels["pod"].as_str()
        ),
        (POD_UID, "ml", "sglang-0"),
        "{labels:?}"
    );
    assert_promtool_clean(&metrics.text);

    let outcome = rig.run(&[&["check", "--gpu", "0"][..], &flags[..]].concat());
    let sentence = verdict_line(&outcome.stdout, 0);
    assert!(
        sentence.contains(&format!("PID {pid} (engine-core, "))
            && sentence.contains(", pod ml/sglang-0, "),
        "{sentence}"
    );
    let document = rig
        .run(&[&["check", "--json", "--gpu", "0"][..], &flags[..]].concat())
        .json();
    assert_eq!(
        document["gpus"][0]["left_behind"][0]["process"]["pod"],
        serde_json::json!({"namespace": "ml", "name": "sglang-0"}),
        "{document:#}"
    );
    drop(cgroup);
}
