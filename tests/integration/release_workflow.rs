//! The release a user downloads: `.github/workflows/release.yml`, linted with the pinned
//! actionlint (with Debian's shellcheck for its shell steps), builds with the scripts the
//! rest of the suite tests, and publishes the chart with the image it pushed as its
//! default; the chart of the repository names no image, and says what to set.

use crate::helm::{helm, render, tool, values_file, CHART, LOCAL_IMAGE};
use crate::helpers::{repository, require_tool, said};
use serde_norway::Value;
use std::fs;
use std::process::Command;

const WORKFLOW: &str = ".github/workflows/release.yml";

fn workflow() -> Value {
    let text = fs::read_to_string(repository().join(WORKFLOW)).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every `run:` of every job, in order.
fn run_steps(workflow: &Value) -> Vec<String> {
    workflow["jobs"]
        .as_mapping()
        .unwrap()
        .values()
        .flat_map(|job| job["steps"].as_sequence().unwrap().iter())
        .filter_map(|step| step["run"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn actionlint_finds_nothing_in_the_release_workflow() {
    let shellcheck = require_tool("shellcheck", "shellcheck");
    let output = tool("actionlint")
        .arg("-shellcheck")
        .arg(&shellcheck)
        .arg(WORKFLOW)
        .output()
        .unwrap();
    assert!(output.status.success(), "actionlint: {}", said(&output));
    // actionlint does look: a workflow with a mistake in an expression and in a shell
    // step is refused, so a clean run means something.
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let broken = scratch.path().join("broken.yml");
    fs::write(
        &broken,
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ github.nope }} $undefined_var\n",
    )
    .unwrap();
    let output = tool("actionlint")
        .arg("-shellcheck")
        .arg(&shellcheck)
        .arg(&broken)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success() && stdout.contains("nope") && stdout.contains("shellcheck"),
        "{}",
        said(&output)
    );
}

#[test]
fn the_release_builds_with_the_scripts_the_suite_tests_on_a_tag() {
    let workflow = workflow();
    // On a version tag, and on nothing else.
    assert_eq!(
        serde_norway::to_string(&workflow["on"]).unwrap().trim(),
        "push:\n  tags:\n  - v*"
    );
    let runs = run_steps(&workflow).join("\n");
    // The packages (tests/packages/test.sh), the image (image.rs) and the chart (the
    // test below) come from the suite's scripts, and nothing else builds them.
    for script in [
        "deploy/packages/build.sh --out dist --maintainer",
        "deploy/image/build.sh --binary target/release/vram-exporter",
        "deploy/chart/package.sh --image \"$IMAGE\"",
        "tests/tools.sh install helm",
    ] {
        assert!(runs.contains(script), "{WORKFLOW} does not run {script}");
    }
    for by_hand in [
        "cargo build",
        "cargo deb",
        "cargo generate-rpm",
        "helm package",
        "buildah bud",
    ] {
        assert!(
            !runs.contains(by_hand),
            "{WORKFLOW} builds with {by_hand} itself"
        );
    }
    // Both architectures, built on Debian 12 as the suite's binary is.
    let build = &workflow["jobs"]["build"];
    let arches: Vec<&str> = build["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|entry| entry["arch"].as_str().unwrap())
        .collect();
    assert_eq!(arches, ["amd64", "arm64"]);
    assert_eq!(build["container"]["image"], "debian:12");
    // It publishes the image under one name for both, the chart naming it, and the
    // files with their checksums.
    for published in [
        "buildah manifest push --all",
        "\"$helm\" push \"$chart\"",
        "sha256sum -- * > SHA256SUMS",
        "gh release create",
    ] {
        assert!(runs.contains(published), "{WORKFLOW} does not {published}");
    }
}

#[test]
fn helm_template_with_the_defaults_stops_with_the_line_that_says_what_to_set() {
    let output = helm(&["template", "vram-exporter", "charts/vram-exporter"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{}", said(&output));
    let line = stderr
        .lines()
        .find(|line| line.starts_with("Error: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains("image.repository is not set")
            && line.contains("--set image.repository=")
            && line.contains("docs/kubernetes.md"),
        "{line}"
    );
    // Set, it renders.
    let output = helm(
        &[
            &["template", "vram-exporter", "charts/vram-exporter"][..],
            &LOCAL_IMAGE,
        ]
        .concat(),
    );
    assert!(output.status.success(), "{}", said(&output));
}

#[test]
fn the_released_chart_names_the_published_image_and_needs_no_value() {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let helm_path = tool("helm").get_program().to_owned();
    let package = |image: &str| {
        Command::new(repository().join("deploy/chart/package.sh"))
            .args(["--image", image, "--out"])
            .arg(scratch.path())
            .env("HELM", &helm_path)
            .current_dir(repository())
            .output()
            .unwrap()
    };
    let output = package("ghcr.io/example/vram-exporter");
    assert!(output.status.success(), "{}", said(&output));
    let archive = String::from_utf8(output.stdout).unwrap().trim().to_string();
    assert!(archive.ends_with(&format!("vram-exporter-{}.tgz", env!("CARGO_PKG_VERSION"))));
    let rendered = helm(&["template", "vram-exporter", &archive]);
    assert!(rendered.status.success(), "{}", said(&rendered));
    let yaml = String::from_utf8(rendered.stdout).unwrap();
    assert!(
        yaml.contains(&format!(
            "image: ghcr.io/example/vram-exporter:{}\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{yaml}"
    );
    // The repository's chart is left as it was: it still names no image.
    let values = fs::read_to_string(repository().join("charts/vram-exporter/values.yaml")).unwrap();
    assert!(values.contains("\n  repository: \"\"\n"));
    // A name no registry takes is refused with the form it needs.
    let output = package("ghcr.io/Example/vram-exporter:1.0");
    assert_eq!(output.status.code(), Some(2), "{}", said(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("in lower case, without a tag"));
}

#[test]
fn the_packaged_chart_carries_everything_it_renders_from() {
    // A chart published to a repository is its .tgz alone: the rules and the dashboard
    // must be inside it, and render the same.
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = helm(&[
        "package",
        CHART,
        "--destination",
        scratch.path().to_str().unwrap(),
    ]);
    assert!(output.status.success(), "helm package: {}", said(&output));
    let archive = scratch
        .path()
        .join(format!("vram-exporter-{}.tgz", env!("CARGO_PKG_VERSION")));
    let values = values_file("all-on-values.yaml");
    assert_eq!(
        render(&archive, &["-f", &values]),
        render(&repository().join(CHART), &["-f", &values])
    );
}
