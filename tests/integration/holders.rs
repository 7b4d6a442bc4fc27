//! The scan for device-file holders: the live process that keeps a dead owner's memory
//! alive, which NVML never names. Each test builds the scenario from real processes and
//! reads the answer back through `check --json` and the metrics.

use crate::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;

/// A GPU 0 whose memory NVML still charges to `dead_owner`, as the driver does after a
/// fork-inherited orphan.
fn charged_to(rig: &Rig, dead_owner: u32) {
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).process(dead_owner, Some(CHARGED)))
            .gpu(Gpu::idle(1))
            .into_json(),
    );
}

/// `check --json`, which always scans for holders.
fn check_json(rig: &Rig) -> Value {
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(1), "GPU 0 is orphaned: {outcome:?}");
    outcome.json()
}

fn holder_pids(gpu: &Value) -> Vec<u64> {
    gpu["unlisted_holders"]
        .as_array()
        .expect("unlisted_holders is a list")
        .iter()
        .map(|holder| holder["pid"].as_u64().unwrap())
        .collect()
}

fn holder_info_pids(metrics: &Metrics, gpu: &str) -> Vec<String> {
    metrics
        .find("vram_holder_info", &[("gpu", gpu)])
        .iter()
        .map(|(_, labels, _)| labels["pid"].clone())
        .collect()
}

/// What `check --json` must say about a holder that this test process spawned.
fn expected_holder(pid: u32, state: &str, gpu_minors: &[u32]) -> Value {
    let uid = effective_uid();
    let mut holder = json!({
        "pid": pid,
        // This test process spawned it or adopted it: Holder::fork_orphan makes it a
        // child subreaper, so it adopts the child when the owner exits (a real host
        // would show 1 or a session manager).
        "ppid": std::process::id(),
        "comm": "sleep",
        "state": state,
        "start_time_ticks": start_time_ticks(pid),
        "uid": uid,
        "gpu_minors": gpu_minors,
        "pgid": process_group_and_session(pid).0,
        "sid": process_group_and_session(pid).1,
    });
    if let Some(user) = user_name(uid) {
        holder["user"] = json!(user);
    }
    holder
}

#[test]
fn fork_inherited_orphan_names_exactly_the_inheriting_child_with_its_parent() {
    let rig = Rig::new();
    let (dead_owner, child) = settled_fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);

    let document = check_json(&rig);
    assert_eq!(
        document["gpus"][0]["unlisted_holders"],
        json!([expected_holder(child.pid, "S", &[0])]),
        "{document:#}"
    );
    assert_eq!(document["gpus"][0]["owners"][0]["pid"], dead_owner);
    assert_eq!(document["gpus"][0]["owners"][0]["state"], "gone");
    assert_eq!(holder_pids(&document["gpus"][1]), Vec::<u64>::new());

    let metrics = rig.start(&[]).scrape();
    assert_eq!(metrics.value("vram_unlisted_holders", &[("gpu", "0")]), 1.0);
    let child_pid = child.pid.to_string();
    let info = metrics.find("vram_holder_info", &[("gpu", "0")]);
    assert_eq!(info.len(), 1, "{}", metrics.text);
    assert_eq!(info[0].1["pid"], child_pid);
    assert_eq!(info[0].1["comm"], "sleep");
    assert_eq!(info[0].1["state"], "running");
    assert_eq!(info[0].1["uuid"], Gpu::uuid(0));
    assert_eq!(info[0].2, 1.0);
}

#[test]
fn stopped_holder_is_reported_as_stopped() {
    let rig = Rig::new();
    let (dead_owner, child) = settled_fork_orphan(&rig.device(0));
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

    let document = check_json(&rig);
    assert_eq!(
        document["gpus"][0]["unlisted_holders"],
        json!([expected_holder(child.pid, "T", &[0])])
    );

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    let row = text
        .stdout
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("{child_pid} ")))
        .unwrap_or_else(|| panic!("no row for the holder:\n{}", text.stdout));
    assert_eq!(
        columns(row),
        [
            child_pid.as_str(),
            "sleep",
            "stopped",
            &std::process::id().to_string()
        ]
    );
    let verdict = verdict_line(&text.stdout, 0);
    assert!(
        verdict.contains(&format!("PID {child_pid} (sleep, stopped, "))
            && verdict.ends_with(&format!("- killing {child_pid} should free it.")),
        "{verdict}"
    );
    assert!(
        text.stdout.contains(
            "  note: A stopped holder still dies on SIGKILL; SIGTERM waits until it is continued.\n"
        ),
        "{}",
        text.stdout
    );
}

#[test]
fn exporter_never_lists_itself_as_a_holder() {
    let rig = Rig::new();
    let (dead_owner, child) = settled_fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);

    // A served exporter holding GPU 0's node as a CUDA process would: listed, it would
    // be named as the culprit.
    {
        let mut command = rig.command_holding(&rig.device(0));
        command.args(["--web.listen-address", "127.0.0.1:0"]);
        let exporter = start(command);
        assert!(
            holds(exporter.child.id(), &rig.device(0)),
            "the exporter must hold the device for this test to mean anything"
        );
        let metrics = exporter.scrape();
        // The scan ran (it found the child) and left the exporter out.
        assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
        assert_eq!(metrics.value("vram_unlisted_holders", &[("gpu", "0")]), 1.0);
    }

    // `snapshot` records the raw scan, before any classification.
    let snapshot = Running::spawn(rig.command_holding(&rig.device(0)).arg("snapshot"));
    let snapshot_pid = snapshot.pid();
    let outcome = snapshot.finish(Duration::from_secs(30));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    let scanned: Vec<u64> = outcome.json()["observation"]["holder_scan"]["holders"]
        .as_array()
        .expect("the snapshot has a holder scan")
        .iter()
        .map(|holder| holder["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        scanned,
        [u64::from(child.pid)],
        "{snapshot_pid} is the snapshot"
    );

    // `check` (the served exporter is gone; to `check` it would be just another
    // process holding the node): its own PID appears nowhere, not even in a note.
    let check = Running::spawn(
        rig.command_holding(&rig.device(0))
            .args(["check", "--json"]),
    );
    let check_pid = check.pid();
    let outcome = check.finish(Duration::from_secs(30));
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    assert_eq!(
        holder_pids(&outcome.json()["gpus"][0]),
        [u64::from(child.pid)]
    );
    assert!(
        !outcome.stdout.contains(&format!("PID {check_pid} "))
            && !outcome.stdout.contains(&format!("\"pid\": {check_pid},")),
        "{}",
        outcome.stdout
    );
}

#[test]
fn scan_denied_permission_reports_itself_incomplete() {
    let rig = Rig::new();
    let (dead_owner, child) = settled_fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);
    // As root the exporter runs as nobody and may not read the root-owned child's
    // descriptors; as another user it still may not read PID 1's.
    let as_root = effective_uid() == 0;

    let metrics =
        start(rig.unprivileged_command(&["--web.listen-address", "127.0.0.1:0"])).scrape();
    assert_eq!(metrics.value("vram_holder_scan_complete", &[]), 0.0);

    let output = rig
        .unprivileged_command(&["check", "--json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    let scan = &document["holder_scan"];
    assert_eq!(scan["complete"], false, "{document:#}");
    assert_eq!(scan["cut_short"], false);
    assert!(scan["permission_errors"].as_u64().unwrap() >= 1);
    if !as_root {
        return;
    }
    let gpu = &document["gpus"][0];
    assert_eq!(
        holder_pids(gpu),
        Vec::<u64>::new(),
        "{} is unreadable",
        child.pid
    );
    assert_eq!(gpu["verdict"]["finding"], "orphaned_holders_unknown");
    // The count of unreadable processes changes as other tests start and end theirs.
    let says_holders_may_be_missing = |sentence: &str| {
        sentence.starts_with(&format!(
            "GPU 0: 8.6 GiB held for exited PID {dead_owner}; no holder of its device file was found, but the descriptors of "
        )) && sentence.ends_with(
            " processes could not be read (run as root, or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE): a holder may be missing."
        )
    };
    let sentence = gpu["verdict"]["sentence"].as_str().unwrap();
    assert!(says_holders_may_be_missing(sentence), "{sentence}");
    assert_eq!(
        gpu["verdict"]["suggestion"],
        "sudo vram-exporter check --gpu 0"
    );

    let text = rig.unprivileged_command(&["check"]).output().unwrap();
    assert_eq!(text.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&text.stdout);
    let sentence = verdict_line(&stdout, 0);
    assert!(says_holders_may_be_missing(sentence), "{stdout}");
}

#[test]
fn holders_of_the_control_node_or_another_gpus_node_are_not_named_for_this_gpu() {
    let rig = Rig::new();
    let control_only = Holder::spawn(&rig.control_device());
    let other_gpu = Holder::spawn(&rig.device(1));
    wait_until_sleeping(&other_gpu);
    // GPU 0 is orphaned, so the scan runs; nothing holds GPU 0's own node.
    charged_to(&rig, nonexistent_pid());

    let document = check_json(&rig);
    let gpu0 = &document["gpus"][0];
    assert_eq!(holder_pids(gpu0), Vec::<u64>::new(), "{document:#}");
    assert_eq!(gpu0["verdict"]["finding"], "orphaned_unheld");
    // The scan did see the other GPU's holder, and files it under that GPU only.
    assert_eq!(
        document["gpus"][1]["unlisted_holders"],
        json!([expected_holder(other_gpu.pid, "S", &[1])])
    );
    for gpu in document["gpus"].as_array().unwrap() {
        assert!(!holder_pids(gpu).contains(&u64::from(control_only.pid)));
    }

    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    assert_eq!(metrics.value("vram_unlisted_holders", &[("gpu", "0")]), 0.0);
    assert_eq!(holder_info_pids(&metrics, "1"), [other_gpu.pid.to_string()]);
}

#[test]
fn holder_whose_main_thread_exited_is_found_through_its_threads() {
    // The pthread_exit trap: /proc/PID/fd is empty, the device is in a thread's list.
    let rig = Rig::new();
    let holder = Holder::zombie_main_thread(&rig.device(0));
    charged_to(&rig, nonexistent_pid());

    let document = check_json(&rig);
    let gpu0 = &document["gpus"][0];
    assert_eq!(holder_pids(gpu0), [u64::from(holder.pid)], "{document:#}");
    assert_eq!(gpu0["unlisted_holders"][0]["state"], "Z");
    assert_eq!(gpu0["verdict"]["finding"], "orphaned_held");
}
