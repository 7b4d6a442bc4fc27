//! The source revision that `vram_build_info{revision}` reports, found at build time.
//!
//! `build.rs` includes this file; so do the integration tests, which run it against
//! scratch repositories. An explicit `VRAM_EXPORTER_REVISION` wins (a packager's word
//! about what it builds); otherwise git's short hash of HEAD, with `-dirty` when the
//! binary's sources differ from it; otherwise (a source tarball, a container build
//! without `.git`, no git installed) `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The paths, relative to the package, that the binary is built from: a change in one
/// of them makes the tree dirty, and reruns the build script.
pub const SOURCES: [&str; 5] = ["src", "build.rs", "build", "Cargo.toml", "Cargo.lock"];

/// What the build script found.
#[derive(Debug)]
pub struct Revision {
    /// The label value.
    pub value: String,
    /// Paths whose change may change the value; all exist, because cargo reruns a build
    /// script on every build when a path it watches does not.
    pub watch: Vec<PathBuf>,
}

/// The revision of the package in `package`; `explicit` is `VRAM_EXPORTER_REVISION`.
pub fn find(package: &Path, explicit: Option<&str>) -> Revision {
    if let Some(explicit) = explicit.map(str::trim).filter(|value| !value.is_empty()) {
        return Revision {
            value: explicit.to_string(),
            watch: Vec::new(),
        };
    }
    from_git(package).unwrap_or_else(|| Revision {
        value: "unknown".to_string(),
        watch: Vec::new(),
    })
}

fn from_git(package: &Path) -> Option<Revision> {
    // A package that is only a folder of some other repository (vendored, unpacked
    // inside a checkout) must not take that repository's revision.
    let top = git(package, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != package.canonicalize().ok()? {
        return None;
    }
    let hash = git(package, &["rev-parse", "--short=12", "HEAD"])?;
    let sources: Vec<&str> = SOURCES
        .into_iter()
        .filter(|source| package.join(source).exists())
        .collect();
    let mut status = vec!["status", "--porcelain", "--"];
    status.extend(&sources);
    let dirty = !git(package, &status)?.is_empty();

    let mut watch: Vec<PathBuf> = sources.iter().map(|source| package.join(source)).collect();
    let git_path = |name: &str| {
        git(package, &["rev-parse", "--git-path", name]).map(|path| package.join(path))
    };
    watch.extend(git_path("HEAD"));
    if let Some(branch) = git(package, &["symbolic-ref", "-q", "HEAD"]) {
        // The branch's ref file, which each commit on it writes afresh; while the ref is
        // only in packed-refs, the folder its file will appear in. Not the folder always:
        // it holds every branch's ref, and in a checkout with several worktrees each
        // commit in another one would rebuild this one's binaries.
        if let Some(file) = git_path(&branch) {
            if file.exists() {
                watch.push(file);
            } else {
                watch.extend(file.parent().map(Path::to_path_buf));
            }
        }
        watch.extend(git_path("packed-refs"));
    }
    watch.retain(|path| path.exists());
    Some(Revision {
        value: if dirty { format!("{hash}-dirty") } else { hash },
        watch,
    })
}

/// `git -C package args...`, trimmed, or `None` when git is missing or fails.
fn git(package: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(package)
        // Reading a revision needs no trust in the repository's owner: the build runs
        // this repository's code anyway. Root building a user's checkout is common.
        .arg("-c")
        .arg(format!("safe.directory={}", package.display()))
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8(output.stdout).ok()?.trim().to_string())
}
