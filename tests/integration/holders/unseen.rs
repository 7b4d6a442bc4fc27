//! What the scan cannot read is never called gone nor blamed: a scan denied permission,
//! owners whose mappings cannot be read, and an exporter in its own PID namespace reading
//! the host's `/proc`.

use super::charged_to;
use crate::helpers::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

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
