//! Culprits and bystanders: the live process that keeps a dead owner's memory alive
//! (it maps the GPU's device file: a context, own or inherited), told from the processes
//! that merely hold the file (NVML clients, other GPUs' jobs). Each test builds its
//! scenario from real processes and reads the answer back through `check`, `check
//! --json` and the metrics.

use crate::helpers::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

/// GPU 0 with memory NVML still charges to `dead_owner`, as after a fork-inherited
/// orphan, and an idle GPU 1.
fn charged_to(rig: &Rig, dead_owner: u32) {
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::idle(1))
            .into_json(),
    );
}

/// `check --json` (which always scans for holders), expecting `status`.
fn check_json(rig: &Rig, status: i32) -> Value {
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(status), "{outcome:?}");
    outcome.json()
}

fn holder_info_pids(metrics: &Metrics, gpu: &str) -> Vec<String> {
    metrics
        .find("vram_holder_info", &[("gpu", gpu)])
        .iter()
        .map(|(_, labels, _)| labels["pid"].clone())
        .collect()
}

#[test]
fn a_fork_orphans_child_is_the_culprit_and_an_unknown_agent_only_a_bystander() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    // A monitoring agent under a name no list knows: it opens GPU 0's node, maps nothing.
    let agent = Model::agent("gpu-health", &rig.device(0)).spawn();
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(
        pids_of(&gpu["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(pids_of(&gpu["bystanders"]), [u64::from(agent.pid)]);
    let culprit = &gpu["culprits"][0];
    assert_eq!(culprit["comm"], "dataloader");
    assert_eq!(culprit["state"], "sleeping");
    assert_eq!(culprit["start_time_ticks"], start_time_ticks(child.pid));
    assert_eq!(culprit["mappings"]["gpus"], serde_json::json!([0]));
    let evidence: Vec<&str> = culprit["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|evidence| evidence["kind"].as_str().unwrap())
        .collect();
    // Its parent exited and was reaped: this test process adopted it (a subreaper), so
    // the tie that remains is the dead owner's process group.
    assert_eq!(
        evidence,
        ["maps_gpu", "inherited", "process_group_of", "session_of"]
    );
    assert_eq!(gpu["bystanders"][0]["evidence"][0]["kind"], "no_context");
    assert_eq!(gpu["remedy"]["action"], "kill");
    assert_eq!(pids_of(&gpu["remedy"]["targets"]), [u64::from(child.pid)]);
    assert_eq!(
        gpu["remedy"]["targets"][0]["start_time_ticks"],
        start_time_ticks(child.pid)
    );

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    assert_eq!(kill_line(&text.stdout, 0), Some(child.pid.to_string()));
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!(
            "still held by PID {} (dataloader, sleeping, started ",
            child.pid
        )) && sentence.ends_with(&format!("- killing {} should free it.", child.pid)),
        "{sentence}"
    );
    assert!(
        text.stdout.contains(&format!(
            "Not blamed, holding the device file without a context on GPU 0: PID {} (gpu-health",
            agent.pid
        )),
        "{}",
        text.stdout
    );

    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
    let info = &metrics.find("vram_holder_info", &[("gpu", "0")])[0].1;
    assert_eq!(info["comm"], "dataloader");
    assert_eq!(info["state"], "running");
    assert!(
        info["start_time"].parse::<u64>().unwrap() > 1_700_000_000,
        "{info:?}"
    );
    for (role, count) in [("culprit", 1.0), ("bystander", 1.0), ("undetermined", 0.0)] {
        assert_eq!(
            metrics.value("vram_holder_processes", &[("gpu", "0"), ("role", role)]),
            count,
            "{role}"
        );
    }
}

#[test]
fn a_stopped_culprit_is_reported_as_stopped() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    child.stop();
    charged_to(&rig, dead_owner);

    let metrics = rig.start(&[]).scrape();
    let child_pid = child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[("gpu", "0"), ("pid", &child_pid), ("state", "stopped")]
        ),
        1.0
    );
    let document = check_json(&rig, 1);
    assert_eq!(document["gpus"][0]["culprits"][0]["state"], "stopped");

    let text = rig.run(&["check"]);
    assert!(
        text.stdout.contains(
            "  note: A stopped holder still dies on SIGKILL; SIGTERM waits until it is continued.\n"
        ),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&child_pid.as_str()))
        .unwrap_or_else(|| panic!("no row for {child_pid}:\n{}", text.stdout));
    assert_eq!(columns(row)[2], "stopped");
}

#[test]
fn the_exporter_never_lists_itself() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);

    // A served exporter holding GPU 0's node open, as every NVML client does.
    {
        let mut command = rig.command_holding(&rig.device(0));
        command.args(["--web.listen-address", "127.0.0.1:0"]);
        let exporter = start(command);
        assert!(
            holds(exporter.child.id(), &rig.device(0)),
            "the exporter must hold the device for this test to mean anything"
        );
        let metrics = exporter.scrape();
        assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
        assert_eq!(
            metrics.value(
                "vram_holder_processes",
                &[("gpu", "0"), ("role", "bystander")]
            ),
            0.0
        );
    }

    // `snapshot` records the raw scan, before any classification.
    let snapshot = Running::spawn(rig.command_holding(&rig.device(0)).arg("snapshot"));
    let outcome = snapshot.finish(Duration::from_secs(30));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        pids_of(&outcome.json()["observation"]["holder_scan"]["holders"]),
        [u64::from(child.pid)]
    );
}

#[test]
fn a_live_job_of_gpu_0_holding_gpu_1s_node_is_not_gpu_1s_culprit() {
    // The CUDA runtime opens every visible GPU's node: a job on GPU 0 holds /dev/nvidia1
    // too, but maps only /dev/nvidia0. GPU 1 has a fork-inherited orphan.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_opening(&rig.device(1))
        .spawn();
    let (dead_owner, child) = Model::cuda("cuda-job", &rig.device(1)).fork_orphan(1, "dataloader");
    let child = &child[0];
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(Gpu::one_owner(1, dead_owner))
            .into_json(),
    );

    let document = check_json(&rig, 1);
    let (gpu0, gpu1) = (&document["gpus"][0], &document["gpus"][1]);
    assert_eq!(
        pids_of(&gpu1["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(pids_of(&gpu1["bystanders"]), [u64::from(job.pid)]);
    assert_eq!(
        gpu1["bystanders"][0]["evidence"][0],
        serde_json::json!({"kind": "owner_of_other_gpus", "gpus": [0]})
    );
    // GPU 0 has nothing orphaned: nothing is blamed there, not even the child.
    assert_eq!(gpu0["finding"], "owned");
    assert_eq!(pids_of(&gpu0["culprits"]), Vec::<u64>::new());
    assert_eq!(pids_of(&gpu0["bystanders"]), Vec::<u64>::new());

    let text = rig.run(&["check"]);
    assert_eq!(kill_line(&text.stdout, 1), Some(child.pid.to_string()));
    assert_eq!(kill_line(&text.stdout, 0), None);

    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "1"), [child.pid.to_string()]);
    assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    assert_eq!(
        metrics.value(
            "vram_holder_processes",
            &[("gpu", "0"), ("role", "bystander")]
        ),
        0.0
    );
}

#[test]
fn a_live_owner_of_gpu_0_with_a_context_on_gpu_1_stays_gpu_1s_culprit_scrape_after_scrape() {
    // The scan takes an owner's reading of the same scrape as it is only when it can
    // blame the owner for nothing: this one maps GPU 1's node too, where NVML charges a
    // dead process, so every scan reads it afresh and names it.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .spawn();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(Gpu::one_owner(1, nonexistent_pid()))
            .into_json(),
    );
    let exporter = rig.start(&[]);
    for scrape in 0..3 {
        let metrics = exporter.scrape();
        assert_eq!(
            holder_info_pids(&metrics, "1"),
            [job.pid.to_string()],
            "scrape {scrape}:\n{}",
            metrics.text
        );
        assert_eq!(
            metrics.value(
                "vram_owner_processes",
                &[("gpu", "0"), ("state", "running")]
            ),
            1.0
        );
        assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    }
}

#[test]
fn live_owners_of_other_gpus_are_never_counted_among_a_gpus_culprits() {
    // Scrape after scrape the scan takes the live owners' readings of the same scrape:
    // they must keep to their own GPUs.
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let jobs: Vec<Holder> = (1..4).map(|gpu| Holder::spawn(&rig.device(gpu))).collect();
    let mut gpus = Gpus::new().gpu(Gpu::one_owner(0, dead_owner));
    for (index, job) in jobs.iter().enumerate() {
        gpus = gpus.gpu(
            Gpu::idle(index as u32 + 1)
                .used(USED)
                .process(job.pid, Some(CHARGED)),
        );
    }
    rig.write_scenario(&gpus.into_json());
    let exporter = rig.start(&[]);
    for scrape in 0..3 {
        let metrics = exporter.scrape();
        let context = || format!("scrape {scrape}:\n{}", metrics.text);
        assert_eq!(
            metrics.value(
                "vram_holder_processes",
                &[("gpu", "0"), ("role", "culprit")]
            ),
            1.0,
            "{}",
            context()
        );
        assert_eq!(
            holder_info_pids(&metrics, "0"),
            [child.pid.to_string()],
            "{}",
            context()
        );
        for gpu in ["1", "2", "3"] {
            assert_eq!(
                metrics.value(
                    "vram_owner_processes",
                    &[("gpu", gpu), ("state", "running")]
                ),
                1.0
            );
        }
    }
}

#[test]
fn the_dead_owners_pid_reused_by_an_nvml_client_still_reports_the_orphan() {
    // The H200 case: the exporter called the owner live because its PID existed and held
    // /dev/nvidia0, reported nothing orphaned, and `check` exited 0.
    let rig = Rig::new();
    let (dead_owner, mut children) = Model::cuda("cuda-job", &rig.device(0))
        .in_launchers_session()
        .fork_orphan(1, "dataloader");
    let child = children.remove(0);
    let reuser = Model::agent("gpu-health", &rig.device(0)).spawn_at(dead_owner);
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    let owner = &gpu["owners"][0];
    assert_eq!(owner["pid"], dead_owner, "{document:#}");
    assert_eq!(owner["state"], "gone");
    assert_eq!(owner["detail"]["reason"], "reused");
    assert_eq!(owner["detail"]["by"]["comm"], "gpu-health");
    assert_eq!(
        owner["detail"]["by"]["start_time_ticks"],
        start_time_ticks(reuser.pid)
    );
    assert_eq!(gpu["orphaned_owner_gone_bytes"], CHARGED);
    assert_eq!(pids_of(&gpu["culprits"]), [u64::from(child.pid)]);
    // The reuser holds GPU 0's node open: a bystander, never in the kill line.
    assert_eq!(pids_of(&gpu["bystanders"]), [u64::from(reuser.pid)]);

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    assert_eq!(kill_line(&text.stdout, 0), Some(child.pid.to_string()));
    assert!(
        text.stdout.contains(&format!(
            "note: PID {dead_owner} is gone: the PID now names PID {dead_owner} (gpu-health, sleeping"
        )),
        "{}",
        text.stdout
    );

    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "reused")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
}

#[test]
fn reuse_by_a_cuda_job_of_another_gpu_while_the_exporter_watches() {
    // The exporter sees the owner alive first, then its fork orphan, then its PID taken by
    // a CUDA job of GPU 1: nothing it learnt of the first process may be served for the
    // second, and the PID's charge on GPU 0 stays orphaned.
    let rig = Rig::new();
    let owner = Model::cuda("trainer", &rig.device(0))
        .in_launchers_session()
        .spawn_forking_later(1, "dataloader");
    let pid = owner.owner.pid;
    charged_to(&rig, pid);
    let exporter = rig.start(&[]);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        1.0
    );

    let (dead_owner, children) = owner.orphan_now();
    assert_eq!(dead_owner, pid);
    let child = &children[0];
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "exited")]
        ),
        1.0
    );
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);

    let reuser = Model::cuda("other-job", &rig.device(1)).spawn_at(pid);
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, pid))
            .gpu(Gpu::one_owner(1, pid))
            .into_json(),
    );
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "reused")]
        ),
        1.0,
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
    // On GPU 1 the same PID is the new job's, alive.
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "1"), ("state", "running")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "1"), ("reason", "owner_gone")]
        ),
        0.0
    );
    drop(reuser);
}

#[test]
fn a_culprit_whose_main_thread_exited_is_found_through_its_threads() {
    // The pthread_exit trap: /proc/PID/fd and /proc/PID/maps are empty; the files and
    // the mappings are in a live thread's lists.
    let rig = Rig::new();
    let (dead_owner, child) =
        Model::cuda("cuda-job", &rig.device(0)).fork_orphan_with_zombie_leader("dataloader");
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(
        pids_of(&gpu["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(gpu["culprits"][0]["state"], "zombie");
    assert_eq!(gpu["remedy"]["action"], "kill");
}

#[test]
fn three_dataloader_workers_are_all_culprits_and_all_in_the_kill() {
    let rig = Rig::new();
    let (dead_owner, children) =
        Model::cuda("trainer", &rig.device(0)).fork_orphan(3, "pt_data_worker");
    charged_to(&rig, dead_owner);
    let mut expected: Vec<u64> = children.iter().map(|child| u64::from(child.pid)).collect();
    expected.sort_unstable();

    let document = check_json(&rig, 1);
    assert_eq!(pids_of(&document["gpus"][0]["culprits"]), expected);
    let text = rig.run(&["check"]);
    let kill: Vec<u64> = kill_line(&text.stdout, 0)
        .expect("a kill line")
        .split(' ')
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(kill, expected);
    assert!(verdict_line(&text.stdout, 0).ends_with("- killing them should free it."));
}

#[test]
fn holders_of_another_gpus_node_or_the_control_node_are_not_named_for_this_gpu() {
    let rig = Rig::new();
    let control_only = Model::agent("ctl-only", &rig.control_device()).spawn();
    let other_gpu = Holder::spawn(&rig.device(1));
    // GPU 0 is orphaned, so the scan runs; nothing holds GPU 0's own node.
    charged_to(&rig, nonexistent_pid());

    let document = check_json(&rig, 1);
    for gpu in document["gpus"].as_array().unwrap() {
        for role in ["culprits", "bystanders", "undetermined"] {
            assert_eq!(
                pids_of(&gpu[role]),
                Vec::<u64>::new(),
                "{role}: {document:#}"
            );
        }
    }
    assert_eq!(document["gpus"][0]["remedy"]["action"], "reset_gpu");
    // GPU 1 has nothing orphaned, so its live process is named nowhere.
    assert_eq!(document["gpus"][1]["finding"], "idle");
    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    assert_eq!(holder_info_pids(&metrics, "1"), Vec::<String>::new());
    drop((control_only, other_gpu));
}

#[test]
fn a_scan_denied_permission_says_so_and_suggests_no_kill() {
    let rig = Rig::new();
    assert_eq!(
        effective_uid(),
        0,
        "this test runs the exporter as nobody beside root's processes: run the tests as root"
    );
    let (dead_owner, _child) = Holder::fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);

    let metrics =
        start(rig.unprivileged_command(&["--web.listen-address", "127.0.0.1:0"])).scrape();
    assert_eq!(metrics.value("vram_holder_scan_complete", &[]), 0.0);
    assert_eq!(
        metrics.find("vram_holder_info", &[("gpu", "0")]).len(),
        0,
        "{}",
        metrics.text
    );

    let output = rig
        .unprivileged_command(&["check", "--json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["holder_scan"]["complete"], false, "{document:#}");
    assert!(
        document["holder_scan"]["permission_errors"]
            .as_u64()
            .unwrap()
            >= 1
    );
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["remedy"]["action"], "cannot_tell");
    assert_eq!(gpu["remedy"]["reason"]["why"], "scan_denied");
    assert_eq!(
        gpu["verdict"]["suggestion"],
        "sudo vram-exporter check --gpu 0"
    );

    let text = rig.unprivileged_command(&["check"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert_eq!(kill_line(&stdout, 0), None, "{stdout}");
    assert!(
        verdict_line(&stdout, 0)
            .contains("; cannot tell which process holds it: the descriptors of "),
        "{stdout}"
    );
}

#[test]
fn owners_whose_mappings_cannot_be_read_are_unknown_never_gone() {
    // Another user's mappings need CAP_SYS_PTRACE: a live owner then cannot be proven
    // to hold its context, and cannot be called gone either.
    let rig = Rig::new();
    assert_eq!(
        effective_uid(),
        0,
        "this test runs the exporter as nobody beside root's processes: run the tests as root"
    );
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));

    let output = rig
        .unprivileged_command(&["check", "--json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "cannot tell");
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["owners"][0]["state"], "unknown", "{document:#}");
    assert_eq!(gpu["owners"][0]["detail"]["reason"], "context_unreadable");
    assert_eq!(gpu["orphaned_bytes"], 0);
    assert_eq!(gpu["finding"], "cannot_tell");
    assert_eq!(document["status"], "cannot_tell");

    let metrics =
        start(rig.unprivileged_command(&["--web.listen-address", "127.0.0.1:0"])).scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "unknown")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "0"), ("state", "gone")]),
        0.0
    );
}

/// The exporter started by `unshare --pid --fork` in a new PID namespace, keeping this
/// host's `/proc` as its procfs (a container without `hostPID` that mounts the host's
/// `/proc`), with a model CUDA owner started beside it inside the namespace. The owner
/// writes `READY <its PID in the namespace>` to `ready`.
fn exporter_in_own_pid_namespace(rig: &Rig, owner: &str, ready: &std::path::Path) -> Exporter {
    let unshare = require_tool("unshare", "util-linux");
    let exporter = rig.command();
    let mut command = Command::new(unshare);
    command
        .args(["--pid", "--fork", "--kill-child", "--", "sh", "-c"])
        .arg("python3 -c \"$MODEL\" \"$SPEC\" >\"$READY\" & exec \"$@\"")
        .arg("sh")
        .arg(exporter.get_program())
        .args(exporter.get_args())
        .args(["--web.listen-address", "127.0.0.1:0"])
        .env("MODEL", model_program())
        .env("SPEC", owner)
        .env("READY", ready)
        .stdin(Stdio::null());
    for (key, value) in exporter.get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    start(command)
}

#[test]
fn an_exporter_in_its_own_pid_namespace_reading_the_hosts_proc() {
    // Before: NVML's PIDs (the namespace's) were looked up in the host's /proc, where
    // namespace PID 2 is kthreadd, so a live owner was called gone: a false page.
    let rig = Rig::new();
    assert_eq!(
        effective_uid(),
        0,
        "unshare --pid needs root: run the tests as root"
    );
    let ready = rig.dir.path().join("owner-ready");
    let owner = Model::cuda("trainer", &rig.device(0)).spec_json();
    let exporter = exporter_in_own_pid_namespace(&rig, &owner, &ready);
    let mut namespace_pid = 0;
    wait_until(
        "the owner in the namespace is ready",
        Duration::from_secs(20),
        || {
            namespace_pid = std::fs::read_to_string(&ready)
                .ok()
                .and_then(|line| line.trim().strip_prefix("READY ")?.parse().ok())
                .unwrap_or(0);
            namespace_pid != 0
        },
    );
    // NVML answers in the caller's namespace.
    rig.charge_gpu0(namespace_pid, Some(CHARGED));
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_procfs_own_pid_namespace", &[]), 0.0);
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 0.0);
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        1.0,
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "0"), ("state", "gone")]),
        0.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        0.0
    );

    // A PID that the host's /proc cannot place in the namespace is unknown, never gone.
    let missing = namespace_pid + 5000;
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(2 * USED)
                    .process(namespace_pid, Some(CHARGED))
                    .process(missing, Some(CHARGED)),
            )
            .into_json(),
    );
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "unknown")]
        ),
        1.0,
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        0.0
    );
}

// Two GPUs of one host: a job and an orphan spread over both, on the fake NVML (the real
// two-GPU run waits for a two-GPU machine).

#[test]
fn a_fork_orphan_of_a_job_on_both_gpus_has_the_same_one_culprit_on_both() {
    // A job with tensors on GPU 0 and GPU 1 forks a DataLoader worker and is killed: the
    // worker inherits both contexts, and NVML charges the dead job on both GPUs.
    let rig = Rig::new();
    let (dead_owner, children) = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .fork_orphan(1, "dataloader");
    let child = &children[0];
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, dead_owner))
            .into_json(),
    );
    let document = check_json(&rig, 1);
    for gpu in 0..2 {
        let verdict = &document["gpus"][gpu];
        assert_eq!(
            pids_of(&verdict["culprits"]),
            [u64::from(child.pid)],
            "GPU {gpu}: {document:#}"
        );
        assert_eq!(pids_of(&verdict["bystanders"]), Vec::<u64>::new());
    }
    let text = rig.run(&["check"]);
    for gpu in 0..2 {
        assert_eq!(kill_line(&text.stdout, gpu), Some(child.pid.to_string()));
    }
    let metrics = rig.start(&[]).scrape();
    for gpu in ["0", "1"] {
        assert_eq!(holder_info_pids(&metrics, gpu), [child.pid.to_string()]);
        assert_eq!(
            metrics.value(
                "vram_orphaned_bytes",
                &[("gpu", gpu), ("reason", "owner_gone")]
            ),
            CHARGED as f64
        );
    }
}

#[test]
fn a_live_job_with_contexts_on_both_gpus_is_owned_on_both_and_blamed_nowhere() {
    // Peer-to-peer copies: one process with a context on each GPU, which NVML lists on
    // both; a second process's job on GPU 1 beside it.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .spawn();
    let peer = Model::cuda("peer", &rig.device(1)).spawn();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(
                Gpu::idle(1)
                    .used(USED + CHARGED)
                    .process(job.pid, Some(CHARGED))
                    .process(peer.pid, Some(CHARGED)),
            )
            .into_json(),
    );
    let document = check_json(&rig, 0);
    for gpu in 0..2 {
        assert_eq!(document["gpus"][gpu]["finding"], "owned", "{document:#}");
        assert_eq!(
            pids_of(&document["gpus"][gpu]["culprits"]),
            Vec::<u64>::new()
        );
    }
    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "1"), ("state", "running")]
        ),
        2.0
    );
    for gpu in ["0", "1"] {
        assert_eq!(
            metrics.value(
                "vram_orphaned_bytes",
                &[("gpu", gpu), ("reason", "owner_gone")]
            ),
            0.0
        );
    }
}
