//! Exit status 2: no NVML, a GPU index the host does not have, a replay file that cannot
//! be read.

use crate::helpers::*;
use serde_json::json;

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
