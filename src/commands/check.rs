//! `vram-exporter check`: one look at the host for a person, or a wait until orphaned
//! memory is gone ("did that kill actually work?").

use crate::classify::{CheckStatus, GpuVerdict, NvmlStatus, Report};
use crate::cli::CheckConfig;
use crate::exit_codes;
use crate::exporter::{Exporter, HolderScanPolicy};
use crate::render::json::check_document;
use crate::render::text::{check_text, verdict};
use crate::units::format_bytes;
use anyhow::bail;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const SPINNER: [char; 4] = ['|', '/', '-', '\\'];
/// Without a terminal, repeat an unchanged progress line only this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Run `check`; the exit status is the verdict's (see [`exit_codes`]), or an error (2).
pub fn run(exporter: &Exporter, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let report = exporter
        .try_observe_and_classify(HolderScanPolicy::Always)?
        .report;
    let Some(wait) = config.wait else {
        return finish(&report, config);
    };
    if report.check_status(&select(&report, config)?) != CheckStatus::Orphaned {
        return finish(&report, config);
    }
    if !config.json {
        print!("{}", check_text(&report, &select(&report, config)?));
        println!();
    }
    let started = Instant::now();
    let mut progress = Progress::new();
    loop {
        let polled = exporter
            .try_observe_and_classify(HolderScanPolicy::WhenOrphaned)?
            .report;
        let still = selected_orphaned_bytes(&polled, config)?;
        let waited = started.elapsed();
        if still == 0 || waited >= wait {
            progress.done(&if still == 0 {
                format!("orphaned memory freed after {:.1}s", waited.as_secs_f64())
            } else {
                format!(
                    "{} still orphaned after {:.1}s",
                    format_bytes(still),
                    waited.as_secs_f64()
                )
            });
            let last = exporter
                .try_observe_and_classify(HolderScanPolicy::Always)?
                .report;
            return finish_after_wait(&last, config);
        }
        progress.show(Waiting {
            still_orphaned: still,
            waited,
            wait,
        });
        std::thread::sleep(config.wait_interval.min(wait - waited));
    }
}

/// The GPUs the person asked about; an index that does not exist is an error. With NVML
/// down there are none to choose from.
fn select<'a>(report: &'a Report, config: &CheckConfig) -> anyhow::Result<Vec<&'a GpuVerdict>> {
    if config.gpus.is_empty() || !report.nvml.is_up() {
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

/// Print the verdict and end with its exit status.
fn finish(report: &Report, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let gpus = select(report, config)?;
    let code = exit_codes::of(report.check_status(&gpus));
    if config.json {
        // A script gets its document also when NVML is down, with the reason in it.
        let mut json = serde_json::to_string_pretty(&check_document(report, &gpus))?;
        json.push('\n');
        std::io::stdout().write_all(json.as_bytes())?;
    } else if let NvmlStatus::Down { error } = &report.nvml {
        bail!("NVML is not available: {error}");
    } else {
        print!("{}", check_text(report, &gpus));
        println!("\nexit status {code}: {}", exit_codes::meaning(code));
    }
    Ok(ExitCode::from(code))
}

/// After a wait the tables were printed already: the verdicts alone say how it ended.
fn finish_after_wait(report: &Report, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    if config.json || !report.nvml.is_up() {
        return finish(report, config);
    }
    let gpus = select(report, config)?;
    let code = exit_codes::of(report.check_status(&gpus));
    for gpu in &gpus {
        let words = verdict(gpu);
        println!("{}", words.sentence);
        if let Some(suggestion) = &words.suggestion {
            println!("  suggested: {suggestion}");
        }
    }
    println!("\nexit status {code}: {}", exit_codes::meaning(code));
    Ok(ExitCode::from(code))
}

/// Where a wait stands.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// Orphaned bytes on the GPUs asked about.
    still_orphaned: u64,
    /// Time waited so far.
    waited: Duration,
    /// Time the wait may take.
    wait: Duration,
}

impl Waiting {
    fn line(self) -> String {
        format!(
            "waiting: {} still orphaned ({:.1}s of {:.0}s)",
            format_bytes(self.still_orphaned),
            self.waited.as_secs_f64(),
            self.wait.as_secs_f64()
        )
    }
}

/// Progress while waiting: a spinner line on a terminal, plain lines otherwise, on stderr
/// so standard output keeps only the verdict.
struct Progress {
    terminal: bool,
    ticks: usize,
    /// The orphaned bytes last printed as a plain line, as shown, and when.
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

    fn show(&mut self, waiting: Waiting) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let spinner = SPINNER[self.ticks % SPINNER.len()];
            self.ticks += 1;
            let _ = write!(stderr, "\r\x1b[2K{spinner} {}", waiting.line());
            let _ = stderr.flush();
            return;
        }
        // Plain lines: print when the figure shown changes, else every few seconds.
        let figure = format_bytes(waiting.still_orphaned);
        let due = match &self.last_plain {
            None => true,
            Some((last, at)) => *last != figure || at.elapsed() >= PLAIN_PROGRESS_EVERY,
        };
        if due {
            let _ = writeln!(stderr, "{}", waiting.line());
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
