//! `vram-exporter textfile`: the metrics written once, for node_exporter's textfile collector.

use super::written_status;
use crate::exporter::{Exporter, Format};
use anyhow::Context;
use std::fs;
use std::io::Write;
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

/// Write to a temporary file beside `path`, then rename it over `path`: a reader (the
/// textfile collector) sees the old file or the new one, never half of one.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    // A dot-prefixed name that does not end in .prom: the collector ignores it meanwhile.
    let temporary = folder.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut file = fs::File::create(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}
