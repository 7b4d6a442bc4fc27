//! Render a [`Report`] for a person: an nvidia-smi-like table per GPU and one verdict
//! sentence per GPU that says what would free orphaned memory.

use crate::classify::{
    kinship, GpuAccount, GpuOutcome, GpuVerdict, Kinship, Owner, OwnerState, Report,
    UnattributedTrust,
};
use crate::observe::Holder;
use crate::units::format_bytes;
use serde::Serialize;
use std::fmt::Write;

/// What a GPU's verdict amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Every byte has a live owner (or nothing is used).
    Healthy,
    /// Memory is orphaned and live processes hold the device: killing them should free it.
    OrphanedHeld,
    /// Memory is orphaned and nothing holds the device: only a reset frees it.
    OrphanedUnheld,
    /// Memory is orphaned and only the GPU's live owners hold the device: stopping them
    /// may free it.
    OrphanedHeldByOwners,
    /// Memory is orphaned and the holder scan could not see every process.
    OrphanedHoldersUnknown,
    /// The GPU did not answer.
    Unreadable,
}

/// The verdict on one GPU in words, with the command that would help, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The kind of finding.
    pub finding: Finding,
    /// One sentence for a person.
    pub sentence: String,
    /// Further facts worth a line each (stopped owners, blindness, unavailable usage).
    pub notes: Vec<String>,
    /// A command the person may run; the exporter never runs it.
    pub suggestion: Option<String>,
}

/// The state of a process in plain words.
fn state_words(letter: char) -> &'static str {
    match letter {
        'R' => "running",
        'S' | 'I' => "sleeping",
        'T' => "stopped",
        't' => "stopped by a tracer",
        'D' => "in uninterruptible sleep",
        'Z' => "zombie",
        _ => "running",
    }
}

fn describe_holder_tied(holder: &Holder, gone: &[u32]) -> String {
    let mut words = describe_holder(holder);
    if let Some(kin) = kinship(holder, gone) {
        words.pop();
        let tie = match kin {
            Kinship::ChildOf(pid) => format!("child of exited PID {pid}"),
            Kinship::ProcessGroupOf(pid) => format!("in the process group of exited PID {pid}"),
            Kinship::SessionOf(pid) => format!("in the session of exited PID {pid}"),
        };
        let _ = write!(words, ", {tie})");
    }
    words
}

fn describe_holder(holder: &Holder) -> String {
    let mut words = format!(
        "PID {} ({}, {}",
        holder.pid,
        holder.comm,
        state_words(holder.state)
    );
    if let Some(wchan) = &holder.wchan {
        let _ = write!(words, " in {wchan}");
    }
    if let Some(user) = &holder.user {
        let _ = write!(words, ", user {user}");
    }
    let _ = write!(words, ", parent {})", holder.ppid);
    words
}

fn pid_list(owners: &[&Owner]) -> String {
    let pids: Vec<String> = owners.iter().map(|owner| owner.pid.to_string()).collect();
    pids.join(", ")
}

/// The verdict for one GPU.
pub fn verdict(gpu: &GpuVerdict, report: &Report) -> Verdict {
    let account = match &gpu.outcome {
        GpuOutcome::Measured(account) => account,
        GpuOutcome::Failed { error, message } => {
            return Verdict {
                finding: Finding::Unreadable,
                sentence: format!(
                    "GPU {}: NVML cannot read it ({}: {message}); its memory is unknown.",
                    gpu.index,
                    error.as_str()
                ),
                notes: vec![
                    "A lost GPU or one that needs a reset answers again only after a reset, once every process using it has stopped.".into(),
                ],
                suggestion: None,
            };
        }
    };
    let mut notes = owner_notes(account);
    if account.unattributed_bytes > 0 {
        match account.unattributed_trust {
            UnattributedTrust::Blind => notes.push(format!(
                "{} is charged to no visible process, but this process is not in the host PID namespace, where NVML hides other namespaces' processes: not called orphaned.",
                format_bytes(account.unattributed_bytes)
            )),
            UnattributedTrust::UsageUnavailable => notes.push(format!(
                "{} is charged to no process, but NVML cannot report a live owner's usage, so it may be that owner's: not called orphaned.",
                format_bytes(account.unattributed_bytes)
            )),
            UnattributedTrust::Counted => {}
        }
    }

    if !account.other_holders.is_empty() {
        let named: Vec<String> = account.other_holders.iter().map(describe_holder).collect();
        notes.push(format!(
            "Also holding the device file, as NVML clients that own no memory (monitoring agents): {}.",
            named.join(", ")
        ));
    }
    let orphaned = account.orphaned_bytes();
    if orphaned == 0 {
        let live: Vec<&Owner> = account
            .owners
            .iter()
            .filter(|owner| owner.state != OwnerState::Gone)
            .collect();
        let sentence = if live.is_empty() && account.memory.used == 0 {
            format!("GPU {}: idle; nothing orphaned.", gpu.index)
        } else if live.is_empty() {
            // Used memory without a visible owner that is still not orphaned (a blind
            // exporter, or a remnant under the noise floor): "0 B owned by 0 live
            // processes" would hide the memory, and "nothing orphaned" would claim too much.
            format!(
                "GPU {}: {} used by no visible process; not called orphaned.",
                gpu.index,
                format_bytes(account.memory.used)
            )
        } else {
            let owned: u64 = live.iter().filter_map(|owner| owner.used_bytes).sum();
            format!(
                "GPU {}: {} owned by {} live process{}; nothing orphaned.",
                gpu.index,
                format_bytes(owned),
                live.len(),
                if live.len() == 1 { "" } else { "es" }
            )
        };
        return Verdict {
            finding: Finding::Healthy,
            sentence,
            notes,
            suggestion: None,
        };
    }

    let gone: Vec<&Owner> = account.gone_owners().collect();
    let mut sentence = format!("GPU {}: {} held", gpu.index, format_bytes(orphaned));
    match gone.len() {
        0 => sentence.push_str(" but charged to no process"),
        1 => {
            let _ = write!(sentence, " for exited PID {}", gone[0].pid);
        }
        _ => {
            let _ = write!(sentence, " for exited PIDs {}", pid_list(&gone));
        }
    }
    let holders: Vec<&Holder> = account.unlisted_holders.iter().collect();
    let scan = report.holder_scan;
    let scan_complete = scan.is_some_and(|scan| scan.complete);
    let why_incomplete = match scan {
        None => "no scan for holders was made".to_string(),
        Some(scan) if scan.cut_short => {
            "the scan for holders ran out of time before it saw every process".to_string()
        }
        Some(scan) => format!(
            "the descriptors of {} process{} could not be read (run as root or with CAP_SYS_PTRACE)",
            scan.permission_errors,
            if scan.permission_errors == 1 { "" } else { "es" }
        ),
    };
    if !holders.is_empty() {
        if !scan_complete {
            notes.push(format!("Other holders may be missing: {why_incomplete}."));
        }
        let gone_pids: Vec<u32> = gone.iter().map(|owner| owner.pid).collect();
        let named: Vec<String> = holders
            .iter()
            .map(|holder| describe_holder_tied(holder, &gone_pids))
            .collect();
        let pids: Vec<String> = holders
            .iter()
            .map(|holder| holder.pid.to_string())
            .collect();
        let _ = write!(
            sentence,
            "; still held open by {} - killing {} should free it.",
            named.join(", "),
            if holders.len() == 1 {
                pids[0].clone()
            } else {
                "them".to_string()
            }
        );
        if holders.iter().any(|holder| holder.state == 'D') {
            notes.push("A holder in uninterruptible sleep dies only when it leaves the driver call it waits in; if it never does, only a reboot or GPU reset frees the memory.".into());
        }
        if holders
            .iter()
            .any(|holder| matches!(holder.state, 'T' | 't'))
        {
            notes.push(
                "A stopped holder still dies on SIGKILL; SIGTERM waits until it is continued."
                    .into(),
            );
        }
        return Verdict {
            finding: Finding::OrphanedHeld,
            sentence,
            notes,
            suggestion: Some(format!(
                "kill {}   # then: vram-exporter check --gpu {} --wait 30s",
                pids.join(" "),
                gpu.index
            )),
        };
    }
    if !scan_complete {
        let _ = write!(
            sentence,
            "; no holder of its device file was found, but {why_incomplete}: a holder may be missing."
        );
        return Verdict {
            finding: Finding::OrphanedHoldersUnknown,
            sentence,
            notes,
            suggestion: Some(format!("sudo vram-exporter check --gpu {}", gpu.index)),
        };
    }
    let live: Vec<&Owner> = account
        .owners
        .iter()
        .filter(|owner| owner.state != OwnerState::Gone)
        .collect();
    if !live.is_empty() {
        // A live owner holds the node too, and may hold the exited owner's descriptor
        // besides its own (a child that became a CUDA user itself).
        let _ = write!(
            sentence,
            "; no other process holds GPU {}'s device file, but its live owner{} (PID {}) may hold the exited owner's descriptor too: stopping {} may free it; otherwise only a GPU reset can.",
            gpu.index,
            if live.len() == 1 { "" } else { "s" },
            pid_list(&live),
            if live.len() == 1 { "it" } else { "them" }
        );
        return Verdict {
            finding: Finding::OrphanedHeldByOwners,
            sentence,
            notes,
            suggestion: Some(format!(
                "vram-exporter check --gpu {} --wait 60s   # after stopping PID {}",
                gpu.index,
                pid_list(&live)
            )),
        };
    }
    let _ = write!(
        sentence,
        "; no process holds GPU {}'s device file: only a GPU reset can free it.",
        gpu.index
    );
    Verdict {
        finding: Finding::OrphanedUnheld,
        sentence,
        notes,
        suggestion: Some(format!(
            "nvidia-smi --gpu-reset -i {}   # only once nothing uses this GPU",
            gpu.index
        )),
    }
}

fn owner_notes(account: &GpuAccount) -> Vec<String> {
    let mut notes = Vec::new();
    for owner in &account.owners {
        let comm = owner.comm.as_deref().unwrap_or("?");
        match owner.state {
            OwnerState::Stopped => notes.push(format!(
                "PID {} ({comm}) is stopped: its memory stays allocated until it is continued (kill -CONT {}) or killed.",
                owner.pid, owner.pid
            )),
            OwnerState::Uninterruptible => notes.push(format!(
                "PID {} ({comm}) is in uninterruptible sleep, usually inside the driver; it cannot die until that call returns.",
                owner.pid
            )),
            OwnerState::Zombie => notes.push(format!(
                "PID {} ({comm}) has a zombie main thread but live threads still hold the GPU.",
                owner.pid
            )),
            OwnerState::Unknown => notes.push(format!(
                "PID {} could not be read in /proc; it is counted as unknown, not as gone.",
                owner.pid
            )),
            OwnerState::Running | OwnerState::Gone => {}
        }
        if owner.used_bytes.is_none() {
            notes.push(format!(
                "NVML cannot report the memory of PID {} ({comm}).",
                owner.pid
            ));
        }
    }
    notes
}

/// The table for one GPU, nvidia-smi style, without the verdict.
pub fn gpu_table(gpu: &GpuVerdict) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPU {}  {}  {}  {}",
        gpu.index,
        or_dash(&gpu.name),
        or_dash(&gpu.pci_bus_id),
        or_dash(&gpu.uuid)
    );
    let GpuOutcome::Measured(account) = &gpu.outcome else {
        let _ = writeln!(out, "  (no readings)");
        return out;
    };
    let memory = account.memory;
    let _ = writeln!(
        out,
        "  used {}   reserved {}   free {}   total {}",
        format_bytes(memory.used),
        format_bytes(memory.reserved),
        format_bytes(memory.free),
        format_bytes(memory.total)
    );
    if account.owners.is_empty() {
        let _ = writeln!(out, "  no processes listed by NVML");
    } else {
        let _ = writeln!(
            out,
            "  {:>8}  {:<16}  {:<16}  {:>10}",
            "PID", "COMMAND", "STATE", "MEMORY"
        );
        for owner in &account.owners {
            let _ = writeln!(
                out,
                "  {:>8}  {:<16}  {:<16}  {:>10}",
                owner.pid,
                owner.comm.as_deref().unwrap_or("-"),
                owner.state.as_str(),
                owner
                    .used_bytes
                    .map_or_else(|| "n/a".to_string(), format_bytes)
            );
        }
    }
    if !account.unlisted_holders.is_empty() {
        let _ = writeln!(
            out,
            "  holding the device file without being listed by NVML:"
        );
        let _ = writeln!(
            out,
            "  {:>8}  {:<16}  {:<16}  {:>10}",
            "PID", "COMMAND", "STATE", "PARENT"
        );
        for holder in &account.unlisted_holders {
            let _ = writeln!(
                out,
                "  {:>8}  {:<16}  {:<16}  {:>10}",
                holder.pid,
                holder.comm,
                state_words(holder.state),
                holder.ppid
            );
        }
    }
    out
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

/// Every table, every verdict and the host's notes, for `check`.
pub fn check_text(report: &Report, gpus: &[&GpuVerdict]) -> String {
    let mut out = String::new();
    if !report.nvml_up {
        let _ = writeln!(
            out,
            "NVML is not available: {}",
            report.nvml_error.as_deref().unwrap_or("unknown error")
        );
        return out;
    }
    if report.blind() {
        let _ = writeln!(out, "warning: not in the host PID namespace: NVML hides other namespaces' processes, so memory without a visible owner is not called orphaned.\n");
    }
    if gpus.is_empty() {
        let _ = writeln!(out, "No GPUs.");
        return out;
    }
    for gpu in gpus {
        out.push_str(&gpu_table(gpu));
        out.push('\n');
    }
    for gpu in gpus {
        let verdict = verdict(gpu, report);
        let _ = writeln!(out, "{}", verdict.sentence);
        for note in &verdict.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        if let Some(suggestion) = &verdict.suggestion {
            let _ = writeln!(out, "  suggested: {suggestion}");
        }
    }
    out
}
