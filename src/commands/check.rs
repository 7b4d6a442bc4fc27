//! `vram-exporter check`: one look at the host for a person, or a wait until orphaned
//! memory is gone ("did that kill actually work?"). Every look ends within `--timeout`,
//! saying on stderr what it waits for while NVML or `/proc` is slow, so a person can tell
//! a hung GPU from a hung tool.

use crate::classify::{GpuVerdict, NvmlFailure, NvmlStatus, Report};
use crate::cli::CheckConfig;
use crate::exit_codes;
use crate::exporter::{Exporter, HolderScanPolicy};
use crate::observe::{ReaderThread, Waiting as Reading};
use crate::render::json::check_document;
use crate::render::text::{check_text, verdict};
use crate::units::format_bytes;
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

/// Run `check`; the exit status is the verdict's (see [`exit_codes`]), or an error (2).
pub fn run(exporter: &Exporter, config: &CheckConfig) -> anyhow::Result<ExitCode> {
    let report = look(exporter, HolderScanPolicy::Always, config.timeout)?;
    let Some(wait) = config.wait else {
        return finish(&report, config);
    };
    // Waits while memory is orphaned, left behind, held by a killed owner or being freed,
    // also beside a GPU that does not answer.
    if !select(&report, config)?
        .iter()
        .any(|gpu| gpu.awaits_freeing())
    {
        return finish(&report, config);
    }
    if !config.json {
        print!("{}", check_text(&report, &select(&report, config)?));
        println!();
    }
    // What the wait waits for is named as the first look found it.
    let word = held_word(&report, config)?;
    let started = Instant::now();
    let mut progress = Progress::new();
    loop {
        let polled = look(exporter, HolderScanPolicy::WhenOrphaned, config.timeout)?;
        let still = selected_to_free_bytes(&polled, config)?;
        // Memory on a GPU that does not answer (or with NVML down) is not freed: it is
        // not seen.
        let freed = still == 0 && !unseen(&polled, config)?;
        let waited = started.elapsed();
        if freed || waited >= wait {
            progress.done(&if freed {
                format!("{word} memory freed after {:.1}s", waited.as_secs_f64())
            } else {
                format!(
                    "{} still {word} after {:.1}s",
                    format_bytes(still),
                    waited.as_secs_f64()
                )
            });
            let last = look(exporter, HolderScanPolicy::Always, config.timeout)?;
            return finish_after_wait(&last, config);
        }
        progress.show_waiting(Waiting {
            still_held: still,
            word,
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
            let _ = sender.send(exporter.try_observe_and_classify(policy, until));
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
                    let slow: Vec<Reading> = exporter
                        .waiting()
                        .into_iter()
                        .filter(|reading| reading.since.elapsed() >= SLOW_CALL)
                        .collect();
                    if !slow.is_empty() {
                        let key = slow.iter().map(|reading| reading_words(reading, false));
                        let key: Vec<String> = key.collect();
                        progress.show(&key.join("; "), &look_line(&slow, timeout));
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

/// `waiting for GPU 1 (in nvmlDeviceGetMemoryInfo_v2 for 3.0s); this look ends by 30s
/// (--timeout), reporting what has not answered`.
fn look_line(slow: &[Reading], timeout: Duration) -> String {
    let readings: Vec<String> = slow
        .iter()
        .map(|reading| reading_words(reading, true))
        .collect();
    format!(
        "waiting for {}; this look ends by {:.0}s (--timeout), reporting what has not answered",
        readings.join(", "),
        timeout.as_secs_f64()
    )
}

/// `GPU 1 (in nvmlDeviceGetMemoryInfo_v2 for 3.0s)`, without the time for a key that
/// stays the same while it waits.
fn reading_words(reading: &Reading, with_time: bool) -> String {
    let what = match reading.reader {
        ReaderThread::NvmlLibrary => "NVML".to_string(),
        ReaderThread::Gpu(index) => format!("GPU {index}"),
        ReaderThread::Procfs => "/proc".to_string(),
    };
    if with_time {
        format!(
            "{what} (in {} for {:.1}s)",
            reading.call,
            reading.since.elapsed().as_secs_f64()
        )
    } else {
        format!("{what} (in {})", reading.call)
    }
}

/// Whether some GPU asked about could not be seen this time: NVML down, or the GPU not
/// answering.
fn unseen(report: &Report, config: &CheckConfig) -> anyhow::Result<bool> {
    Ok(!report.nvml.is_up()
        || select(report, config)?
            .iter()
            .any(|gpu| gpu.outcome.stuck().is_some()))
}

/// How the wait names the memory it waits for: `orphaned` while some is, else `held` (left
/// behind, killed and stuck, being freed: never called orphaned).
fn held_word(report: &Report, config: &CheckConfig) -> anyhow::Result<&'static str> {
    let orphaned = select(report, config)?.iter().any(|gpu| gpu.has_orphan());
    Ok(if orphaned { "orphaned" } else { "held" })
}

fn selected_to_free_bytes(report: &Report, config: &CheckConfig) -> anyhow::Result<u64> {
    Ok(select(report, config)?
        .iter()
        .map(|gpu| gpu.to_free_bytes())
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
    } else if let NvmlStatus::Down { error, reason, .. } = &report.nvml {
        if *reason != NvmlFailure::NotAnswering {
            bail!("NVML is not available: {error}");
        }
        print!("{}", check_text(report, &gpus));
        println!("\nexit status {code}: {}", exit_codes::meaning(code));
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
    /// Bytes still to be freed on the GPUs asked about.
    still_held: u64,
    /// How they are named: `orphaned` or `held`.
    word: &'static str,
    /// Time waited so far.
    waited: Duration,
    /// Time the wait may take.
    wait: Duration,
}

impl Waiting {
    fn line(self) -> String {
        format!(
            "waiting: {} still {} ({:.1}s of {:.0}s)",
            format_bytes(self.still_held),
            self.word,
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

    fn show_waiting(&mut self, waiting: Waiting) {
        self.show(&format_bytes(waiting.still_held), &waiting.line());
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
