//! `vram_build_info{revision}`: the build script's revision finder run against scratch
//! git repositories (a clean commit, an edited source, an edited document, a package
//! inside another repository, no repository at all), and the binary these tests run
//! reporting the revision of the checkout it was built from.

use crate::helpers::repository;
#[path = "../../build/revision.rs"]
mod revision;

use crate::helpers::*;
use std::fs;
use std::path::Path;
use std::process::Command;

/// `git -C dir args...` for setting up a scratch repository; fails the test on error.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(require_tool("git", "git"))
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args(args)
        .output()
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// A package folder with the files the binary is built from, and a README.
fn package(dir: &Path) {
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::write(dir.join("Cargo.toml"), "[package]\nname = \"scratch\"\n").unwrap();
    fs::write(dir.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(dir.join("README.md"), "scratch\n").unwrap();
}

fn commit_all(dir: &Path, message: &str) -> String {
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}

#[test]
fn revision_is_git_short_hash_dirty_when_sources_changed_and_unknown_without_git() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("package");
    package(&dir);

    // A source tarball: no repository.
    let found = revision::find(&dir, None);
    assert_eq!(found.value, "unknown");
    assert!(found.watch.is_empty(), "{:?}", found.watch);
    assert_eq!(
        revision::find(&dir, Some("v1.2.3-7-gabc")).value,
        "v1.2.3-7-gabc"
    );
    assert_eq!(revision::find(&dir, Some("  ")).value, "unknown");

    git(&dir, &["init", "-q", "-b", "main"]);
    let first = commit_all(&dir, "first");
    let found = revision::find(&dir, None);
    assert_eq!(found.value, &first[..12]);
    // Every watched path exists (cargo reruns a build script on every build when one
    // does not), and they include HEAD and the branch's folder.
    for path in &found.watch {
        assert!(
            path.exists(),
            "watches {} which does not exist",
            path.display()
        );
    }
    let git_dir = dir.join(".git");
    assert!(
        found.watch.contains(&git_dir.join("HEAD")),
        "{:?}",
        found.watch
    );
    // The branch's own ref, not the folder of every branch's.
    assert!(
        found.watch.contains(&git_dir.join("refs/heads/main")),
        "{:?}",
        found.watch
    );
    assert!(
        !found.watch.contains(&git_dir.join("refs/heads")),
        "{:?}",
        found.watch
    );
    assert!(found.watch.contains(&dir.join("src")), "{:?}", found.watch);
    // The explicit variable wins over git.
    assert_eq!(revision::find(&dir, Some("release-7")).value, "release-7");

    // A document is not a source of the binary; a source file is, tracked or new.
    fs::write(dir.join("README.md"), "edited\n").unwrap();
    assert_eq!(revision::find(&dir, None).value, &first[..12]);
    fs::write(dir.join("src/main.rs"), "fn main() { println!(); }\n").unwrap();
    assert_eq!(
        revision::find(&dir, None).value,
        format!("{}-dirty", &first[..12])
    );
    let second = commit_all(&dir, "second");
    assert_eq!(revision::find(&dir, None).value, &second[..12]);
    fs::write(dir.join("src/new.rs"), "\n").unwrap();
    assert_eq!(
        revision::find(&dir, None).value,
        format!("{}-dirty", &second[..12])
    );
    fs::remove_file(dir.join("src/new.rs")).unwrap();

    // A branch whose ref is only in packed-refs: its folder, where the file will appear.
    git(&dir, &["pack-refs", "--all"]);
    assert!(!git_dir.join("refs/heads/main").exists());
    let found = revision::find(&dir, None);
    assert!(
        found.watch.contains(&git_dir.join("refs/heads")),
        "{:?}",
        found.watch
    );
    assert!(found.watch.contains(&git_dir.join("packed-refs")));

    // A detached HEAD still has a revision.
    git(&dir, &["checkout", "-q", &first]);
    assert_eq!(revision::find(&dir, None).value, &first[..12]);
}

#[test]
fn a_package_inside_another_repository_does_not_take_its_revision() {
    let scratch = tempfile::tempdir().unwrap();
    let outer = scratch.path();
    fs::write(outer.join("OTHER"), "another project\n").unwrap();
    git(outer, &["init", "-q", "-b", "main"]);
    commit_all(outer, "another project");
    let vendored = outer.join("vendor/vram-exporter");
    package(&vendored);
    commit_all(outer, "vendor it");
    assert_eq!(revision::find(&vendored, None).value, "unknown");
}

#[test]
fn the_binary_reports_the_revision_of_the_checkout_it_was_built_from() {
    let output = tempfile::tempdir().unwrap();
    let file = output.path().join("vram.prom");
    let outcome = Command::new(exporter_binary())
        .arg("textfile")
        .arg("--replay")
        .arg(repository().join("examples/story-gpu2-orphaned.json"))
        .arg("--output")
        .arg(&file)
        .output()
        .expect("run the exporter");
    assert!(outcome.status.success(), "{outcome:?}");
    let metrics = Metrics::parse(&fs::read_to_string(&file).unwrap());
    let build = metrics.find("vram_build_info", &[]);
    assert_eq!(build.len(), 1, "{}", metrics.text);
    let reported = &build[0].1["revision"];

    let explicit = std::env::var("VRAM_EXPORTER_REVISION").ok();
    if repository().join(".git").exists() && explicit.is_none() {
        // From a git clone, never "unknown": what a person building from a clone expects.
        let head = git(&repository(), &["rev-parse", "HEAD"]);
        assert!(
            *reported == head[..12] || *reported == format!("{}-dirty", &head[..12]),
            "the binary reports {reported:?}; HEAD is {head}"
        );
    }
    assert_eq!(
        *reported,
        revision::find(&repository(), explicit.as_deref()).value,
        "the binary's revision differs from what the build script finds now (were sources edited since the build?)"
    );
}
