//! The table (each owner and holder with its PID, command, state and memory) and the
//! verdict sentence and exit status of each kind of GPU: idle, owned by a live process,
//! a fork orphan, an orphan no process holds or only a live owner holds, a blind
//! exporter's and a lost GPU's.

use super::{
    describes_culprit, exit_line, rows_after, table_of, HOLDER_COLUMNS, MIB, OWNER_COLUMNS,
};
use crate::helpers::*;
use serde_json::Value;

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
