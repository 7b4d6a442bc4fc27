//! How a verdict says its remedy: the rest of the sentence, and the suggested command
//! line. Classify chose the case ([`Remedy`]) and the commands; each case has its fixed
//! words here.

use super::phrases::{
    blindness_shortly, blindness_words, list, pid_list, pids_shortly, plural, suspects_words,
    target_pids, them, who_they_are,
};
use crate::classify::{
    Blindness, Command, GpuAccount, KillTarget, Remedy, Suggestion, WaitOn, Whose,
    KILL_STUCK_SECONDS,
};
use std::fmt::Write;

/// What the driver requires of a GPU reset, said beside every suggestion of one.
const RESET_CONDITIONS: &str = "as root, once no process uses the GPU (stop vram-exporter itself, nvidia-persistenced, DCGM and other agents holding it); it ends every MIG instance, and on NVSwitch systems the GPUs reset together";

/// The rest of the sentence from its remedy: what holds the memory and what would free it.
pub(super) fn remedy_clause(
    sentence: &mut String,
    index: u32,
    account: &GpuAccount,
    remedy: &Remedy,
) {
    let culprits = || suspects_words(&account.culprits, index);
    match remedy {
        Remedy::None | Remedy::Wait { on: WaitOn::Free } => {}
        Remedy::Kill { targets } => {
            let _ = write!(
                sentence,
                "; still held by {} - killing {} should free it.",
                culprits(),
                them(targets)
            );
        }
        Remedy::CancelJobs { jobs, targets } => {
            let cancel = list(jobs.iter().map(|job| format!("Slurm job {}", job.job_id)));
            let _ = write!(
                sentence,
                "; still held by {} - cancelling {cancel}{} should free it.",
                culprits(),
                match targets.as_slice() {
                    [] => String::new(),
                    [target] => format!(" and killing {}", target.pid),
                    _ => " and killing the others".to_string(),
                }
            );
        }
        Remedy::Wait {
            on: WaitOn::Kill(Whose::Culprits),
        } => {
            let _ = write!(
                sentence,
                "; still held by {}, killed but stuck in the driver",
                culprits()
            );
            sentence.push_str(WAIT_FOR_THE_KILL);
        }
        Remedy::Wait {
            on: WaitOn::Kill(Whose::Owners),
        } => sentence.push_str(WAIT_FOR_THE_KILL),
        Remedy::KillLeftBehind { targets } => {
            let _ = write!(sentence, " - killing {} should free it.", them(targets));
        }
        Remedy::ResetOrReboot {
            stuck,
            whose: Whose::Culprits,
        } => {
            let _ = write!(
                sentence,
                "; still held by {}, killed but stuck in the driver",
                culprits()
            );
            sentence.push_str(&past_hope(stuck.len()));
        }
        Remedy::ResetOrReboot {
            stuck,
            whose: Whose::Owners,
        } => sentence.push_str(&past_hope(stuck.len())),
        Remedy::RestartMps {
            servers, clients, ..
        } => {
            let _ = write!(
                sentence,
                "; no client process holds it, but the MPS server (PID {}) does: only restarting MPS frees it, which ends {}.",
                pid_list(servers),
                mps_clients_words(clients, index)
            );
        }
        Remedy::StopOwners { pids } => {
            let _ = write!(
                sentence,
                "; no other process holds GPU {index}'s device file, but its live owner{} (PID {}) may hold the exited owner's context too: stopping {} may free it; otherwise only a GPU reset can.",
                plural(pids.len() as u64, "s"),
                pid_list(pids),
                if pids.len() == 1 { "it" } else { "them" }
            );
        }
        Remedy::ResetGpu { blockers } if blockers.is_empty() => {
            let _ = write!(
                sentence,
                "; no process holds GPU {index}'s device file: only a GPU reset can free it."
            );
        }
        Remedy::ResetGpu { blockers } => {
            let _ = write!(
                sentence,
                "; no process holds a context on GPU {index}, and only NVML clients hold its device file (PID {}): only a GPU reset can free it, once they are stopped.",
                pid_list(blockers)
            );
        }
        Remedy::Reboot => sentence
            .push_str("; the driver asks for a reboot of the node: no kill or GPU reset frees it."),
        Remedy::CannotTell {
            reason: reason @ Blindness::WorkersNotVisible,
        } => {
            let _ = write!(
                sentence,
                "; no kill is suggested: {}.",
                blindness_words(*reason)
            );
        }
        Remedy::CannotTell { reason } => {
            let _ = write!(
                sentence,
                "; cannot tell which process holds it: {}.",
                blindness_words(*reason)
            );
        }
    }
}

/// Said of a kill that waits in the driver.
const WAIT_FOR_THE_KILL: &str =
    "; a kill is delivered only when the call it waits in returns: wait, and look again.";

/// Said of processes whose kill has waited past hope.
fn past_hope(stuck: usize) -> String {
    format!(
        "; the kill has waited over {KILL_STUCK_SECONDS} s, so another kill cannot end {}: only a GPU reset, or a reboot, frees the memory.",
        if stuck == 1 { "it" } else { "them" }
    )
}

/// `every client of MPS (on GPU 0: PID 449)`: whom an MPS restart ends.
fn mps_clients_words(clients: &[u32], index: u32) -> String {
    if clients.is_empty() {
        "every client of MPS".to_string()
    } else {
        format!(
            "every client of MPS (on GPU {index}: PID {})",
            pid_list(clients)
        )
    }
}

/// A command as a person types it: `kill 795 796`, `echo quit | nvidia-cuda-mps-control`.
fn shell(command: &Command) -> String {
    let mut words = String::new();
    if let Some(input) = command.stdin {
        let _ = write!(words, "echo {input} | ");
    }
    words.push_str(command.program);
    for arg in &command.args {
        let _ = write!(words, " {arg}");
    }
    words
}

/// The suggested command line: the commands classify chose, with what a person needs to
/// know beside them; `None` where nothing is suggested.
/// `index` is the GPU the commands act on.
pub(super) fn suggested_line(
    remedy: &Remedy,
    suggestion: &Suggestion,
    index: u32,
) -> Option<String> {
    let run: Vec<String> = suggestion.commands.iter().map(shell).collect();
    let run = run.join("; ");
    let then = suggestion.then.as_ref().map(shell).unwrap_or_default();
    let first = || suggestion.commands.first().map(shell).unwrap_or_default();
    let second = || suggestion.commands.get(1).map(shell).unwrap_or_default();
    Some(match remedy {
        Remedy::None
        | Remedy::CannotTell {
            reason: Blindness::WorkersNotVisible,
        } => return None,
        Remedy::Kill { targets } | Remedy::KillLeftBehind { targets } => {
            format!(
                "{run}   # {}; then: {then}",
                who_they_are(targets).join("; ")
            )
        }
        Remedy::CancelJobs { jobs, targets } => {
            let mut why: Vec<String> = jobs
                .iter()
                .map(|job| {
                    let user = job
                        .user
                        .as_ref()
                        .map(|user| format!(" of user {user}"))
                        .unwrap_or_default();
                    format!(
                        "job {}{user} still runs the step{} that hold{} it: {}",
                        job.job_id,
                        if job.culprits.len() == 1 { "" } else { "s" },
                        if job.culprits.len() == 1 { "s" } else { "" },
                        who_they_are(&job.culprits).join(", ")
                    )
                })
                .collect();
            why.extend(who_they_are(targets));
            format!("{run}   # {}; then: {then}", why.join("; "))
        }
        Remedy::Wait { .. } => run,
        Remedy::ResetOrReboot { stuck, .. } => {
            format!(
                "{run}   # {RESET_CONDITIONS}; the driver refuses it while PID {} still hold{} the GPU: then reboot the node (after draining its workloads)",
                target_pids(stuck),
                if stuck.len() == 1 { "s" } else { "" }
            )
        }
        Remedy::RestartMps {
            servers,
            daemons,
            clients,
        } => {
            format!(
                "{}   # as the user of MPS control daemon PID {}, with its CUDA_MPS_PIPE_DIRECTORY; ends MPS server PID {} and {}; then start the daemon again ({}) and: {then}",
                first(),
                pid_list(daemons),
                pid_list(servers),
                mps_clients_words(clients, index),
                second()
            )
        }
        Remedy::StopOwners { pids } => format!("{then}   # after stopping PID {}", pid_list(pids)),
        Remedy::ResetGpu { blockers } if blockers.is_empty() => {
            format!("{run}   # {RESET_CONDITIONS}")
        }
        Remedy::ResetGpu { blockers } => format!(
            "{run}   # after stopping PID {}; {RESET_CONDITIONS}",
            pid_list(blockers)
        ),
        Remedy::Reboot => format!("{run}   # after draining the node's workloads"),
        Remedy::CannotTell { .. } => return (!run.is_empty()).then_some(run),
    })
}

/// What would free it, shortly, after `; `; nothing when nothing would.
pub(super) fn remedy_shortly(remedy: &Remedy, gpu: u32) -> String {
    let pids = |targets: &[KillTarget]| {
        let pids: Vec<u32> = targets.iter().map(|target| target.pid).collect();
        pids_shortly(&pids).replace(',', " ")
    };
    let words = match remedy {
        Remedy::None => return String::new(),
        Remedy::Kill { targets } | Remedy::KillLeftBehind { targets } => {
            format!("kill {}", pids(targets))
        }
        Remedy::CancelJobs { jobs, targets } => {
            let ids: Vec<String> = jobs.iter().map(|job| job.job_id.to_string()).collect();
            match targets.as_slice() {
                [] => format!("scancel {}", ids.join(" ")),
                targets => format!("scancel {}, kill {}", ids.join(" "), pids(targets)),
            }
        }
        Remedy::Wait { .. } => "wait".into(),
        Remedy::ResetOrReboot { .. } => format!("reset GPU {gpu} or reboot"),
        Remedy::RestartMps { .. } => "restart MPS".into(),
        Remedy::StopOwners { pids: owners } => {
            format!("stop {}", pids_shortly(owners).replace(',', " "))
        }
        Remedy::ResetGpu { .. } => format!("reset GPU {gpu}"),
        Remedy::Reboot => "reboot".into(),
        Remedy::CannotTell { reason } => format!("holder unknown: {}", blindness_shortly(*reason)),
    };
    format!("; {words}")
}
