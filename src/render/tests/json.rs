//! `check --json`: the keys scripts read, and the commands as data.

use super::*;

#[test]
fn json_owners_say_state_and_detail_as_scripts_read_them() {
    let report = Host::idle()
        .used(3 * USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .owner(
            504,
            None,
            ProcessLookup::Unreadable {
                error: "permission denied".into(),
            },
        )
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(contained(
                cuda(432, &[0]).state('D'),
                Some(NamespaceInit::Exited { pid: 9 }),
            )),
        )
        .scanned()
        .report();
    let owners = &json_of(&report)["gpus"][0]["owners"];
    assert_eq!(
        owners[0],
        json!({ "pid": 503, "state": "gone", "detail": { "reason": "exited" }, "used_bytes": CHARGED_ONE_OWNER })
    );
    assert_eq!(
        owners[1],
        json!({
            "pid": 504,
            "state": "unknown",
            "detail": { "reason": "unreadable", "error": "permission denied" },
            "used_bytes": null,
        })
    );
    let live = &owners[2];
    assert_eq!(live["state"], "uninterruptible");
    assert!(live.get("detail").is_none(), "{live}");
    assert_eq!(live["container_exited"], true);
    assert_eq!(live["process"]["container_ended"], true);
    assert_eq!(
        live["process"]["pid_namespace_init"],
        json!({ "state": "exited", "pid": 9 })
    );
    assert_eq!(live["first_seen"]["comm"], "python3");
}

#[test]
fn json_keeps_nvml_and_the_scan_in_the_keys_scripts_read() {
    let report = fork_orphan().report();
    let document = json_of(&report);
    assert_eq!(document["nvml_up"], true);
    assert_eq!(document["nvml_error"], Value::Null);
    assert_eq!(document["driver_version"], "580.159.04");
    assert_eq!(
        document["holder_scan"],
        json!({ "complete": true, "cut_short": false, "permission_errors": 0, "duration_seconds": 0.001 })
    );
    let mut denied = fork_orphan();
    denied.scan_denied = 3;
    assert_eq!(json_of(&denied.report())["holder_scan"]["complete"], false);

    let mut observation = Host::idle().observation();
    observation.nvml = nvml_down("no driver");
    let document = json_of(&classify(&observation, &Settings::default()));
    assert_eq!(document["status"], "nvml_down");
    assert_eq!(document["nvml_up"], false);
    assert_eq!(document["nvml_error"], "no driver");
    assert_eq!(document["driver_version"], Value::Null);
}

#[test]
fn json_notes_name_the_bystanders_the_text_sets_apart() {
    let report = stuck_in_an_ended_container().report();
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(
        gpu["notes"],
        json!([
            { "note": "driver_asks", "action": "gpu_reset" },
            { "note": "culprits_container_ended", "pids": [524] },
            { "note": "bystanders_not_blamed", "pids": [467] },
        ])
    );
    assert_eq!(gpu["verdict"]["notes"].as_array().unwrap().len(), 3);
}

#[test]
fn json_instances_are_the_classifiers_with_their_words() {
    let report = mig_host(true)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let instances = json_of(&report)["gpus"][0]["instances"].clone();
    let orphaned = &instances[1];
    assert_eq!(orphaned["uuid"], "MIG-2");
    assert_eq!(orphaned["name"], "NVIDIA H200 MIG 1g.18gb");
    assert_eq!(orphaned["profile"], "1g.18gb");
    assert_eq!(orphaned["gpu_instance_id"], 2);
    assert_eq!(orphaned["status"], "measured");
    assert_eq!(orphaned["finding"], "orphaned");
    assert_eq!(json_pids(&orphaned["culprits"]), [524]);
    assert_eq!(orphaned["orphaned_bytes"], CHARGED_ONE_OWNER);
    assert!(orphaned["verdict"]["sentence"]
        .as_str()
        .unwrap()
        .starts_with(
            "GPU 0 MIG (GI 2, CI 0, 1g.18gb): 8.6 GiB (8,802 MiB) held for exited PID 503"
        ));
    assert_eq!(instances[0]["finding"], "idle");
}

#[test]
fn json_gives_the_suggested_commands_as_data_beside_the_line_check_prints() {
    let report = fork_orphan().report();
    let verdict = &json_of(&report)["gpus"][0]["verdict"];
    assert_eq!(
        verdict["suggestion"],
        "kill 524   # 524 is python3, started 2026-12-03 00:25:00 UTC; then: vram-exporter check --gpu 0 --wait 30s"
    );
    assert_eq!(
        verdict["commands"],
        json!([{ "program": "kill", "args": ["524"] }])
    );
    assert_eq!(
        verdict["then"],
        json!({ "program": "vram-exporter", "args": ["check", "--gpu", "0", "--wait", "30s"] })
    );
    assert_eq!(verdict["wait_seconds"], 30);

    // Where nothing is suggested, the verdict keeps its three keys.
    let idle = json_of(&Host::idle().report());
    assert_eq!(
        idle["gpus"][0]["verdict"],
        json!({ "sentence": "GPU 0: idle; nothing orphaned.", "notes": [], "suggestion": null })
    );
}
