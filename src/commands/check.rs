//! `vram-exporter check`: one look at the host for a person, or a wait until orphaned
//! memory is gone ("did that kill actually work?"). Every look ends within `--timeout`,
//! saying on stderr what it waits for while NVML or `/proc` is slow, so a person can tell
//! a hung GPU from a hung tool.

use crate::classify::{CheckStatus, NoSuchGpu, Report, Selection, ENDING_AT_MOST_MILLIS};
use crate::cli::CheckConfig;
use crate::exit_codes::{self, Convention};
use crate::exporter::{Exporter, HolderScanPolicy};
use crate::observe::{ReaderThread, Waiting};
use crate::render::json::check_document;
use crate::render::text::progress::{look_line, slow_calls_key, Awaited, SlowCall, WaitProgress};
use crate::render::text::summary::{foreign_lines, summary_line, summary_line_where};
use crate::render::text::{check_text, verdicts_after_wait};
use anyhow::{anyhow, bail};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SPINNER: [char; 4] = ['|', '/', '-', '\\'];
/// Without a terminal, repeat an unchanged progress line only this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// A call slower than this is worth a progress line: a healthy look takes milliseconds,
/// and a person starts to wonder after a second or two.
const SLOW_CALL: Duration = Duration::from_secs(2);
/// How often a look that waits looks at what it waits for.
const LOOK_PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// How often a look that found an owner being freed looks again: a free takes 0.12 to
/// 0.20 s.
const ENDING_LOOK_EVERY: Duration = Duration::from_millis(100);

/// Run `check`; the exit status is the verdict's (see [`exit_codes`]), or an error (2, or
/// the plugin convention's unknown). With `--wait` it ends within the wait and two looks
/// of `--timeout` (the first and the last): a poll never runs past the wait's end.
pub fn run(exporter: &Exporter, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let mut out = Output::of(config);
    if config.wait_on_replay {
        eprintln!("vram-exporter: warning: --wait does not wait on a replay: a snapshot does not change, so its answer is final");
    }
    let report = settled_look(exporter, config.timeout)?;
    let first = chosen(&report, config)?;
    // Once, before any verdict: a bad flag is still one line of its own.
    if let Some(no_state) = report
        .witness
        .as_ref()
        .and_then(|read| read.no_state.as_ref())
    {
        eprintln!("vram-exporter: warning: {no_state}");
    }
    // Waits while memory is orphaned, left behind, held by a killed owner or being freed,
    // also beside a GPU that does not answer.
    let Some(wait) = config.wait.filter(|_| first.awaits_freeing()) else {
        return finish(&first, config, Shown::Nothing, &mut out);
    };
    if !config.json {
        let _ = write!(out.report, "{}", check_text(&first));
        let _ = writeln!(out.report);
    }
    // What the wait waits for is named as the first look found it.
    let held = first.held_as();
    let started = Instant::now();
    let mut progress = Progress::new();
    let mut still_held = first.to_free_bytes();
    loop {
        let left = wait.saturating_sub(started.elapsed());
        let mut freed = false;
        if !left.is_zero() {
            let polled = look(
                exporter,
                HolderScanPolicy::WhenOrphaned,
                config.timeout.min(left),
            )?;
            let polled = chosen(&polled, config)?;
            still_held = polled.to_free_bytes();
            // Memory on a GPU that does not answer (or with NVML down) is not freed: it
            // is not seen.
            freed = still_held == 0 && !polled.unseen();
        }
        let waiting = WaitProgress {
            still_held,
            held,
            waited: started.elapsed(),
            wait,
        };
        if freed || waiting.waited >= wait {
            progress.done(&waiting.end_line(freed));
            let last = look(exporter, HolderScanPolicy::Always, config.timeout)?;
            return finish(&chosen(&last, config)?, config, Shown::Tables, &mut out);
        }
        progress.show(&waiting.figure(), &waiting.line());
        std::thread::sleep(config.wait_interval.min(wait - waiting.waited));
    }
}

/// A look that answers for an owner being freed only once it is past it: while some
/// owner is, the host is looked at again, until the free ends or the owner has been
/// ending for longer than a free takes and is judged gone ([`ENDING_AT_MOST_MILLIS`]).
/// A real free ends within a fifth of a second, so this costs a person nothing.
fn settled_look(exporter: &Exporter, timeout: Duration) -> anyhow::Result<Report> {
    let settled_by =
        Instant::now() + Duration::from_millis(ENDING_AT_MOST_MILLIS) + ENDING_LOOK_EVERY * 2;
    let mut report = look(exporter, HolderScanPolicy::Always, timeout)?;
    while report.owners_being_freed() && Instant::now() < settled_by {
        std::thread::sleep(ENDING_LOOK_EVERY);
        report = look(exporter, HolderScanPolicy::Always, timeout)?;
    }
    Ok(report)
}

/// The GPUs asked about, of `report`; a GPU that is not there is named as missing from
/// the snapshot when one is replayed, from this host otherwise.
fn chosen<'a>(report: &'a Report, config: &CheckConfig) -> Result<Selection<'a>, NoSuchGpu> {
    report.select_named(&config.gpus).map_err(|missing| {
        if config.replayed {
            missing.in_snapshot()
        } else {
            missing
        }
    })
}

/// One look, done within `timeout`; while a reader is slow, what it waits for goes to
/// stderr.
fn look(
    exporter: &Exporter,
    policy: HolderScanPolicy,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let until = Instant::now() + timeout;
    std::thread::scope(|scope| {
        let (sender, answer) = mpsc::channel();
        scope.spawn(move || {
            let _ = sender.send(exporter.try_observe_and_classify_blocking(policy, until));
        });
        let mut progress = Progress::new();
        let mut shown = false;
        loop {
            match answer.recv_timeout(LOOK_PROGRESS_EVERY) {
                Ok(collected) => {
                    if shown {
                        progress.clear();
                    }
                    return Ok(collected?.report);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let waiting = exporter.waiting();
                    let slow: Vec<SlowCall> = waiting
                        .iter()
                        .filter(|reading| reading.since.elapsed() >= SLOW_CALL)
                        .map(slow_call)
                        .collect();
                    if !slow.is_empty() {
                        progress.show(&slow_calls_key(&slow), &look_line(&slow, timeout));
                        shown = true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(anyhow!("the look at the host failed; see the log"))
                }
            }
        }
    })
}

/// A reader's call as the progress line names it.
fn slow_call(reading: &Waiting) -> SlowCall<'_> {
    SlowCall {
        awaited: match reading.reader {
            ReaderThread::NvmlLibrary => Awaited::Nvml,
            ReaderThread::Gpu(index) => Awaited::Gpu(index),
            ReaderThread::Procfs => Awaited::Procfs,
        },
        call: reading.call,
        seconds: reading.since.elapsed().as_secs_f64(),
    }
}

/// What standard output shows already when the verdict is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// Nothing: the tables and verdicts go out whole.
    Nothing,
    /// The tables of the first look, before a wait: the verdicts alone say how it ended.
    Tables,
}

/// Where `check` writes: the verdict and tables on standard output, or with `--summary`
/// the one line there and the rest on standard error.
struct Output {
    /// The tables, verdicts and exit status line.
    report: Box<dyn Write>,
}

impl Output {
    fn of(config: &CheckConfig) -> Output {
        Output {
            report: if config.summary {
                Box::new(std::io::stderr())
            } else {
                Box::new(std::io::stdout())
            },
        }
    }
}

/// Print the verdict and end with its exit status.
fn finish(
    selection: &Selection,
    config: &CheckConfig,
    shown: Shown,
    out: &mut Output,
) -> anyhow::Result<ExitCode> {
    let in_use = config.foreign && selection.in_use();
    let code = exit_codes::of_check(
        selection.status,
        in_use,
        config.exit_codes,
        config.only_verdict,
    );
    if config.json {
        // A script gets its document also when NVML is down, with the reason in it.
        let mut json = serde_json::to_string_pretty(&check_document(selection))?;
        json.push('\n');
        std::io::stdout().write_all(json.as_bytes())?;
        return Ok(ExitCode::from(code));
    }
    if config.summary {
        // The line first, so that a reader that stops at it has it whole.
        let line = match config.only_verdict {
            Some(verdict) => summary_line_where(selection, config.foreign, |status| {
                verdict.of_status(status)
            }),
            None => summary_line(selection, config.foreign),
        };
        println!("{line}");
    }
    if selection.status == CheckStatus::NvmlDown {
        let error = format!(
            "NVML is not available: {}",
            selection.report.nvml.error().unwrap_or_default()
        );
        if config.summary {
            let _ = writeln!(out.report, "vram-exporter: {error}");
            return Ok(ExitCode::from(code));
        }
        bail!(error);
    }
    // NVML that does not answer has no tables to have shown: its words are the verdict.
    if shown == Shown::Tables && selection.report.nvml.is_up() {
        let _ = write!(out.report, "{}", verdicts_after_wait(selection));
    } else {
        let _ = write!(out.report, "{}", check_text(selection));
    }
    if config.foreign {
        for line in foreign_lines(selection) {
            let _ = writeln!(out.report, "{line}");
        }
    }
    let meaning = match config.exit_codes {
        Convention::Detailed => exit_codes::meaning(code),
        Convention::Plugin => exit_codes::plugin_meaning(code),
    };
    let _ = writeln!(out.report, "\nexit status {code}: {meaning}");
    let _ = out.report.flush();
    Ok(ExitCode::from(code))
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

    /// Show `line`: on a terminal as a spinner line, else as a plain line when `figure`
    /// (what the line is about) changes, and every few seconds otherwise.
    fn show(&mut self, figure: &str, line: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let spinner = SPINNER[self.ticks % SPINNER.len()];
            self.ticks += 1;
            let _ = write!(stderr, "\r\x1b[2K{spinner} {line}");
            let _ = stderr.flush();
            return;
        }
        let due = match &self.last_plain {
            None => true,
            Some((last, at)) => last != figure || at.elapsed() >= PLAIN_PROGRESS_EVERY,
        };
        if due {
            let _ = writeln!(stderr, "{line}");
            self.last_plain = Some((figure.to_string(), Instant::now()));
        }
    }

    /// Take a spinner line away; plain lines stay.
    fn clear(&mut self) {
        if self.terminal {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
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
