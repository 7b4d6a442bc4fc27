//! The one-shot commands: `check`, `snapshot` and `textfile`.

pub mod check;
pub mod snapshot;
pub mod textfile;

use crate::classify::{Report, Written};
use crate::exit_codes;
use crate::render::text::not_answering_lines;
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
