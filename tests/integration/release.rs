//! What a release needs besides the code: the license the manifest declares, a crate
//! that holds what it needs and nothing else, a binary that names its revision, and an
//! image build that labels its source truthfully and leaves the developer's release
//! build as it was.

use crate::helpers::{repository, said};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

#[test]
fn the_license_is_the_apache_license_the_manifest_declares() {
    let manifest = fs::read_to_string(repository().join("Cargo.toml")).unwrap();
    assert!(manifest.contains("\nlicense = \"Apache-2.0\"\n"));
    let license = fs::read_to_string(repository().join("LICENSE")).unwrap();
    let lines: Vec<&str> = license.lines().map(str::trim).collect();
    assert_eq!(
        lines[..4],
        [
            "",
            "Apache License",
            "Version 2.0, January 2004",
            "http://www.apache.org/licenses/"
        ]
    );
    // The whole text: the nine sections and the appendix on how to apply it.
    for section in [
        "1. Definitions.",
        "2. Grant of Copyright License.",
        "3. Grant of Patent License.",
        "4. Redistribution.",
        "5. Submission of Contributions.",
        "6. Trademarks.",
        "7. Disclaimer of Warranty.",
        "8. Limitation of Liability.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ] {
        assert!(
            lines.iter().any(|line| line.starts_with(section)),
            "{section}"
        );
    }
    assert_eq!(license.lines().count(), 202);
}

#[test]
fn cargo_package_holds_what_the_crate_needs_and_nothing_else() {
    let output = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "--offline"])
        .current_dir(repository())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo package --list: {}",
        said(&output)
    );
    let listed: BTreeSet<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "LICENSE",
        "README.md",
        "build.rs",
        "build/revision.rs",
        "src/main.rs",
        "src/lib.rs",
    ] {
        assert!(listed.contains(needed), "{needed} missing from {listed:?}");
    }
    // What cargo adds itself, then the build's sources only: no tests, fixtures,
    // benches, fuzz targets, chart, manifests or the fake NVML.
    let extra: Vec<&String> = listed
        .iter()
        .filter(|file| !matches!(file.as_str(), ".cargo_vcs_info.json" | "Cargo.toml.orig"))
        .filter(|file| {
            !matches!(
                file.as_str(),
                "Cargo.toml" | "Cargo.lock" | "LICENSE" | "README.md" | "build.rs"
            )
        })
        .filter(|file| !file.starts_with("src/") && !file.starts_with("build/"))
        .collect();
    assert!(extra.is_empty(), "not needed in the crate: {extra:?}");
    // Every source file of the binary is in it.
    let mut pending = vec![repository().join("src")];
    while let Some(folder) = pending.pop() {
        for entry in fs::read_dir(folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(repository()).unwrap();
                let relative = relative.to_str().unwrap();
                assert!(listed.contains(relative), "{relative} missing");
            }
        }
    }
}

/// The `revision` label of `vram_build_info` in Prometheus text.
fn build_info_revision(metrics: &str) -> String {
    let line = metrics
        .lines()
        .find(|line| line.starts_with("vram_build_info{"))
        .unwrap_or_else(|| panic!("no vram_build_info in:\n{metrics}"));
    let start = line.find("revision=\"").expect("a revision label") + "revision=\"".len();
    line[start..][..line[start..].find('"').unwrap()].to_string()
}

#[test]
fn version_names_the_revision_that_build_info_carries() {
    let binary = env!("CARGO_BIN_EXE_vram-exporter");
    let version = Command::new(binary).arg("--version").output().unwrap();
    assert!(version.status.success(), "{}", said(&version));
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("vram.prom");
    let written = Command::new(binary)
        .arg("textfile")
        .arg("--replay")
        .arg(repository().join("examples/story-gpu2-orphaned.json"))
        .arg("--output")
        .arg(&file)
        .output()
        .unwrap();
    assert!(written.status.success(), "{}", said(&written));
    let revision = build_info_revision(&fs::read_to_string(&file).unwrap());
    assert!(!revision.is_empty());
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!(
            "vram-exporter {} (revision {revision})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn the_image_build_leaves_the_release_build_alone() {
    // The build script reruns, and the release profile rebuilds, whenever
    // VRAM_EXPORTER_REVISION differs from the last build's: build.sh must build with the
    // environment a plain `cargo build --release` has, and take the revision for its
    // label from the binary.
    let script = fs::read_to_string(repository().join("deploy/image/build.sh")).unwrap();
    let code: Vec<&str> = script
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect();
    assert!(
        !code
            .iter()
            .any(|line| line.contains("VRAM_EXPORTER_REVISION")),
        "build.sh sets VRAM_EXPORTER_REVISION"
    );
    assert!(code
        .iter()
        .any(|line| line.trim() == "cargo build --release --locked --bin vram-exporter"));
    assert!(code
        .iter()
        .any(|line| line.contains("\"$binary\" --version")));
}

/// `git -C dir args...` in a scratch repository.
fn git(dir: &Path, args: &[&str]) {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run git");
    assert!(output.status.success(), "git {args:?}: {}", said(&output));
}

#[test]
fn the_image_source_label_comes_from_the_origin_remote_or_is_left_out() {
    let scratch = tempfile::tempdir().unwrap();
    let checkout = scratch.path();
    fs::create_dir_all(checkout.join("deploy/image")).unwrap();
    fs::copy(
        repository().join("deploy/image/build.sh"),
        checkout.join("deploy/image/build.sh"),
    )
    .unwrap();
    fs::write(
        checkout.join("Cargo.toml"),
        "[package]\nversion = \"1.2.3\"\n",
    )
    .unwrap();
    git(checkout, &["init", "-q"]);
    let source = |url: Option<&str>| -> String {
        let mut command = Command::new(checkout.join("deploy/image/build.sh"));
        command
            .arg("--print-source")
            .env_remove("VRAM_EXPORTER_SOURCE_URL");
        if let Some(url) = url {
            command.env("VRAM_EXPORTER_SOURCE_URL", url);
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", said(&output));
        String::from_utf8(output.stdout).unwrap().trim().to_string()
    };
    // No remote: no address is made up.
    assert_eq!(source(None), "");
    git(
        checkout,
        &["remote", "add", "origin", "/srv/git/vram-exporter.git"],
    );
    assert_eq!(source(None), "", "a local path is no address");
    for (remote, address) in [
        (
            "git@gitlab.example.com:ops/vram-exporter.git",
            "https://gitlab.example.com/ops/vram-exporter",
        ),
        (
            "ssh://git@git.example.org:2222/gpu/vram-exporter.git",
            "https://git.example.org/gpu/vram-exporter",
        ),
        (
            "https://ci-user:token@github.example.com/gpu/vram-exporter.git",
            "https://github.example.com/gpu/vram-exporter",
        ),
        (
            "https://git.example.net/vram-exporter/",
            "https://git.example.net/vram-exporter",
        ),
    ] {
        git(checkout, &["remote", "set-url", "origin", remote]);
        assert_eq!(source(None), address, "{remote}");
    }
    // The packager's word wins.
    assert_eq!(
        source(Some("https://source.example.org/vram")),
        "https://source.example.org/vram"
    );
}
