//! `vram-exporter snapshot`: the raw observation as JSON, for a bug report.

use super::{write_atomically, written_status};
use crate::dates::now_unix_seconds;
use crate::exporter::{Exporter, HolderScanPolicy};
use crate::observe::Snapshot;
use anyhow::Context;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Observe (with the holder scan) within `timeout` and write the snapshot to `output` or
/// standard output; it is written whatever NVML does (what it did is part of the bug
/// report), and the exit status says what it carries.
pub fn run(
    exporter: &Exporter,
    output: Option<&Path>,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let collected = exporter
        .try_observe_and_classify_blocking(HolderScanPolicy::Always, Instant::now() + timeout)?;
    let observation = collected.observation;
    let snapshot = Snapshot {
        format: Snapshot::FORMAT,
        exporter_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: exporter.hostname(),
        taken_at_unix_seconds: now_unix_seconds(),
        observation,
    };
    let mut json = serde_json::to_string_pretty(&snapshot)?;
    json.push('\n');
    match output {
        Some(path) => write_atomically(path, json.as_bytes())
            .with_context(|| format!("cannot write snapshot to {}", path.display()))?,
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(json.as_bytes())
                .context("cannot write snapshot to standard output")?;
        }
    }
    Ok(written_status(&collected.report, "the snapshot says so"))
}
