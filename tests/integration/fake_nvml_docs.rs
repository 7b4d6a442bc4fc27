//! docs/fake-nvml.md tells a contributor to run the exporter against the fake NVML in two
//! commands; this runs their equivalent (the library cargo built for the tests, a free
//! port) from the repository root, with the shipped scenario exactly as documented.

use crate::helpers::*;
use std::path::PathBuf;
use std::process::Command;

/// The shipped scenario, relative to the repository root as the doc gives it.
const SCENARIO: &str = "fake-nvml/examples/healthy-and-orphan.json";

/// The two commands, as the doc shows them.
const BUILD: &str = "cargo build -p fake-nvml";
const RUN: &str = "FAKE_NVML_SCENARIO=fake-nvml/examples/healthy-and-orphan.json cargo run -- --nvml.library target/debug/libfake_nvml.so";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The exporter as the second command starts it, from the repository root.
fn documented_command() -> Command {
    let mut command = Command::new(exporter_binary());
    command
        .current_dir(repo())
        .env("FAKE_NVML_SCENARIO", SCENARIO)
        .arg("--nvml.library")
        .arg(fake_nvml_library());
    command
}

#[test]
fn the_doc_gives_the_two_commands() {
    let doc = std::fs::read_to_string(repo().join("docs/fake-nvml.md")).unwrap();
    let block = doc
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a sh block in docs/fake-nvml.md");
    assert_eq!(block.lines().collect::<Vec<_>>(), [BUILD, RUN]);
    assert!(repo().join(SCENARIO).is_file());
}

#[test]
fn the_documented_commands_serve_a_healthy_gpu_and_an_orphan() {
    let mut command = documented_command();
    command.args(["--web.listen-address", "127.0.0.1:0"]);
    let exporter = start(command);
    let metrics = exporter.scrape();
    assert_promtool_clean(&metrics.text);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    for gpu in ["0", "1"] {
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", gpu)]), 1.0);
        assert_eq!(
            metrics.value(
                "vram_gpu_recovery_action",
                &[("gpu", gpu), ("action", "none")]
            ),
            1.0
        );
        assert_eq!(metrics.value("vram_gpu_mig_mode", &[("gpu", gpu)]), 0.0);
    }
    let orphaned =
        |gpu, reason| metrics.value("vram_orphaned_bytes", &[("gpu", gpu), ("reason", reason)]);
    assert_eq!(orphaned("0", "owner_gone"), 0.0);
    assert_eq!(orphaned("0", "unattributed"), 0.0);
    assert_eq!(orphaned("1", "owner_gone"), 9_229_565_952.0);
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "1"), ("state", "gone")]),
        1.0
    );

    // `check` with the same two variables explains it: something is orphaned.
    let output = documented_command().arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("4194304"), "{stdout}");
}
