//! `vram-exporter check`: the table and the one verdict sentence per GPU that a person
//! reads after `kill -9`, its JSON for scripts, its exit status, `--gpu` and `--wait`.

use crate::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Whether `sentence` describes the model fork-orphan child `pid` (named `dataloader`,
/// adopted by this test process) as the culprit of `dead_owner`'s memory, with its start
/// date and the evidence against it.
fn describes_culprit(sentence: &str, pid: u32, dead_owner: u32) -> bool {
    let user = user_name(effective_uid())
        .map(|name| format!(", user {name}"))
        .unwrap_or_default();
    let start = format!("still held by PID {pid} (dataloader, sleeping, started ");
    let evidence = format!(
        " UTC{user}, parent {}, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group and session of exited PID {dead_owner}) - killing {pid} should free it.",
        std::process::id()
    );
    sentence.contains(&start) && sentence.ends_with(&evidence)
}

/// The last line `check` prints: its exit status in words.
fn exit_line(code: u8) -> String {
    let meaning = match code {
        0 => "nothing orphaned",
        1 => "orphaned memory found",
        3 => "cannot tell: some memory cannot be judged",
        _ => "error",
    };
    format!("\nexit status {code}: {meaning}\n")
}

/// The table lines of one GPU: from its `GPU N  ` header up to the blank line.
fn table_of(stdout: &str, gpu: u32) -> Vec<&str> {
    let header = format!("GPU {gpu}  ");
    stdout
        .lines()
        .skip_while(|line| !line.starts_with(&header))
        .take_while(|line| !line.is_empty())
        .collect()
}

/// The rows of a table's section that starts with a `PID  COMMAND ...` header line,
/// split into cells.
fn rows_after<'a>(table: &[&'a str], header: &[&str]) -> Vec<Vec<&'a str>> {
    table
        .iter()
        .skip_while(|line| columns(line) != header)
        .skip(1)
        .take_while(|line| columns(line)[0].parse::<u32>().is_ok())
        .map(|line| columns(line))
        .collect()
}

const OWNER_COLUMNS: [&str; 4] = ["PID", "COMMAND", "STATE", "MEMORY"];
const HOLDER_COLUMNS: [&str; 4] = ["PID", "COMMAND", "STATE", "PARENT"];

#[test]
fn table_lists_each_owner_with_pid_command_state_and_memory() {
    let rig = Rig::new();
    let running = Holder::spawn(&rig.device(0));
    let stopped = Holder::spawn(&rig.device(0));
    let unmeasured = Holder::spawn(&rig.device(0));
    stopped.stop();
    let gone = nonexistent_pid();
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(CHARGED + 4 * GIB + 27 * MIB)
                    .process(running.pid, Some(CHARGED))
                    .process(stopped.pid, Some(4 * GIB))
                    .process(unmeasured.pid, None),
            )
            .gpu(Gpu::one_owner(1, gone))
            .into_json(),
    );

    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(1), "GPU 1 is orphaned: {outcome:?}");
    let gpu0 = table_of(&outcome.stdout, 0);
    assert_eq!(
        columns(gpu0[0]),
        [
            "GPU 0",
            "NVIDIA H200",
            "00000000:19:00.0",
            Gpu::uuid(0).as_str()
        ]
    );
    // Sizes of a GiB and more also in MiB, as nvidia-smi prints them.
    assert_eq!(
        columns(gpu0[1]),
        [
            "used 12.6 GiB (12,925 MiB)",
            "reserved 615.1 MiB",
            "free 127.2 GiB (130,230 MiB)",
            "total 140.4 GiB (143,771 MiB)"
        ]
    );
    // Rows come in PID order, whatever order NVML lists them in; the state is the
    // series' word, then the one ps users know where it differs.
    let mut expected = vec![
        (running.pid, "running (sleeping)", "8,802 MiB"),
        (stopped.pid, "stopped", "4,096 MiB"),
        (unmeasured.pid, "running (sleeping)", "n/a"),
    ];
    expected.sort();
    let expected: Vec<Vec<String>> = expected
        .into_iter()
        .map(|(pid, state, memory)| {
            vec![
                pid.to_string(),
                "cuda-job".into(),
                state.into(),
                memory.into(),
            ]
        })
        .collect();
    assert_eq!(
        rows_after(&gpu0, &OWNER_COLUMNS),
        expected,
        "{}",
        outcome.stdout
    );
    // Live owners hold the node, but they are its owners: no holder section.
    assert!(!gpu0.iter().any(|line| line.contains("holding")));

    let gpu1 = table_of(&outcome.stdout, 1);
    assert_eq!(
        rows_after(&gpu1, &OWNER_COLUMNS),
        [[gone.to_string().as_str(), "-", "gone", "8,802 MiB"]]
    );

    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 12.6 GiB (12,898 MiB) owned by 3 live processes; nothing orphaned."
    );
    for note in [
        format!(
            "  note: PID {0} (cuda-job) is stopped: its memory stays allocated until it is continued (kill -CONT {0}) or killed.",
            stopped.pid
        ),
        format!(
            "  note: NVML cannot report the memory of PID {} (cuda-job).",
            unmeasured.pid
        ),
    ] {
        assert!(
            outcome.stdout.lines().any(|line| line == note),
            "missing {note:?}:\n{}",
            outcome.stdout
        );
    }
}

#[test]
fn idle_gpu_verdict_is_idle_and_exit_status_0() {
    let rig = Rig::new();
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        table_of(&outcome.stdout, 0)[2],
        "  no processes listed by NVML"
    );
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: idle; nothing orphaned."
    );
    // No exporter serves here: check says once that it judges from its own look alone.
    assert_eq!(
        outcome.stderr,
        Rig::no_state_warning(&rig.state_directory())
    );
}

#[test]
fn live_owner_verdict_names_its_memory_and_exit_status_0() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 8.6 GiB (8,802 MiB) owned by 1 live process; nothing orphaned."
    );
    assert!(!outcome.stdout.contains("suggested:"), "{}", outcome.stdout);
    assert!(
        outcome.stdout.ends_with(&exit_line(0)),
        "{}",
        outcome.stdout
    );
}

#[test]
fn fork_inherited_orphan_verdict_says_which_pid_to_kill() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");

    let table = table_of(&outcome.stdout, 0);
    assert_eq!(
        rows_after(&table, &OWNER_COLUMNS),
        [[dead_owner.to_string().as_str(), "-", "gone", "8,802 MiB"]]
    );
    assert!(table.contains(&"  holding it with a context (the culprits):"));
    assert_eq!(
        rows_after(&table, &HOLDER_COLUMNS),
        [[
            child.pid.to_string().as_str(),
            "dataloader",
            "sleeping",
            std::process::id().to_string().as_str()
        ]]
    );

    let sentence = verdict_line(&outcome.stdout, 0);
    assert!(
        sentence.starts_with(&format!(
            "GPU 0: 8.6 GiB (8,802 MiB) held for exited PID {dead_owner}; "
        )) && describes_culprit(sentence, child.pid, dead_owner),
        "{sentence}"
    );
    // The kill line names the process with its start, as a PID alone may name another.
    let suggestion = format!(
        "\n  suggested: kill {0}   # {0} is dataloader, started ",
        child.pid
    );
    assert!(outcome.stdout.contains(&suggestion), "{}", outcome.stdout);
    assert!(
        outcome
            .stdout
            .contains(" UTC; then: vram-exporter check --gpu 0 --wait 30s\n"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome.stdout.ends_with(&exit_line(1)),
        "{}",
        outcome.stdout
    );
}

#[test]
fn orphan_that_no_process_holds_can_only_be_freed_by_a_gpu_reset() {
    let rig = Rig::new();
    let dead_owner = nonexistent_pid();
    let story = 76_107 * MIB;
    rig.write_scenario(
        &Gpus::new()
            // NVML still charges a PID that no longer exists.
            .gpu(Gpu::one_owner(0, dead_owner))
            // NVML charges nobody at all: the story's GPU 2.
            .gpu(Gpu::idle(1).used(story))
            .into_json(),
    );
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        format!("GPU 0: 8.6 GiB (8,802 MiB) held for exited PID {dead_owner}; no process holds GPU 0's device file: only a GPU reset can free it.")
    );
    assert_eq!(
        verdict_line(&outcome.stdout, 1),
        "GPU 1: 74.3 GiB (76,107 MiB) held but charged to no process; no process holds GPU 1's device file: only a GPU reset can free it."
    );
    for gpu in 0..2 {
        assert!(
            outcome.stdout.contains(&format!(
                "\n  suggested: nvidia-smi --gpu-reset -i {gpu}   # as root, once no process uses the GPU (stop vram-exporter itself, nvidia-persistenced, DCGM and other agents holding it); it ends every MIG instance, and on NVSwitch systems the GPUs reset together\n"
            )),
            "{}",
            outcome.stdout
        );
    }
}

#[test]
fn orphan_held_only_by_a_live_owner_says_stopping_it_may_free_it() {
    // The dead owner's child became a CUDA user itself: NVML lists it, so it is an owner
    // and no candidate, yet it may hold the dead owner's context too.
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(2 * USED)
                    .process(dead_owner, Some(CHARGED))
                    .process(child.pid, Some(CHARGED)),
            )
            .into_json(),
    );
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        format!(
            "GPU 0: 8.6 GiB (8,802 MiB) held for exited PID {dead_owner}; no other process holds GPU 0's device file, but its live owner (PID {}) may hold the exited owner's context too: stopping it may free it; otherwise only a GPU reset can.",
            child.pid
        )
    );
    assert!(
        !outcome.stdout.contains("--gpu-reset"),
        "{}",
        outcome.stdout
    );
}

#[test]
fn blind_exporter_warns_and_calls_no_memory_orphaned() {
    let rig = Rig::new();
    let procfs = rig.blind_procfs();
    let used = 4 * GIB + 9 * MIB;
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0).used(used)).into_json());
    let outcome = rig.run(&[
        "check",
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs.to_str().unwrap(),
    ]);
    // Memory it cannot attribute is neither "orphaned" nor "fine": exit status 3.
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stdout.starts_with("warning: not in the host PID namespace: NVML hides other namespaces' processes, so memory without a visible owner is not called orphaned.\n\n"),
        "{}",
        outcome.stdout
    );
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: cannot tell: 4.0 GiB (4,105 MiB) is charged to no visible process, and this process cannot see other PID namespaces' processes; nothing is called orphaned."
    );
    assert!(
        outcome.stdout.ends_with(&exit_line(3)),
        "{}",
        outcome.stdout
    );
    assert!(outcome.stdout.contains(
        "\n  note: 4.0 GiB (4,105 MiB) is charged to no visible process, but this process is not in the host PID namespace, where NVML hides other namespaces' processes: not called orphaned.\n"
    ), "{}", outcome.stdout);

    let document = rig
        .run(&[
            "check",
            "--json",
            "--test.procfs-stand-in",
            "--path.procfs",
            procfs.to_str().unwrap(),
        ])
        .json();
    assert_eq!(document["host_pid_namespace"], false);
    assert_eq!(document["gpus"][0]["unattributed_bytes"], used);
    assert_eq!(document["gpus"][0]["orphaned_unattributed_bytes"], 0);
    assert_eq!(document["orphaned_bytes"], 0);
    assert_eq!(document["gpus"][0]["finding"], "cannot_tell");
    assert_eq!(document["status"], "cannot_tell");
}

#[test]
fn lost_gpu_verdict_says_its_memory_is_unknown() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0))
            .gpu(Gpu::idle(1).error("nvmlDeviceGetMemoryInfo_v2", "GpuLost"))
            .into_json(),
    );
    let outcome = rig.run(&["check"]);
    // Nothing orphaned among the GPUs it could read is not "nothing orphaned": cannot tell.
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert_eq!(
        outcome.stderr,
        Rig::no_state_warning(&rig.state_directory())
    );
    assert!(
        outcome.stdout.ends_with(&exit_line(3)),
        "{}",
        outcome.stdout
    );
    assert_eq!(table_of(&outcome.stdout, 1)[1], "  (no readings)");
    let verdict = verdict_line(&outcome.stdout, 1);
    assert!(
        verdict.starts_with("GPU 1: cannot tell: NVML cannot read it (gpu_lost: ")
            && verdict.ends_with("); its memory is unknown."),
        "{verdict}"
    );
    assert!(outcome.stdout.contains("\n  note: A lost GPU or one that needs a reset answers again only after a reset, once every process using it has stopped.\n"));
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: idle; nothing orphaned."
    );

    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(document["gpus"][1]["error"], "gpu_lost");
    assert_eq!(document["gpus"][1]["memory"], Value::Null);
    assert_eq!(document["gpus"][1]["status"], "cannot_tell");
    assert_eq!(document["status"], "cannot_tell");

    // An orphan elsewhere is still the answer: exit status 1, not 3.
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED))
            .gpu(Gpu::idle(1).error("nvmlDeviceGetMemoryInfo_v2", "GpuLost"))
            .into_json(),
    );
    assert_eq!(rig.run(&["check"]).status, Some(1));
}

#[test]
fn json_document_of_a_fork_inherited_orphan_field_by_field() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::idle(1))
            .into_json(),
    );
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let mut document = outcome.json();

    let duration = document["holder_scan"]["duration_seconds"].take();
    assert!(duration.as_f64().unwrap() > 0.0, "{duration}");
    // The child started moments ago; its date comes from the boot time and its ticks.
    let culprit = &mut document["gpus"][0]["culprits"][0];
    let started = culprit
        .as_object_mut()
        .unwrap()
        .remove("started_unix_seconds")
        .and_then(|started| started.as_u64())
        .expect("the culprit's start date");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(started) < 120, "started {started}, now {now}");
    let target = &mut document["gpus"][0]["remedy"]["targets"][0];
    assert_eq!(
        target
            .as_object_mut()
            .unwrap()
            .remove("started_unix_seconds"),
        Some(json!(started))
    );
    let verdict = document["gpus"][0]["verdict"].take();
    assert!(describes_culprit(
        verdict["sentence"].as_str().unwrap(),
        child.pid,
        dead_owner
    ));
    assert_eq!(verdict["notes"], json!([]));
    let empty_states = json!({
        "running": { "processes": 0, "bytes": 0 },
        "stopped": { "processes": 0, "bytes": 0 },
        "uninterruptible": { "processes": 0, "bytes": 0 },
        "zombie": { "processes": 0, "bytes": 0 },
        "killed": { "processes": 0, "bytes": 0 },
        "exiting": { "processes": 0, "bytes": 0 },
        "gone": { "processes": 0, "bytes": 0 },
        "unknown": { "processes": 0, "bytes": 0 },
    });
    let mut gone_state = empty_states.clone();
    gone_state["gone"] = json!({ "processes": 1, "bytes": CHARGED });
    let uid = effective_uid();
    let (pgid, sid) = process_group_and_session(child.pid);
    let ticks = start_time_ticks(child.pid);
    let cuda_files = json!({ "status": "read", "gpus": [0], "control": true, "uvm": true });
    let mut culprit = json!({
        "pid": child.pid,
        "start_time_ticks": ticks,
        "comm": "dataloader",
        "state": "sleeping",
        // This test process adopted it: Holder::fork_orphan makes it a child subreaper
        // (a real host would show 1 or a session manager).
        "ppid": std::process::id(),
        "pgid": pgid,
        "sid": sid,
        "threads": 1,
        "uid": uid,
        "descriptors": cuda_files,
        "mappings": { "status": "read", "gpus": [0], "control": true },
        "role": "culprit",
        "evidence": [
            { "kind": "maps_gpu" },
            { "kind": "inherited" },
            { "kind": "process_group_of", "pid": dead_owner },
            { "kind": "session_of", "pid": dead_owner },
        ],
    });
    if let Some(user) = user_name(uid) {
        culprit["user"] = json!(user);
    }
    let mut expected = json!({
        "status": "orphaned",
        "nvml_up": true,
        "nvml_error": null,
        "driver_version": "580.159.04",
        "host_pid_namespace": true,
        "procfs_view": "own",
        "holder_scan": {
            "complete": true,
            "cut_short": false,
            "permission_errors": 0,
            "duration_seconds": null,
        },
        "orphaned_bytes": CHARGED,
        "gpus": [
            {
                "index": 0,
                "uuid": Gpu::uuid(0),
                "name": "NVIDIA H200",
                "pci_bus_id": "00000000:19:00.0",
                "minor": 0,
                "status": "orphaned",
                "error": null,
                "memory": {
                    "total": TOTAL,
                    "reserved": RESERVED,
                    "used": USED,
                    "free": TOTAL - RESERVED - USED,
                },
                "finding": "orphaned",
                "owners": [
                    {
                        "pid": dead_owner,
                        "state": "gone",
                        "detail": { "reason": "exited" },
                        "used_bytes": CHARGED,
                    },
                ],
                "owners_by_state": gone_state,
                "orphaned_owner_gone_bytes": CHARGED,
                "orphaned_unattributed_bytes": 0,
                "unattributed_bytes": 0,
                "orphaned_bytes": CHARGED,
                "culprits": [culprit],
                "bystanders": [],
                "undetermined": [],
                "left_behind": [],
                "left_behind_bytes": 0,
                "possibly_left_behind_bytes": 0,
                "remedy": {
                    "action": "kill",
                    "targets": [
                        { "pid": child.pid, "start_time_ticks": ticks, "comm": "dataloader" },
                    ],
                },
                "notes": [],
                "verdict": null,
            },
            {
                "index": 1,
                "uuid": Gpu::uuid(1),
                "name": "NVIDIA H200",
                "pci_bus_id": "00000000:1a:00.0",
                "minor": 1,
                "status": "clear",
                "error": null,
                "memory": {
                    "total": TOTAL,
                    "reserved": RESERVED,
                    "used": 0,
                    "free": TOTAL - RESERVED,
                },
                "finding": "idle",
                "owners": [],
                "owners_by_state": empty_states,
                "orphaned_owner_gone_bytes": 0,
                "orphaned_unattributed_bytes": 0,
                "unattributed_bytes": 0,
                "orphaned_bytes": 0,
                "culprits": [],
                "bystanders": [],
                "undetermined": [],
                "left_behind": [],
                "left_behind_bytes": 0,
                "possibly_left_behind_bytes": 0,
                "remedy": { "action": "none" },
                "notes": [],
                "verdict": {
                    "sentence": "GPU 1: idle; nothing orphaned.",
                    "notes": [],
                    "suggestion": null,
                },
            },
        ],
    });
    // No exporter serves here: the look went by no witness state, and says why.
    let state = rig.state_directory().join("witness.json");
    expected["witness"] = json!({
        "path": state,
        "no_state": { "reason": "missing", "path": state },
    });
    assert_eq!(document, expected);
}

#[test]
fn exit_status_2_when_nvml_is_missing() {
    let rig = Rig::new();
    let missing = rig.dir.path().join("nowhere/libnvidia-ml.so.1");
    let outcome = rig.run(&["check", "--nvml.library", missing.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert_eq!(outcome.stdout, "");
    let last = outcome.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("vram-exporter: NVML is not available: cannot load NVML from "),
        "{}",
        outcome.stderr
    );
    // What was tried, what the loader said and what to do; not nvml-wrapper's "a
    // libloading error occurred".
    assert!(
        last.contains(&format!(
            "cannot load NVML from {0} (the path --nvml.library gives): {0}: cannot open shared object file: No such file or directory; point --nvml.library at the NVIDIA driver's libnvidia-ml.so.1",
            missing.display()
        )),
        "{last}"
    );
    assert!(!outcome.stderr.contains("libloading"), "{}", outcome.stderr);
    // A script still gets its document, with the reason in it.
    let outcome = rig.run(&[
        "check",
        "--json",
        "--nvml.library",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    let document = outcome.json();
    assert_eq!(document["status"], "nvml_down");
    assert_eq!(document["nvml_up"], false);
    assert!(document["nvml_error"]
        .as_str()
        .unwrap()
        .starts_with("cannot load NVML from "));
    assert_eq!(document["gpus"], json!([]));
}

#[test]
fn exit_status_2_for_a_gpu_index_the_host_does_not_have() {
    let rig = Rig::new();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    let outcome = rig.run(&["check", "--gpu", "7"]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert_eq!(outcome.stdout, "");
    assert_eq!(
        outcome.stderr,
        "vram-exporter: there is no GPU 7; this host has 2 (indices 0 to 1)\n"
    );
}

#[test]
fn exit_status_2_for_an_unreadable_replay_file() {
    let rig = Rig::new();
    let missing = rig.dir.path().join("no-such-snapshot.json");
    let outcome = rig.run(&["check", "--replay", missing.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert_eq!(outcome.stdout, "");
    // One line that names the file, not a word about NVML.
    assert_eq!(outcome.stderr.lines().count(), 1, "{}", outcome.stderr);
    assert!(
        outcome.stderr.starts_with("vram-exporter: ")
            && outcome
                .stderr
                .contains(&format!("cannot read snapshot {}", missing.display()))
            && !outcome.stderr.contains("NVML"),
        "{}",
        outcome.stderr
    );
    // The server refuses to start on it rather than serving NVML as down.
    let served = rig.run(&[
        "--replay",
        missing.to_str().unwrap(),
        "--web.listen-address",
        "127.0.0.1:0",
    ]);
    assert_eq!(served.status, Some(2), "{served:?}");
    assert!(
        served.stderr.contains("cannot read snapshot"),
        "{}",
        served.stderr
    );

    let garbage = rig.dir.path().join("garbage.json");
    std::fs::write(&garbage, "not json").unwrap();
    let outcome = rig.run(&["check", "--replay", garbage.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("is not a vram-exporter snapshot"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn gpu_flag_narrows_the_tables_the_verdicts_and_the_exit_status() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, nonexistent_pid()))
            .gpu(Gpu::idle(1))
            .gpu(Gpu::idle(2))
            .into_json(),
    );

    let healthy = rig.run(&["check", "--gpu", "1"]);
    assert_eq!(healthy.status, Some(0), "GPU 0's orphan is not asked about");
    assert_eq!(
        verdict_line(&healthy.stdout, 1),
        "GPU 1: idle; nothing orphaned."
    );
    for other in ["GPU 0", "GPU 2"] {
        assert!(!healthy.stdout.contains(other), "{}", healthy.stdout);
    }

    let both = rig.run(&["check", "--gpu", "2", "--gpu", "0"]);
    assert_eq!(both.status, Some(1));
    assert!(verdict_line(&both.stdout, 0).contains("held for exited PID"));
    verdict_line(&both.stdout, 2);
    assert!(!both.stdout.contains("GPU 1"), "{}", both.stdout);

    let document = rig.run(&["check", "--json", "--gpu", "1"]).json();
    let indices: Vec<&Value> = document["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gpu| &gpu["index"])
        .collect();
    assert_eq!(indices, [&json!(1)]);
    // The total counts the GPUs shown, not the host.
    assert_eq!(document["orphaned_bytes"], 0);
}

#[test]
fn wait_returns_0_once_the_holder_dies_and_the_driver_frees_the_memory() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let check = rig.spawn(&["check", "--wait", "30s", "--wait.interval", "50ms"]);
    wait_until(
        "check has printed its first verdict and polls",
        Duration::from_secs(20),
        || check.stdout().contains("should free it.") && check.stderr().contains("waiting: "),
    );
    assert!(
        check.stderr().contains("waiting: 8.6 GiB still orphaned ("),
        "{}",
        check.stderr()
    );

    // What happens on a real host: the holder dies, and the driver frees the memory and
    // drops the dead PID from its list.
    child.kill();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());

    let outcome = check.finish(Duration::from_secs(20));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    let freed = outcome
        .stderr
        .lines()
        .find(|line| line.starts_with("orphaned memory freed after "))
        .unwrap_or_else(|| panic!("no freed line:\n{}", outcome.stderr));
    assert!(freed.ends_with('s'), "{freed}");
    // The first look (orphaned) and the last (idle), in that order.
    let first = outcome.stdout.find("should free it.").unwrap();
    let last = outcome
        .stdout
        .rfind("GPU 0: idle; nothing orphaned.")
        .unwrap_or_else(|| panic!("no final verdict:\n{}", outcome.stdout));
    assert!(first < last);
    assert!(
        outcome
            .stdout
            .ends_with(&format!("GPU 0: idle; nothing orphaned.\n{}", exit_line(0))),
        "{}",
        outcome.stdout
    );
}

#[test]
fn wait_returns_1_when_the_time_runs_out_with_the_holder_alive() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let outcome = rig.run(&["check", "--wait", "1s"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let still = outcome
        .stderr
        .lines()
        .find(|line| line.starts_with("8.6 GiB still orphaned after "))
        .unwrap_or_else(|| panic!("no final progress line:\n{}", outcome.stderr));
    let seconds: f64 = still
        .trim_start_matches("8.6 GiB still orphaned after ")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(seconds >= 1.0, "{still}");
    let tail = format!(
        " UTC; then: vram-exporter check --gpu 0 --wait 30s\n{}",
        exit_line(1)
    );
    assert!(outcome.stdout.ends_with(&tail), "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains(&format!(
            "- killing {} should free it.\n  suggested: kill {} ",
            child.pid, child.pid
        )),
        "{}",
        outcome.stdout
    );
}

#[test]
fn wait_returns_at_once_when_nothing_is_orphaned() {
    // "At once" is after the first look: one collection, no sleep between looks. A wait
    // interval of 10 s makes any sleep of one interval overshoot the bound below, and the
    // fake NVML's call log counts the looks (one memory call per look at the one GPU).
    // Measured here: 0.03 to 0.18 s, with the load average at 12 on 2 cores; 5 s leaves
    // room for a slower machine and is still half of one interval.
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let started = std::time::Instant::now();
    let outcome = Outcome::from(
        rig.command()
            .env("FAKE_NVML_CALL_LOG", &calls)
            .args(["check", "--wait", "30s", "--wait.interval", "10s"])
            .output()
            .unwrap(),
    );
    let elapsed = started.elapsed();
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert!(
        elapsed < Duration::from_secs(5),
        "a wait with nothing orphaned took {elapsed:?}"
    );
    let looks = std::fs::read_to_string(&calls)
        .unwrap()
        .lines()
        .filter(|call| *call == "nvmlDeviceGetMemoryInfo_v2")
        .count();
    assert_eq!(looks, 1, "one look at the GPU, then the answer");
    assert_eq!(
        outcome.stderr,
        Rig::no_state_warning(&rig.state_directory()),
        "no progress lines"
    );
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: idle; nothing orphaned."
    );
}
