//! Render a [`Report`] for a person (`check`): an nvidia-smi-like table per GPU
//! (`table.rs`), then per GPU the verdict in one sentence, its notes and the command that
//! would help (in `render::words`, which `check --json` shares). Every decision (who is
//! to blame, what would free the memory, which command) was made by the classifier; this
//! only lays the words out.

pub mod progress;
pub mod summary;
mod table;

pub use super::words::{instance_verdict, seconds_words, size_words, verdict, verdicts, Verdict};
pub use table::gpu_table;

use crate::classify::{NvmlFailure, NvmlStatus, Report, Selection, Sight};
use std::fmt::Write;

/// What did not answer in time, one line each: NVML itself, each GPU, the `/proc`
/// reader. Empty when everything answered (or failed outright).
pub fn not_answering_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(stuck) = report.nvml.stuck() {
        lines.push(format!(
            "NVML does not answer (stuck {} in {})",
            seconds_words(stuck.stuck_seconds),
            stuck.call
        ));
    }
    for gpu in &report.gpus {
        if let Some((call, seconds)) = gpu.outcome.stuck() {
            lines.push(format!(
                "GPU {} does not answer NVML (stuck {} in {call})",
                gpu.index,
                seconds_words(seconds)
            ));
        }
    }
    if let Some(stuck) = &report.procfs_stuck {
        lines.push(format!(
            "a /proc read does not return (the reader has been stuck for {}, {})",
            seconds_words(stuck.stuck_seconds),
            stuck.call
        ));
    }
    lines
}

/// Every table, every verdict and the host's notes, for `check`.
pub fn check_text(selection: &Selection) -> String {
    let (report, gpus) = (selection.report, &selection.gpus);
    let mut out = String::new();
    match &report.nvml {
        NvmlStatus::Down {
            reason: NvmlFailure::NotAnswering,
            stuck: Some(stuck),
            ..
        } => {
            let _ = writeln!(
                out,
                "NVML does not answer (stuck {} in {}): cannot tell.",
                seconds_words(stuck.stuck_seconds),
                stuck.call
            );
            let _ = writeln!(out, "  note: NVML's own calls block: a wedged driver, or a GPU that fell off the bus (Xid 79); look for Xid errors in the kernel log (dmesg). It is asked nothing more until the call returns.");
            return out;
        }
        NvmlStatus::Down { error, .. } => {
            let _ = writeln!(out, "NVML is not available: {error}");
            return out;
        }
        NvmlStatus::Up { .. } => {}
    }
    match report.sight() {
        Sight::Whole => {}
        Sight::OutsideHostNamespace => {
            let _ = writeln!(out, "warning: not in the host PID namespace: NVML hides other namespaces' processes, so memory without a visible owner is not called orphaned.\n");
        }
        Sight::ProcfsNotOurs => {
            let _ = writeln!(out, "warning: the procfs read (--path.procfs) shows another PID namespace, in which this process is not: the owners NVML names cannot be looked up there, so none is judged and nothing is called orphaned.\n");
        }
    }
    if gpus.is_empty() {
        let _ = writeln!(out, "No GPUs.");
        return out;
    }
    for gpu in gpus.iter() {
        out.push_str(&gpu_table(gpu));
        out.push('\n');
    }
    for gpu in gpus.iter() {
        for verdict in verdicts(gpu) {
            let _ = writeln!(out, "{}", verdict.sentence);
            for note in &verdict.notes {
                let _ = writeln!(out, "  note: {note}");
            }
            if let Some(suggestion) = &verdict.suggestion {
                let _ = writeln!(out, "  suggested: {suggestion}");
            }
        }
    }
    out
}

/// After `check --wait`, whose tables were printed before it: each GPU's sentence and
/// suggestion say how it ended.
pub fn verdicts_after_wait(selection: &Selection) -> String {
    let mut out = String::new();
    for gpu in &selection.gpus {
        let words = verdict(gpu);
        let _ = writeln!(out, "{}", words.sentence);
        if let Some(suggestion) = &words.suggestion {
            let _ = writeln!(out, "  suggested: {suggestion}");
        }
    }
    out
}
