//! Render a [`Report`] for a person: an nvidia-smi-like table per GPU and one verdict
//! sentence per GPU that says what would free orphaned memory.

use crate::classify::{
    kinship, GpuAccount, GpuOutcome, GpuVerdict, Kinship, Owner, OwnerState, Report,
    UnattributedTrust,
};
use crate::observe::cgroup::short_container_id;
use crate::observe::{Holder, NamespaceInit};
use crate::units::format_bytes;
use serde::Serialize;
use std::fmt::Write;

/// Most PIDs a sentence names before it says how many more there are.
const MAX_PIDS_NAMED: usize = 8;
/// Most processes a table lists, or notes one kind of note names; `check --json` has all.
const MAX_ROWS: usize = 32;

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
    let _ = write!(words, ", parent {}", holder.ppid);
    words.push_str(&container_words(
        holder.cgroup.container_id.as_deref(),
        holder.cgroup.pod_uid.as_deref(),
        NamespaceInit::exited(holder.pid_namespace_init),
    ));
    words.push(')');
    words
}

/// `, container 3f2a9c0b1d2e, pod 1d9e...` for a process in a container, with `, whose
/// container has ended` when it outlived it; empty for a process on the host.
fn container_words(container_id: Option<&str>, pod_uid: Option<&str>, exited: bool) -> String {
    let mut words = String::new();
    if let Some(id) = container_id {
        let _ = write!(words, ", container {}", short_container_id(id));
    }
    if let Some(uid) = pod_uid {
        let _ = write!(words, ", pod {uid}");
    }
    if exited {
        words.push_str(if container_id.is_some() {
            ", whose container has ended"
        } else {
            ", whose PID namespace has ended"
        });
    }
    words
}

/// `1, 2, 3` or `1, 2, ..., 8 and 9,992 more`.
fn pid_list(owners: &[&Owner]) -> String {
    let mut pids: Vec<String> = owners
        .iter()
        .take(MAX_PIDS_NAMED)
        .map(|owner| owner.pid.to_string())
        .collect();
    if owners.len() > MAX_PIDS_NAMED {
        pids.push(format!("and {} more", owners.len() - MAX_PIDS_NAMED));
    }
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
    if account.memory_inconsistent {
        notes.insert(
            0,
            "NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): they are clamped to the total, and memory charged to no process is not called orphaned.".into(),
        );
    }
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
            UnattributedTrust::Inconsistent | UnattributedTrust::Counted => {}
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
            let owned = live
                .iter()
                .filter_map(|owner| owner.used_bytes)
                .fold(0, u64::saturating_add);
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
            "the descriptors of {} process{} could not be read (run as root, or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE)",
            scan.permission_errors,
            if scan.permission_errors == 1 { "" } else { "es" }
        ),
    };
    if !holders.is_empty() {
        if !scan_complete {
            notes.push(format!("Other holders may be missing: {why_incomplete}."));
        }
        let gone_pids: Vec<u32> = gone.iter().map(|owner| owner.pid).collect();
        let mut named: Vec<String> = holders
            .iter()
            .take(MAX_PIDS_NAMED)
            .map(|holder| describe_holder_tied(holder, &gone_pids))
            .collect();
        if holders.len() > MAX_PIDS_NAMED {
            named.push(format!("{} more", holders.len() - MAX_PIDS_NAMED));
        }
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
        let ended: Vec<String> = holders
            .iter()
            .filter(|holder| NamespaceInit::exited(holder.pid_namespace_init))
            .map(|holder| holder.pid.to_string())
            .collect();
        if !ended.is_empty() {
            notes.push(format!(
                "The container of PID {} has ended, and the kernel SIGKILLs every process of a container that ends: {} survived it, so {} stuck (usually in the driver, in state D) and killing again may not free the memory; if it stays, only a reboot or GPU reset will.",
                ended.join(", "),
                if ended.len() == 1 { "it" } else { "they" },
                if ended.len() == 1 { "it is" } else { "they are" }
            ));
        }
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
    let mut left_out = 0usize;
    for owner in &account.owners {
        let comm = owner.comm.as_deref().unwrap_or("?");
        let mut about = Vec::new();
        match owner.state {
            OwnerState::Stopped => about.push(format!(
                "PID {} ({comm}) is stopped: its memory stays allocated until it is continued (kill -CONT {}) or killed.",
                owner.pid, owner.pid
            )),
            OwnerState::Uninterruptible => about.push(format!(
                "PID {} ({comm}) is in uninterruptible sleep, usually inside the driver; it cannot die until that call returns.",
                owner.pid
            )),
            OwnerState::Zombie => about.push(format!(
                "PID {} ({comm}) has a zombie main thread but live threads still hold the GPU.",
                owner.pid
            )),
            OwnerState::Unknown => about.push(format!(
                "PID {} could not be read in /proc; it is counted as unknown, not as gone.",
                owner.pid
            )),
            OwnerState::Running | OwnerState::Gone => {}
        }
        if owner.used_bytes.is_none() {
            about.push(format!(
                "NVML cannot report the memory of PID {} ({comm}).",
                owner.pid
            ));
        }
        if owner.container_exited && owner.state != OwnerState::Gone {
            about.push(format!(
                "PID {} ({comm}{}) still owns its memory although its container has ended: it survived the SIGKILL that ends a container's processes, so it is stuck (usually in the driver); if it stays, only a reboot or GPU reset frees the memory.",
                owner.pid,
                container_words(owner.container_id.as_deref(), owner.pod_uid.as_deref(), false)
            ));
        }
        for note in about {
            if notes.len() < MAX_ROWS {
                notes.push(note);
            } else {
                left_out += 1;
            }
        }
    }
    if left_out > 0 {
        notes.push(format!(
            "{left_out} more such notes about owners left out; vram-exporter check --json lists every owner."
        ));
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
        let containers = account
            .owners
            .iter()
            .any(|owner| owner.container_id.is_some());
        let _ = writeln!(
            out,
            "{}",
            row(
                ["PID", "COMMAND", "STATE", "MEMORY"],
                containers.then_some("CONTAINER")
            )
        );
        for owner in account.owners.iter().take(MAX_ROWS) {
            let pid = owner.pid.to_string();
            let memory = owner
                .used_bytes
                .map_or_else(|| "n/a".to_string(), format_bytes);
            let container = containers
                .then(|| container_cell(owner.container_id.as_deref(), owner.container_exited));
            let cells = [
                pid.as_str(),
                owner.comm.as_deref().unwrap_or("-"),
                owner.state.as_str(),
                memory.as_str(),
            ];
            let _ = writeln!(out, "{}", row(cells, container.as_deref()));
        }
        more_rows(&mut out, account.owners.len(), "owners");
    }
    if !account.unlisted_holders.is_empty() {
        let _ = writeln!(
            out,
            "  holding the device file without being listed by NVML:"
        );
        let containers = account
            .unlisted_holders
            .iter()
            .any(|holder| holder.cgroup.container_id.is_some());
        let _ = writeln!(
            out,
            "{}",
            row(
                ["PID", "COMMAND", "STATE", "PARENT"],
                containers.then_some("CONTAINER")
            )
        );
        for holder in account.unlisted_holders.iter().take(MAX_ROWS) {
            let pid = holder.pid.to_string();
            let parent = holder.ppid.to_string();
            let container = containers.then(|| {
                container_cell(
                    holder.cgroup.container_id.as_deref(),
                    NamespaceInit::exited(holder.pid_namespace_init),
                )
            });
            let cells = [
                pid.as_str(),
                holder.comm.as_str(),
                state_words(holder.state),
                parent.as_str(),
            ];
            let _ = writeln!(out, "{}", row(cells, container.as_deref()));
        }
        more_rows(&mut out, account.unlisted_holders.len(), "holders");
    }
    out
}

/// One table row: PID, command, state and a figure, then the container when any row has one.
fn row(cells: [&str; 4], container: Option<&str>) -> String {
    let mut line = format!(
        "  {:>8}  {:<16}  {:<16}  {:>10}",
        cells[0], cells[1], cells[2], cells[3]
    );
    if let Some(container) = container {
        let _ = write!(line, "  {container}");
    }
    line
}

fn container_cell(container_id: Option<&str>, exited: bool) -> String {
    match (container_id, exited) {
        (Some(id), true) => format!("{} (ended)", short_container_id(id)),
        (Some(id), false) => short_container_id(id).to_string(),
        (None, _) => "-".to_string(),
    }
}

fn more_rows(out: &mut String, rows: usize, what: &str) {
    if rows > MAX_ROWS {
        let _ = writeln!(
            out,
            "  ... and {} more {what}; vram-exporter check --json lists them all",
            rows - MAX_ROWS
        );
    }
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
