//! A verdict's sentence: what the GPU's memory amounts to, whom it is charged to and what
//! holds it, in the case classify chose; and the same finding shortly, for the summary
//! line. Every word of a finding is here.

use super::notes::note_words;
use super::phrases::{
    blindness_shortly, duration_words, list, pid_list, pids_shortly, plural, process_words,
    seconds_words, size_words, started_words, MAX_PIDS_NAMED,
};
use super::remedy::{remedy_clause, remedy_shortly, suggested_line};
use crate::classify::owners::after_kill::{Clue, Seen};
use crate::classify::{
    ChargedTo, Departure, Finding, GpuAccount, GpuOutcome, GpuVerdict, InstanceVerdict, NotCounted,
    Owned, Owner, Process, Remedy, UnattributedTrust, Verdict as Decided, FREEING_MEASURED,
};
use crate::dates::utc_words;
use crate::units::format_bytes;
use serde::Serialize;
use std::fmt::Write;

/// The verdict on one GPU in words, with the command that would help, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// One sentence for a person.
    pub sentence: String,
    /// Further facts worth a line each.
    pub notes: Vec<String>,
    /// A command the person may run; the exporter never runs it.
    pub suggestion: Option<String>,
}

/// The verdict for one GPU.
pub fn verdict(gpu: &GpuVerdict) -> Verdict {
    verdict_of(&format!("GPU {}", gpu.index), gpu.index, &gpu.outcome)
}

/// The verdict for one MIG instance of `gpu`.
pub fn instance_verdict(gpu: &GpuVerdict, instance: &InstanceVerdict) -> Verdict {
    verdict_of(
        &format!("GPU {} MIG ({})", gpu.index, instance.label()),
        gpu.index,
        &instance.outcome,
    )
}

/// The verdict for the GPU, then for each of its MIG instances.
pub fn verdicts(gpu: &GpuVerdict) -> impl Iterator<Item = Verdict> + '_ {
    gpu.outcomes().map(move |(instance, _)| match instance {
        None => verdict(gpu),
        Some(instance) => instance_verdict(gpu, instance),
    })
}

/// The verdict on what `label` names (a GPU or one of its MIG instances) of GPU `index`.
fn verdict_of(label: &str, index: u32, outcome: &GpuOutcome) -> Verdict {
    let (account, verdict) = match outcome {
        GpuOutcome::Measured(judged) => (&judged.account, &judged.verdict),
        GpuOutcome::NotAnswering {
            call,
            stuck_seconds,
        } => {
            return Verdict {
                sentence: format!(
                    "{label} does not answer NVML (stuck {} in {call}): cannot tell.",
                    seconds_words(*stuck_seconds)
                ),
                notes: vec![
                    "NVML calls that block like this come with a GPU that fell off the bus (Xid 79) or a wedged driver: look for Xid errors in the kernel log (dmesg). This GPU is asked nothing more until the call returns; the other GPUs are judged as usual.".into(),
                ],
                suggestion: None,
            };
        }
        GpuOutcome::Failed { error, message } => {
            return Verdict {
                sentence: format!(
                    "{label}: cannot tell: NVML cannot read it ({}: {message}); its memory is unknown.",
                    error.as_str()
                ),
                notes: vec![
                    "A lost GPU or one that needs a reset answers again only after a reset, once every process using it has stopped.".into(),
                ],
                suggestion: None,
            };
        }
    };
    let notes: Vec<String> = verdict
        .notes
        .iter()
        .map(|note| note_words(note, account, index))
        .collect();
    let remedy = &verdict.remedy;
    let sentence = match verdict.finding.clone() {
        Finding::Idle => format!("{label}: idle; nothing orphaned."),
        Finding::Owned(Owned::WithinOverhead { used_bytes }) => format!(
            "{label}: {} used, within the driver's overhead; nothing orphaned.",
            size_words(used_bytes)
        ),
        Finding::Owned(Owned::ByLiveOwners { bytes, processes }) => format!(
            "{label}: {} owned by {processes} live process{}; nothing orphaned.",
            size_words(bytes),
            plural(processes, "es")
        ),
        Finding::CannotTell {
            unjudged_owners,
            unattributed,
        } => cannot_tell_sentence(label, &unjudged_owners, unattributed),
        Finding::LeftBehind {
            bytes,
            witnessed_processes,
            possibly_processes,
        } => {
            let held = |bytes: u64, processes: u64| {
                format!(
                    "{} held by {processes} process{}",
                    size_words(bytes),
                    plural(processes, "es")
                )
            };
            let whose = match (witnessed_processes, possibly_processes) {
                (0, possibly) => format!(
                    "{} possibly left behind by a server that exited",
                    held(bytes.possibly, possibly)
                ),
                (witnessed, 0) => format!(
                    "{} left behind by a server that exited",
                    held(bytes.witnessed, witnessed)
                ),
                (witnessed, possibly) => format!(
                    "{} left behind by a server that exited, and {} possibly",
                    held(bytes.witnessed, witnessed),
                    held(bytes.possibly, possibly)
                ),
            };
            let mut sentence = format!(
                "{label}: {whose}: {}; nothing orphaned",
                left_behind_words(account)
            );
            remedy_clause(&mut sentence, index, account, remedy);
            sentence
        }
        Finding::KilledStuck { bytes, pids } => {
            let killed = list(
                account
                    .owners
                    .iter()
                    .filter(|owner| pids.contains(&owner.pid))
                    .filter_map(Owner::process)
                    .map(killed_words),
            );
            let mut sentence = format!(
                "{label}: {} held by {} killed but stuck in the driver (a SIGKILL pending in uninterruptible sleep): {}",
                size_words(bytes),
                if pids.len() == 1 {
                    format!("PID {}, which was", pids[0])
                } else {
                    format!("PIDs {}, which were", pid_list(&pids))
                },
                killed
            );
            remedy_clause(&mut sentence, index, account, remedy);
            sentence
        }
        Finding::BeingFreed { bytes, pids } => format!(
            "{label}: {} being freed: {} exiting and the driver is freeing {} memory ({FREEING_MEASURED}); nothing orphaned.",
            size_words(bytes),
            if pids.len() == 1 {
                format!("owner PID {} is", pids[0])
            } else {
                format!("owner PIDs {} are", pid_list(&pids))
            },
            if pids.len() == 1 { "its" } else { "their" }
        ),
        Finding::Orphaned { bytes, charged_to } => {
            let mut sentence = format!("{label}: {} held", size_words(bytes));
            sentence.push_str(&charged_to_words(&charged_to));
            remedy_clause(&mut sentence, index, account, remedy);
            sentence
        }
    };
    Verdict {
        sentence,
        notes,
        suggestion: suggested_line(remedy, &verdict.suggestion, index),
    }
}

fn cannot_tell_sentence(
    label: &str,
    unjudged_owners: &[u32],
    unattributed: Option<(u64, UnattributedTrust)>,
) -> String {
    let mut reasons = Vec::new();
    if !unjudged_owners.is_empty() {
        reasons.push(format!(
            "owner{} {} cannot be judged",
            plural(unjudged_owners.len() as u64, "s"),
            pid_list(unjudged_owners)
        ));
    }
    if let Some((bytes, trust)) = unattributed {
        reasons.push(format!(
            "{} is charged to no visible process{}",
            size_words(bytes),
            match trust {
                UnattributedTrust::NotCounted(NotCounted::Blind) =>
                    ", and this process cannot see other PID namespaces' processes",
                UnattributedTrust::NotCounted(NotCounted::OwnersUncertain) =>
                    ", and it may belong to an owner that cannot be judged",
                UnattributedTrust::Inconsistent => ", and NVML's figures contradict each other",
                UnattributedTrust::NotCounted(NotCounted::OsManaged) => {
                    ", and the operating system manages this GPU's memory, where pages stay allocated after a process exits"
                }
                UnattributedTrust::Counted => "",
            }
        ));
    }
    format!(
        "{label}: cannot tell: {}; nothing is called orphaned.",
        reasons.join("; ")
    )
}

/// ` for exited PID 503`, ` but charged to no process`.
fn charged_to_words(charged_to: &ChargedTo) -> String {
    match charged_to {
        ChargedTo::Nobody => " but charged to no process".into(),
        ChargedTo::GoneOwners { pids, departure } => {
            let departure = match departure {
                Departure::Exited => "exited",
                Departure::Gone => "gone",
            };
            match pids.as_slice() {
                [pid] => format!(" for {departure} PID {pid}"),
                pids => format!(" for {departure} PIDs {}", pid_list(pids)),
            }
        }
    }
}

/// Each left-behind owner in words, with whose worker it was and how that is known.
fn left_behind_words(account: &GpuAccount) -> String {
    let named: Vec<String> = account
        .left_behind
        .iter()
        .take(MAX_PIDS_NAMED)
        .map(|owner| {
            let whose = match &owner.seen {
                Seen::ParentExited {
                    parent,
                    exit_seen_unix_seconds,
                    alone_seconds,
                } => {
                    let mut about = vec![];
                    if let Some(comm) = &parent.comm {
                        about.push(comm.clone());
                    }
                    if let Some(started) = parent.started {
                        about.push(started_words(started));
                    }
                    let mut words = format!("a worker of PID {}", parent.pid);
                    if !about.is_empty() {
                        let _ = write!(words, " ({})", about.join(", "));
                    }
                    let _ = write!(
                        words,
                        ", which exited (seen {})",
                        utc_words(*exit_seen_unix_seconds)
                    );
                    if let Some(seconds) = alone_seconds {
                        let _ = write!(words, "; alone for {}", duration_words(*seconds));
                    }
                    words
                }
                Seen::Possibly {
                    group_leader,
                    adopted_by,
                    adopted_by_comm,
                    clue,
                } => format!(
                    "possibly left behind: {}, and the leader of its process group, PID {group_leader} (the process that started it), has exited; adopted by PID {adopted_by}{}",
                    match clue {
                        Clue::SpawnedWorker => "a worker spawned by Python's multiprocessing, never meant to run without its parent",
                        Clue::PipesToParentClosed => "a worker whose pipes to the process that started it lead to no live process, as a multiprocessing worker's do once its parent is gone",
                        Clue::JobLeaderGone => "a member of a shell's job",
                    },
                    adopted_by_comm
                        .as_ref()
                        .map(|comm| format!(" ({comm})"))
                        .unwrap_or_default()
                ),
            };
            process_words(&owner.process, &[whose])
        })
        .collect();
    let mut words = list(named);
    let more = account.left_behind.len().saturating_sub(MAX_PIDS_NAMED);
    if more > 0 {
        let _ = write!(words, " and {more} more");
    }
    words
}

/// A killed process's wait: `PID 454 (python3) in uvm_wait since 2026-12-05 ... (95 s)`.
fn killed_words(process: &Process) -> String {
    let mut words = format!("PID {} ({})", process.pid, process.comm);
    if let Some(wchan) = &process.wchan {
        let _ = write!(words, " in {wchan}");
    }
    if let Some(since) = process.kill_pending_since_unix_seconds {
        let _ = write!(words, ", killed since {}", utc_words(since));
    }
    words
}

/// A finding shortly, for the summary line of at most 80 bytes: `{name} orphaned: {held},
/// held by PID 524; kill 524`. `held` is the memory to free, in words.
pub(in crate::render) fn finding_shortly(
    name: &str,
    held: &str,
    gpu: u32,
    account: &GpuAccount,
    verdict: &Decided,
) -> String {
    let remedy = &verdict.remedy;
    match &verdict.finding {
        Finding::Orphaned { charged_to, .. } => format!(
            "{name} orphaned: {held}, {}{}",
            orphan_shortly(account, charged_to),
            remedy_shortly(remedy, gpu)
        ),
        Finding::LeftBehind { .. } => format!(
            "{name} left behind: {held}, workers of an exited server{}",
            remedy_shortly(remedy, gpu)
        ),
        Finding::KilledStuck { pids, .. } => format!(
            "{name} kill stuck: {held}, PID {} in the driver{}",
            pids_shortly(pids),
            remedy_shortly(remedy, gpu)
        ),
        Finding::BeingFreed { pids, .. } => format!(
            "{name} being freed: {held}, PID {} exiting",
            pids_shortly(pids)
        ),
        Finding::CannotTell {
            unjudged_owners,
            unattributed,
        } => format!(
            "{name} cannot tell: {} used, {}",
            format_bytes(account.memory.used),
            cannot_tell_shortly(remedy, unjudged_owners, unattributed.is_some())
        ),
        Finding::Idle | Finding::Owned(_) => format!("{name} clear"),
    }
}

/// Who orphaned memory is charged to, or who holds it.
fn orphan_shortly(account: &GpuAccount, charged_to: &ChargedTo) -> String {
    if let Some(culprit) = account.culprits.first() {
        let more = account.culprits.len() - 1;
        return match more {
            0 => format!("held by PID {}", culprit.process.pid),
            more => format!("held by PID {} +{more}", culprit.process.pid),
        };
    }
    match charged_to {
        ChargedTo::GoneOwners {
            pids,
            departure: Departure::Exited,
        } => format!("owner {} exited", pids_shortly(pids)),
        ChargedTo::GoneOwners { pids, .. } => format!("owner {} gone", pids_shortly(pids)),
        ChargedTo::Nobody => "charged to no process".into(),
    }
}

/// Why memory cannot be judged, shortly.
fn cannot_tell_shortly(remedy: &Remedy, unjudged_owners: &[u32], unattributed: bool) -> String {
    if let Remedy::CannotTell { reason } = remedy {
        return blindness_shortly(*reason).into();
    }
    if !unjudged_owners.is_empty() {
        format!("owner {} unreadable", pids_shortly(unjudged_owners))
    } else if unattributed {
        "no visible owner".into()
    } else {
        "not judged".into()
    }
}
