//! `vram-exporter textfile`: the metrics written once, for node_exporter's textfile collector.

use crate::exporter::{encode, Exporter, Format};
use anyhow::Context;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Collect once and write the Prometheus text to `output` atomically.
pub fn run(exporter: &Arc<Exporter>, output: &Path) -> anyhow::Result<ExitCode> {
    let body = encode(&exporter.registry(), Format::PrometheusText);
    write_atomically(output, body.as_bytes())
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(ExitCode::SUCCESS)
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
