//! The one-shot commands: `check`, `snapshot`, `textfile` and `copy-to`; here, what the
//! two that write a file from a look share.

pub mod check;
pub mod copy_to;
pub mod snapshot;
pub mod textfile;

use crate::classify::{Report, Written};
use crate::exit_codes;
use crate::render::text::not_answering_lines;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// The exit status of a command that wrote a file from `report`, saying on stderr (in
/// one line, as every error) what the file carries when that is not everything; `said`
/// ends the line ("the snapshot says so").
fn written_status(report: &Report, said: &str) -> ExitCode {
    let written = report.written();
    match written {
        Written::Complete => {}
        Written::NvmlDown => eprintln!(
            "vram-exporter: NVML is not available: {}; {said}",
            report.nvml.error().unwrap_or_default()
        ),
        Written::NotAnswered => eprintln!(
            "vram-exporter: {}; {said}",
            not_answering_lines(report).join("; ")
        ),
    }
    ExitCode::from(exit_codes::of_written(written))
}

/// Write to a temporary file beside `path`, then rename it over `path`: a reader (the
/// textfile collector) sees the old file or the new one, never half of one.
fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
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
