//! The README and docs/fake-nvml.md tell a contributor to run the exporter against the
//! fake NVML in two commands, and `check` in a third; this runs them from the repository
//! root as printed: `cargo build --release -p fake-nvml`, then the exporter with the documented
//! scenario and the documented library path `target/debug/libfake_nvml.so`, on a free
//! port, scraped.

use crate::helpers::*;
use std::path::PathBuf;
use std::process::Command;

/// The shipped scenario, relative to the repository root as the doc gives it.
const SCENARIO: &str = "fake-nvml/examples/healthy-and-orphan.json";

/// The two commands, as the doc shows them.
const BUILD: &str = "cargo build --release -p fake-nvml";
const RUN: &str = "FAKE_NVML_SCENARIO=fake-nvml/examples/healthy-and-orphan.json cargo run --release -- --nvml.library target/release/libfake_nvml.so";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first `sh` block of the Markdown file `path` (relative to the repository root)
/// that builds the fake NVML, as lines.
fn sh_block_building_the_fake(path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    text.split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains(BUILD))
        .unwrap_or_else(|| panic!("{path} has no sh block with `{BUILD}`"))
        .lines()
        .map(str::to_string)
        .collect()
}

/// The second command, split as the shell splits it: the environment variable it sets
/// and the arguments after `cargo run --`.
fn documented_run() -> ((String, String), Vec<String>) {
    let (assignment, rest) = RUN.split_once(' ').unwrap();
    let (key, value) = assignment.split_once('=').unwrap();
    let args = rest
        .strip_prefix("cargo run --release -- ")
        .expect("the second command is `cargo run --release -- ...`")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    ((key.to_string(), value.to_string()), args)
}

/// The exporter as the second command starts it, from the repository root. It is the
/// binary these tests built rather than `cargo run`: `cargo run` builds the package
/// without its dev-dependencies, whose features differ, so it would relink
/// `target/debug/vram-exporter` under the feet of the tests running it meanwhile.
/// Everything else is as printed, the library path included.
fn documented_command() -> Command {
    let ((key, value), args) = documented_run();
    let mut command = Command::new(exporter_binary());
    command.current_dir(repo()).env(key, value).args(args);
    command
}

#[test]
fn the_doc_gives_the_two_commands() {
    assert_eq!(
        sh_block_building_the_fake("docs/fake-nvml.md"),
        [BUILD, RUN]
    );
    assert_eq!(
        sh_block_building_the_fake("README.md"),
        [BUILD, RUN],
        "the README's quick start shows the same two commands"
    );
    assert_eq!(documented_run().0 .1, SCENARIO);
    assert!(repo().join(SCENARIO).is_file());
}

#[test]
fn the_documented_commands_serve_a_healthy_gpu_and_an_orphan() {
    // The first command, as printed, from the repository root, into the default target
    // folder the second command's library path names (the release profile's: the
    // library the other tests load is the debug one, and they load a copy).
    let build = Command::new("sh")
        .arg("-c")
        .arg(BUILD)
        .current_dir(repo())
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run the documented build");
    assert!(
        build.status.success(),
        "`{BUILD}` failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let library = repo().join("target/release/libfake_nvml.so");
    assert!(
        library.is_file(),
        "`{BUILD}` did not leave {} where the doc says",
        library.display()
    );

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

    // `check` with the same variable and library explains it: something is orphaned.
    let output = documented_command().arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("4194304"), "{stdout}");
}

#[test]
fn a_missing_or_misspelled_scenario_variable_is_named_once() {
    let library = fake_nvml_library();
    let check = |scenario: Option<&str>| {
        let mut command = Command::new(exporter_binary());
        command
            .current_dir(repo())
            .env_remove("FAKE_NVML_SCENARIO")
            .args(["check", "--nvml.library"])
            .arg(&library);
        if let Some(scenario) = scenario {
            command.env("FAKE_NVML_SCENARIO", scenario);
        }
        let output = command.output().unwrap();
        // No scenario is a host without a driver: NVML is not available, exit 2.
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        String::from_utf8(output.stderr).unwrap()
    };
    let unset = check(None);
    let hints: Vec<&str> = unset
        .lines()
        .filter(|line| line.starts_with("fake-nvml: "))
        .collect();
    assert_eq!(
        hints,
        [format!("fake-nvml: FAKE_NVML_SCENARIO is not set, so there is no scenario and NVML answers as on a host without a driver (NVML_ERROR_DRIVER_NOT_LOADED): set it to a scenario file, e.g. FAKE_NVML_SCENARIO={SCENARIO} (docs/fake-nvml.md)")],
        "{unset}"
    );
    let misspelled = "fake-nvml/examples/healthy-and-orphans.json";
    let said = check(Some(misspelled));
    let hints: Vec<&str> = said
        .lines()
        .filter(|line| line.starts_with("fake-nvml: "))
        .collect();
    assert_eq!(
        hints,
        [format!("fake-nvml: FAKE_NVML_SCENARIO names {misspelled}, which does not exist, so NVML answers as on a host without a driver (NVML_ERROR_DRIVER_NOT_LOADED) until it does")],
        "{said}"
    );
}
