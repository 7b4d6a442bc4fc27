//! `check --json`: the whole document of a fork-inherited orphan, field by field.

use super::describes_culprit;
use crate::helpers::*;
use serde_json::json;

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
