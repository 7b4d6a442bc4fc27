//! Least privilege: the capabilities that let an exporter running as `nobody` see a
//! holder owned by root, measured with `setpriv` rather than assumed. Listing another
//! user's `/proc/PID/fd` takes CAP_DAC_READ_SEARCH; reading where its links point takes
//! CAP_SYS_PTRACE. Either alone leaves the scan incomplete, and it must say so.

use crate::helpers::*;
use serde_json::Value;

/// `check --json` as `nobody` with `capabilities`, against GPU 0's fork orphan.
fn check_as_nobody(rig: &Rig, capabilities: &[&str]) -> Value {
    let output = rig
        .command_as_nobody_with(capabilities, &["check", "--json", "--gpu", "0"])
        .output()
        .expect("run the exporter through setpriv");
    assert_eq!(
        output.status.code(),
        Some(1),
        "with {capabilities:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("check --json")
}

#[test]
fn dac_read_search_and_sys_ptrace_are_enough_and_each_alone_is_not() {
    let rig = Rig::new();
    // Spawned by this test, which runs as root: a holder nobody may not look into.
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));

    for capabilities in [&[][..], &["sys_ptrace"][..], &["dac_read_search"][..]] {
        let document = check_as_nobody(&rig, capabilities);
        let scan = &document["holder_scan"];
        assert_eq!(scan["complete"], false, "{capabilities:?}: {document:#}");
        assert!(
            scan["permission_errors"].as_u64().unwrap() >= 1,
            "{capabilities:?}: {scan}"
        );
        let gpu = &document["gpus"][0];
        assert_eq!(gpu["culprits"], serde_json::json!([]), "{capabilities:?}");
        assert_eq!(
            gpu["remedy"],
            serde_json::json!({
                "action": "cannot_tell",
                "reason": { "why": "scan_denied", "processes": scan["permission_errors"] },
            }),
            "{capabilities:?}: a holder may be missing, and the verdict must say so"
        );
    }

    let document = check_as_nobody(&rig, &["dac_read_search", "sys_ptrace"]);
    let scan = &document["holder_scan"];
    assert_eq!(scan["complete"], true, "{document:#}");
    assert_eq!(scan["permission_errors"], 0);
    let gpu = &document["gpus"][0];
    let pids: Vec<u64> = gpu["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|holder| holder["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids, [u64::from(child.pid)], "{gpu:#}");
    assert_eq!(gpu["culprits"][0]["user"], "root");
    // Reading the child's mappings took CAP_SYS_PTRACE too: it is named as a culprit.
    assert_eq!(
        gpu["culprits"][0]["mappings"]["gpus"],
        serde_json::json!([0])
    );
    assert_eq!(gpu["remedy"]["action"], "kill");
    assert!(gpu["verdict"]["suggestion"]
        .as_str()
        .unwrap()
        .starts_with(&format!(
            "kill {0}   # {0} is dataloader, started ",
            child.pid
        )));
}

#[test]
fn the_server_as_nobody_with_both_capabilities_scans_completely() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let exporter = start(rig.command_as_nobody_with(
        &["dac_read_search", "sys_ptrace"],
        &["--web.listen-address", "127.0.0.1:0"],
    ));
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_holder_scan_complete", &[]), 1.0);
    let pid = child.pid.to_string();
    assert_eq!(
        metrics.value("vram_holder_info", &[("gpu", "0"), ("pid", &pid)]),
        1.0,
        "{}",
        metrics.text
    );
}
