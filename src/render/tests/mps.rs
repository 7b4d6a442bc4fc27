//! MPS: what each renderer says of the control daemon, the server and their clients.

use super::*;

#[test]
fn under_mps_the_text_kills_the_child_alone_and_sets_the_daemon_and_server_apart() {
    let report = mps_fork_orphan().report();
    let words = verdict(&report.gpus[0]);
    assert_eq!(
        words.sentence,
        "GPU 0: 4.6 GiB (4,706 MiB) held for exited PID 479; still held by PID 500 (python3, sleeping, started 2026-12-03 00:00:34 UTC, user root, parent 1, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group and session of exited PID 479) - killing 500 should free it."
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("kill 500   # 500 is python3, started 2026-12-03 00:00:34 UTC; then: vram-exporter check --gpu 0 --wait 30s")
    );
    let [note] = words.notes.as_slice() else {
        panic!("{:#?}", words.notes)
    };
    assert!(
        note.starts_with(
            "Not blamed, the MPS control daemon and server, which serve every MPS client of GPU 0: PID 447 (nvidia-cuda-mps, sleeping, "
        ),
        "{note}"
    );
    assert_eq!(pids_named(note), [447, 466]);
    for reason in [
        "the MPS control daemon: parent of MPS server PID 466, listed by NVML on no GPU, leading its own session; killing it frees no client's memory and ends MPS for every client",
        "maps GPU 0's device file write-only: the driver is initialised but it holds no context",
        "the MPS server: on GPU 0's compute list and not its MPS list, which names the clients, child of MPS control daemon PID 447; it holds every client's context, and ending it ends MPS for every client",
    ] {
        assert!(note.contains(reason), "{reason}: {note}");
    }
    let table = gpu_table(&report.gpus[0]);
    let section = table
        .split("  the MPS control daemon and server (not blamed):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{table}"));
    let rows: Vec<&str> = section
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(rows, ["447", "466"]);
    assert!(!table.contains("without a context here"), "{table}");
}

#[test]
fn under_mps_a_dead_clients_memory_the_server_alone_holds_asks_for_an_mps_restart() {
    let report = mps_dead_client_without_heir().report();
    let words = verdict(&report.gpus[0]);
    assert_eq!(
        words.sentence,
        "GPU 0: 4.6 GiB (4,706 MiB) held for exited PID 479; no client process holds it, but the MPS server (PID 466) does: only restarting MPS frees it, which ends every client of MPS (on GPU 0: PID 449)."
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("echo quit | nvidia-cuda-mps-control   # as the user of MPS control daemon PID 447, with its CUDA_MPS_PIPE_DIRECTORY; ends MPS server PID 466 and every client of MPS (on GPU 0: PID 449); then start the daemon again (nvidia-cuda-mps-control -d) and: vram-exporter check --gpu 0 --wait 30s")
    );
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(
        gpu["remedy"],
        json!({ "action": "restart_mps", "servers": [466], "daemons": [447], "clients": [449] })
    );
    assert_eq!(
        gpu["notes"],
        json!([{ "note": "mps_not_blamed", "pids": [447, 466] }])
    );
}

#[test]
fn under_mps_json_and_prometheus_say_what_the_text_says() {
    let report = mps_fork_orphan().report();
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(json_pids(&gpu["culprits"]), [500]);
    assert_eq!(json_pids(&gpu["bystanders"]), [447, 466]);
    assert_eq!(json_pids(&gpu["remedy"]["targets"]), [500]);
    let daemon = &gpu["bystanders"][0];
    assert_eq!(
        daemon["evidence"],
        json!([
            { "kind": "mps_control_daemon", "server": 466 },
            { "kind": "maps_gpu_without_context", "access": "write_only" },
            { "kind": "mps_command_name" },
        ])
    );
    assert_eq!(
        daemon["mappings"]["gpus_without_read_write"],
        json!({ "0": "write_only" })
    );
    assert_eq!(
        daemon["mappings"]["control_without_read_write"],
        "read_only"
    );
    assert_eq!(
        gpu["bystanders"][1]["evidence"],
        json!([{ "kind": "mps_server", "daemon": 447 }, { "kind": "mps_command_name" }])
    );
    let samples = samples(&metrics_of(&report));
    let gpu_labels = [("gpu", "0"), ("uuid", "GPU-0")];
    for (role, count) in [("culprit", 1.0), ("bystander", 2.0), ("undetermined", 0.0)] {
        assert_eq!(
            value(
                &samples,
                "vram_holder_processes",
                &[gpu_labels[0], gpu_labels[1], ("role", role)]
            ),
            count,
            "{role}"
        );
    }
    let named: Vec<String> = find(&samples, "vram_holder_info", &gpu_labels)
        .iter()
        .map(|(_, labels, _)| labels[2].1.clone())
        .collect();
    assert_eq!(named, ["500"]);
}

#[test]
fn left_behind_workers_are_named_at_most_sixteen_per_gpu_and_counted_in_full() {
    use crate::classify::{Leader, Lineage, Relative};
    // Twenty workers of a server that the exporter saw exit.
    let mut host = Host::idle().used(20 * USED_ONE_OWNER / 4);
    for pid in 1000..1020 {
        let mut facts = cuda(pid, &[0]);
        facts.pgid = 900;
        facts.sid = 900;
        facts.lineage = Some(Lineage {
            parent: Relative {
                pid: 900,
                start_time_ticks: Some(90_000),
                comm: Some("api-server".into()),
                pgid: Some(900),
            },
            parent_exit_seen_unix_seconds: Some(1_764_930_000),
            group_leader: Leader::Alive,
            session_leader: Leader::Alive,
            spawned_worker: false,
            pipes_to_parent_closed: false,
        });
        host = host.owner(pid, Some(CHARGED_ONE_OWNER / 4), present(facts));
    }
    let report = host.scanned().report();
    let samples = samples(&metrics_of(&report));
    let named: Vec<_> = samples
        .iter()
        .filter(|(family, _, _)| family == "vram_left_behind_since_timestamp_seconds")
        .collect();
    assert_eq!(
        named.len(),
        crate::render::prometheus::MAX_HOLDER_SERIES_PER_GPU
    );
    assert!(named.iter().all(|(_, labels, seen)| {
        labels.contains(&("parent_pid".to_string(), "900".to_string())) && *seen == 1_764_930_000.0
    }));
    assert_eq!(
        value(&samples, "vram_left_behind_bytes", &[("gpu", "0")]),
        (20 * (CHARGED_ONE_OWNER / 4)) as f64
    );
}

#[test]
fn a_left_behind_worker_kill_cannot_reach_gets_no_kill_line() {
    use crate::classify::{Leader, Lineage, Relative};
    let mut facts = cuda(4242, &[0]);
    facts.local_pid = None;
    facts.pgid = 4200;
    facts.sid = 4200;
    facts.lineage = Some(Lineage {
        parent: Relative {
            pid: 1,
            start_time_ticks: Some(100),
            comm: Some("systemd".into()),
            pgid: Some(1),
        },
        parent_exit_seen_unix_seconds: None,
        group_leader: Leader::Gone,
        session_leader: Leader::Gone,
        spawned_worker: true,
        pipes_to_parent_closed: false,
    });
    let report = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(4242, Some(CHARGED_ONE_OWNER), present(facts))
        .scanned()
        .report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.ends_with("; no kill is suggested: they live in another PID namespace than this one, where kill cannot reach them: run check on the host."),
        "{}",
        words.sentence
    );
    assert_eq!(words.suggestion, None);
}
