//! `vram-exporter check`: one look at the host for a person, or a wait until orphaned
//! memory is gone ("did that kill actually work?").

use crate::classify::{GpuVerdict, Report};
use crate::cli::CheckConfig;
use crate::exporter::{Exporter, HolderScanPolicy};
use crate::render::json::check_document;
use crate::render::text::check_text;
use crate::units::format_bytes;
use anyhow::bail;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit status when some GPU has orphaned memory.
pub const EXIT_ORPHANED: u8 = 1;

const SPINNER: [char; 4] = ['|', '/', '-', '\\'];
/// Without a terminal, repeat an unchanged progress line only this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Run `check` and return 0 (nothing orphaned), 1 (orphaned) or an error (exit 2).
pub fn run(exporter: &Exporter, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let (_, report) = exporter.try_observe_and_classify(HolderScanPolicy::Always)?;
    let Some(wait) = config.wait else {
        return finish(&report, config);
    };
    let orphaned = selected_orphaned_bytes(&report, config)?;
    if orphaned == 0 {
        return finish(&report, config);
    }
    if !config.json {
        print!("{}", check_text(&report, &select(&report, config)?));
        println!();
    }
    let started = Instant::now();
    let mut progress = Progress::new();
    loop {
        let (_, polled) = exporter.try_observe_and_classify(HolderScanPolicy::WhenOrphaned)?;
        let still = selected_orphaned_bytes(&polled, config)?;
        if still == 0 {
            progress.done(&format!(
                "orphaned memory freed after {:.1}s",
                started.elapsed().as_secs_f64()
            ));
            let (_, last) = exporter.try_observe_and_classify(HolderScanPolicy::Always)?;
            return finish(&last, config);
        }
        let waited = started.elapsed();
        if waited >= wait {
            progress.done(&format!(
                "{} still orphaned after {:.1}s",
                format_bytes(still),
                waited.as_secs_f64()
            ));
            let (_, last) = exporter.try_observe_and_classify(HolderScanPolicy::Always)?;
            return finish(&last, config);
        }
        progress.show(&format!(
            "waiting: {} still orphaned ({:.1}s of {:.0}s)",
            format_bytes(still),
            waited.as_secs_f64(),
            wait.as_secs_f64()
        ));
        std::thread::sleep(config.wait_interval.min(wait - waited));
    }
}

/// The GPUs the person asked about; an index that does not exist is an error.
fn select<'a>(report: &'a Report, config: &CheckConfig) -> anyhow::Result<Vec<&'a GpuVerdict>> {
    if !report.nvml_up {
        bail!(
            "NVML is not available: {}",
            report.nvml_error.as_deref().unwrap_or("unknown error")
        );
    }
    if config.gpus.is_empty() {
        return Ok(report.gpus.iter().collect());
    }
    for index in &config.gpus {
        if !report.gpus.iter().any(|gpu| gpu.index == *index) {
            bail!(
                "there is no GPU {index}; this host has {} (indices 0 to {})",
                report.gpus.len(),
                report.gpus.len().saturating_sub(1)
            );
        }
    }
    Ok(report
        .gpus
        .iter()
        .filter(|gpu| config.gpus.contains(&gpu.index))
        .collect())
}

fn selected_orphaned_bytes(report: &Report, config: &CheckConfig) -> anyhow::Result<u64> {
    Ok(select(report, config)?
        .iter()
        .map(|gpu| gpu.orphaned_bytes())
        .fold(0, u64::saturating_add))
}

/// Print the verdict and choose the exit status.
fn finish(report: &Report, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let gpus = select(report, config)?;
    if config.json {
        let mut json = serde_json::to_string_pretty(&check_document(report, &gpus))?;
        json.push('\n');
        std::io::stdout().write_all(json.as_bytes())?;
    } else {
        print!("{}", check_text(report, &gpus));
    }
    let unreadable: Vec<u32> = gpus
        .iter()
        .filter(|gpu| gpu.account().is_none())
        .map(|gpu| gpu.index)
        .collect();
    if gpus.iter().any(|gpu| gpu.orphaned_bytes() > 0) {
        Ok(ExitCode::from(EXIT_ORPHANED))
    } else if !unreadable.is_empty() {
        // Nothing orphaned among what we could read is not "nothing orphaned".
        let indices: Vec<String> = unreadable.iter().map(u32::to_string).collect();
        bail!(
            "cannot read GPU{} {}; {} memory is unknown",
            if unreadable.len() == 1 { "" } else { "s" },
            indices.join(", "),
            if unreadable.len() == 1 {
                "its"
            } else {
                "their"
            }
        )
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// Progress while waiting: a spinner line on a terminal, plain lines otherwise, on stderr
/// so standard output keeps only the verdict.
struct Progress {
    terminal: bool,
    ticks: usize,
    last_plain: Option<(String, Instant)>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            ticks: 0,
            last_plain: None,
        }
    }

    fn show(&mut self, line: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let spinner = SPINNER[self.ticks % SPINNER.len()];
            self.ticks += 1;
            let _ = write!(stderr, "\r\x1b[2K{spinner} {line}");
            let _ = stderr.flush();
            return;
        }
        // Plain lines: print when the figure changes, else every few seconds.
        let figure = line.split(" (").next().unwrap_or(line).to_string();
        let due = match &self.last_plain {
            None => true,
            Some((last, at)) => *last != figure || at.elapsed() >= PLAIN_PROGRESS_EVERY,
        };
        if due {
            let _ = writeln!(stderr, "{line}");
            self.last_plain = Some((figure, Instant::now()));
        }
    }

    fn done(&mut self, line: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let _ = writeln!(stderr, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(stderr, "{line}");
        }
    }
}
