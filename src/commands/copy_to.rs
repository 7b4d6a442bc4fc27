//! `vram-exporter copy-to FOLDER`: this program's own bytes into `FOLDER/vram-exporter`,
//! for a sidecar of another image that runs `check` (node-problem-detector's custom
//! plugin): the image has no shell or cp for an init container to copy it with.

use anyhow::Context;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;

/// Copy the running program (`/proc/self/exe`, whatever path started it) into `folder`,
/// under a temporary name first, so that a sidecar never runs half a binary.
pub fn run(folder: &Path) -> anyhow::Result<ExitCode> {
    let target = folder.join("vram-exporter");
    let partial = folder.join(format!(".vram-exporter.{}.partial", std::process::id()));
    let copied = (|| {
        fs::copy("/proc/self/exe", &partial)?;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))?;
        fs::rename(&partial, &target)
    })();
    if copied.is_err() {
        let _ = fs::remove_file(&partial);
    }
    copied.with_context(|| format!("cannot copy vram-exporter to {}", target.display()))?;
    println!("copied vram-exporter to {}", target.display());
    Ok(ExitCode::SUCCESS)
}
