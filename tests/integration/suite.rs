//! The test suite's own entry point, `tests/run.sh`: before it installs anything it says
//! what it will install, and `--no-install` makes it install nothing, name what is
//! missing and stop.

use crate::helpers::{repository, said};
use std::process::Command;

#[test]
fn run_sh_with_no_install_names_what_is_missing_and_stops_having_installed_nothing() {
    // An empty tool cache: every pinned tool is missing. (A missing Debian package would
    // be named the same way; on this host none is.)
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let started = std::time::Instant::now();
    let output = Command::new(repository().join("tests/run.sh"))
        .arg("--no-install")
        .env("VRAM_EXPORTER_TOOLS", cache.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", said(&output));
    assert!(
        stderr.contains("tests/run.sh: --no-install: installing nothing, and these are missing:"),
        "{stderr}"
    );
    for tool in [
        "helm v",
        "kubernetes-validate ",
        "Prometheus Operator",
        "actionlint v",
        "cargo-deb ",
        "cargo-generate-rpm ",
    ] {
        assert!(
            stderr
                .lines()
                .any(|line| line.starts_with("tests/run.sh:   ") && line.contains(tool)),
            "{tool} is not named:\n{stderr}"
        );
    }
    assert!(!stderr.contains("FAILED"), "{stderr}");
    // It stopped before building or testing anything, and installed nothing.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    assert!(
        !stderr.contains("cargo fmt") && output.stdout.is_empty(),
        "{}",
        said(&output)
    );
}

#[test]
fn run_sh_says_what_it_will_install_before_it_installs() {
    let script = std::fs::read_to_string(repository().join("tests/run.sh")).unwrap();
    let said_at = script
        .find("\nsay_what_will_be_installed\n")
        .expect("it says what it installs");
    for install in [
        "\ninstall_missing_packages\n",
        "\ninstall_test_tools\n",
        "\ntest_packages\n",
    ] {
        let at = script
            .find(install)
            .unwrap_or_else(|| panic!("{install:?}"));
        assert!(said_at < at, "{install:?} runs before it is said");
    }
}
