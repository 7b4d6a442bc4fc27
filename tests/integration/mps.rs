//! A GPU shared through MPS, in the shapes the H200 showed (driver 580.159.04): a model
//! control daemon (its own session, started before every client, mapping the GPU's node
//! write-only and the control node read-only), its server (its child, mapping both
//! read-write, on NVML's compute list alone) and model clients (on the compute and MPS
//! lists). The daemon and the server are never culprits of a client's orphan: each test
//! reads the answer back through `check`, `check --json` and the metrics.

use crate::helpers::*;
use serde_json::{json, Value};

/// What NVML charged the MPS server on the H200.
const SERVER_BYTES: u64 = 69_206_016;
/// What it charged a live client holding 3 GiB.
const LIVE_CLIENT_BYTES: u64 = 3_860_856_832;
/// What it charged the client that allocated 4 GiB, forked and exited.
const DEAD_CLIENT_BYTES: u64 = 4_934_598_656;
/// v2 `used` with the server, the live client and the dead client's memory.
const USED_WITH_ORPHAN: u64 = 8_874_885_120;
/// v2 `used` once the orphan was freed: the server and the live client.
const USED_WITHOUT_ORPHAN: u64 = 3_939_434_496;

/// GPU 0 shared through MPS: the server on the compute list, each client in `clients`
/// on the compute and MPS lists with its bytes, `used` in use.
fn shared_gpu(rig: &Rig, server: u32, clients: &[(u32, u64)], used: u64) {
    let gpu = clients.iter().fold(
        Gpu::idle(0).used(used).process(server, Some(SERVER_BYTES)),
        |gpu, &(pid, bytes)| gpu.mps_client(pid, Some(bytes)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
}

/// The model daemon with its server and a live client, with GPU 0 listing the server and
/// the client.
fn mps_with_live_client(rig: &Rig) -> (Mps, Holder) {
    let mps = Model::mps_control_daemon(&rig.device(0)).spawn_with_mps_server(&rig.device(0));
    let client = Model::cuda("mps-client", &rig.device(0)).spawn();
    shared_gpu(
        rig,
        mps.server,
        &[(client.pid, LIVE_CLIENT_BYTES)],
        USED_WITHOUT_ORPHAN,
    );
    (mps, client)
}

/// `check --json`, expecting `status`.
fn check_json(rig: &Rig, status: i32) -> Value {
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(status), "{outcome:?}");
    outcome.json()
}

fn evidence_kinds(suspect: &Value) -> Vec<&str> {
    suspect["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|evidence| evidence["kind"].as_str().unwrap())
        .collect()
}

/// The owners `check --json` lists for GPU 0, as (PID, state), by PID.
fn owner_states(document: &Value) -> Vec<(u64, String)> {
    document["gpus"][0]["owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|owner| {
            (
                owner["pid"].as_u64().unwrap(),
                owner["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn sorted(mut pids: Vec<u64>) -> Vec<u64> {
    pids.sort_unstable();
    pids
}

/// The daemon and the server, listed apart as not blamed with why, in PID order (the
/// daemon started first).
fn assert_mps_parts_stand_apart(gpu: &Value, mps: &Mps) {
    let (daemon, server) = (u64::from(mps.daemon.pid), u64::from(mps.server));
    assert_eq!(
        pids_of(&gpu["bystanders"]),
        sorted(vec![daemon, server]),
        "{gpu:#}"
    );
    for bystander in gpu["bystanders"].as_array().unwrap() {
        assert_eq!(bystander["role"], "bystander");
        assert_eq!(bystander["comm"], "nvidia-cuda-mps");
        if bystander["pid"] == daemon {
            assert_eq!(
                evidence_kinds(bystander),
                [
                    "mps_control_daemon",
                    "maps_gpu_without_context",
                    "mps_command_name"
                ]
            );
            assert_eq!(bystander["evidence"][0]["server"], server);
            assert_eq!(bystander["evidence"][1]["access"], "write_only");
            assert_eq!(
                bystander["mappings"]["gpus_without_read_write"],
                json!({ "0": "write_only" })
            );
            assert_eq!(
                bystander["mappings"]["control_without_read_write"],
                "read_only"
            );
        } else {
            assert_eq!(
                evidence_kinds(bystander),
                ["mps_server", "mps_command_name"]
            );
            assert_eq!(bystander["evidence"][0]["daemon"], daemon);
            assert_eq!(bystander["ppid"], daemon);
        }
    }
    assert_eq!(
        gpu["notes"],
        json!([{ "note": "mps_not_blamed", "pids": sorted(vec![daemon, server]) }])
    );
}

#[test]
fn a_live_mps_client_is_owned_and_nothing_is_blamed() {
    let rig = Rig::new();
    let (mps, client) = mps_with_live_client(&rig);

    let document = check_json(&rig, 0);
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["finding"], "owned", "{document:#}");
    let mut expected = vec![
        (u64::from(client.pid), "running".to_string()),
        (u64::from(mps.server), "running".to_string()),
    ];
    expected.sort();
    assert_eq!(owner_states(&document), expected);
    for list in ["culprits", "bystanders", "undetermined"] {
        assert_eq!(gpu[list], json!([]), "{list}");
    }

    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        2.0
    );
    for role in ["culprit", "bystander", "undetermined"] {
        assert_eq!(
            metrics.value("vram_holder_processes", &[("gpu", "0"), ("role", role)]),
            0.0,
            "{role}"
        );
    }
}

#[test]
fn a_killed_mps_client_is_freed_and_nothing_is_orphaned() {
    let rig = Rig::new();
    let (mps, client) = mps_with_live_client(&rig);
    assert_eq!(check_json(&rig, 0)["gpus"][0]["finding"], "owned");

    // Killed, the client's memory is freed by the server at once (measured): NVML lists
    // the server alone.
    client.kill();
    shared_gpu(&rig, mps.server, &[], SERVER_BYTES + 9_240_576);
    let document = check_json(&rig, 0);
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["finding"], "owned", "{document:#}");
    assert_eq!(
        owner_states(&document),
        [(u64::from(mps.server), "running".to_string())]
    );
    assert_eq!(gpu["orphaned_bytes"], 0);
    assert_eq!(gpu["bystanders"], json!([]));
}

#[test]
fn a_fork_orphaned_mps_clients_child_alone_is_blamed_and_killed() {
    let rig = Rig::new();
    let (mps, live) = mps_with_live_client(&rig);
    // A served exporter that sees the MPS host before the client forks and exits.
    let before = rig.start(&[]);
    before.scrape();
    let (dead, mut children) =
        Model::cuda("mps-client", &rig.device(0)).fork_orphan(1, "mps-worker");
    let child = children.remove(0);
    shared_gpu(
        &rig,
        mps.server,
        &[(live.pid, LIVE_CLIENT_BYTES), (dead, DEAD_CLIENT_BYTES)],
        USED_WITH_ORPHAN,
    );

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["orphaned_bytes"], DEAD_CLIENT_BYTES, "{document:#}");
    assert_eq!(pids_of(&gpu["culprits"]), [u64::from(child.pid)]);
    assert_eq!(
        evidence_kinds(&gpu["culprits"][0]),
        ["maps_gpu", "inherited", "process_group_of", "session_of"]
    );
    assert_eq!(gpu["remedy"]["action"], "kill");
    assert_eq!(pids_of(&gpu["remedy"]["targets"]), [u64::from(child.pid)]);
    assert_mps_parts_stand_apart(gpu, &mps);

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    assert_eq!(kill_line(&text.stdout, 0), Some(child.pid.to_string()));
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!("still held by PID {} (mps-worker, ", child.pid))
            && sentence.ends_with(&format!("- killing {} should free it.", child.pid))
            && !sentence.contains(&format!("PID {} (", mps.daemon.pid))
            && !sentence.contains(&format!("PID {} (", mps.server)),
        "{sentence}"
    );
    let note = text
        .stdout
        .lines()
        .find(|line| line.starts_with("  note: Not blamed, the MPS control daemon and server"))
        .unwrap_or_else(|| panic!("{}", text.stdout));
    for (pid, why) in [
        (
            mps.daemon.pid,
            "the MPS control daemon: parent of MPS server PID",
        ),
        (
            mps.server,
            "the MPS server: on GPU 0's compute list and not its MPS list",
        ),
    ] {
        assert!(
            note.contains(&format!("PID {pid} (nvidia-cuda-mps, sleeping, ")) && note.contains(why),
            "{note}"
        );
    }
    assert!(
        note.contains("maps GPU 0's device file write-only: the driver is initialised but it holds no context"),
        "{note}"
    );

    // The exporter that saw the client alive and one started after it died agree.
    let after = rig.start(&[]);
    for metrics in [before.scrape(), after.scrape()] {
        let named: Vec<String> = metrics
            .find("vram_holder_info", &[("gpu", "0")])
            .iter()
            .map(|(_, labels, _)| labels["pid"].clone())
            .collect();
        assert_eq!(named, [child.pid.to_string()]);
        for (role, count) in [("culprit", 1.0), ("bystander", 2.0), ("undetermined", 0.0)] {
            assert_eq!(
                metrics.value("vram_holder_processes", &[("gpu", "0"), ("role", role)]),
                count,
                "{role}"
            );
        }
    }

    // Killing the child frees the memory (measured: 0.11 s); NVML then lists the server
    // and the live client alone.
    child.kill();
    shared_gpu(
        &rig,
        mps.server,
        &[(live.pid, LIVE_CLIENT_BYTES)],
        USED_WITHOUT_ORPHAN,
    );
    assert_eq!(check_json(&rig, 0)["gpus"][0]["finding"], "owned");
}

#[test]
fn the_mps_server_alone_holding_a_dead_clients_memory_asks_for_an_mps_restart() {
    let rig = Rig::new();
    let (mps, live) = mps_with_live_client(&rig);
    // A dead client NVML still lists, with no process left of it.
    let dead = nonexistent_pid();
    shared_gpu(
        &rig,
        mps.server,
        &[(live.pid, LIVE_CLIENT_BYTES), (dead, DEAD_CLIENT_BYTES)],
        USED_WITH_ORPHAN,
    );

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(gpu["culprits"], json!([]), "{document:#}");
    assert_eq!(
        gpu["remedy"],
        json!({
            "action": "restart_mps",
            "servers": [mps.server],
            "daemons": [mps.daemon.pid],
            "clients": [live.pid],
        })
    );
    assert_mps_parts_stand_apart(gpu, &mps);

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.ends_with(&format!(
            "no client process holds it, but the MPS server (PID {}) does: only restarting MPS frees it, which ends every client of MPS (on GPU 0: PID {}).",
            mps.server, live.pid
        )),
        "{sentence}"
    );
    let command = suggestion(&text.stdout, 0).unwrap_or_else(|| panic!("{}", text.stdout));
    assert!(
        command.starts_with("echo quit | nvidia-cuda-mps-control   # "),
        "{command}"
    );
    assert_eq!(kill_line(&text.stdout, 0), None);
    assert!(!text.stdout.contains("--gpu-reset"), "{}", text.stdout);

    // An exporter started after the client died says the same.
    let metrics = rig.start(&[]).scrape();
    assert!(metrics.find("vram_holder_info", &[("gpu", "0")]).is_empty());
    assert_eq!(
        metrics.value(
            "vram_holder_processes",
            &[("gpu", "0"), ("role", "bystander")]
        ),
        2.0
    );
}
