//! `vram-exporter textfile`: the metrics written once, for node_exporter's textfile collector.

use super::{write_atomically, written_status};
use crate::exporter::{Exporter, Format};
use anyhow::Context;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Collect once, within `timeout`, and write the Prometheus text to `output` atomically.
/// The file is written whatever NVML does, so node_exporter carries `vram_nvml_up 0` or
/// the GPU that does not answer; the exit status says what it carries (a systemd timer
/// or cron reports it).
pub fn run(exporter: &Arc<Exporter>, output: &Path, timeout: Duration) -> anyhow::Result<ExitCode> {
    let (body, report) = exporter.encode_once(Instant::now() + timeout, Format::PrometheusText);
    write_atomically(output, body.as_bytes())
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(written_status(&report, "the metrics say so"))
}
