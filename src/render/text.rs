//! Render a [`Report`] for a person: an nvidia-smi-like table per GPU and, per GPU, the
//! verdict in one sentence, its notes and the command that would help. Every decision
//! (who is to blame, what would free the memory) was made by the classifier; this only
//! puts it into words.

use crate::classify::{
    short_container_id, Blindness, ChargedTo, Clue, ContainerName, Departure, Evidence, GpuAccount,
    GpuOutcome, GpuVerdict, InstanceVerdict, JobState, KillTarget, LookAgain, NarrowAccess, Note,
    NvmlFailure, NvmlStatus, Owner, Process, RecoveryAction, Remedy, Report, Seen, Sentence,
    SlurmJob, Started, StateQualifier, Suspect, UnattributedTrust, WhyUnknown, KILL_STUCK_SECONDS,
};
use crate::dates::utc_words;
use crate::units::format_bytes;
use serde::Serialize;
use std::fmt::Write;

/// What the driver requires of a GPU reset, said beside every suggestion of one.
const RESET_CONDITIONS: &str = "as root, once no process uses the GPU (stop nvidia-persistenced, DCGM and other agents holding it); it ends every MIG instance, and on NVSwitch systems the GPUs reset together";

/// Most PIDs a sentence names before it says how many more there are.
const MAX_PIDS_NAMED: usize = 8;
/// Most processes a table lists; `check --json` has all.
const MAX_ROWS: usize = 32;

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

/// A size as people compare it: `74.3 GiB (76,107 MiB)`, MiB being what nvidia-smi prints.
pub fn size_words(bytes: u64) -> String {
    if bytes < 1 << 30 {
        return format_bytes(bytes);
    }
    format!("{} ({} MiB)", format_bytes(bytes), thousands(bytes >> 20))
}

/// `76107` as `76,107`.
fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `started 2026-12-03 09:31:02 UTC`, or `started 482 s after boot`.
fn started_words(started: Started) -> String {
    match started {
        Started::At { unix_seconds } => format!("started {}", utc_words(unix_seconds)),
        Started::AfterBoot { seconds } => format!("started {seconds} s after boot"),
    }
}

/// `PID 564 (python3, sleeping, started ..., user root, parent 1, container ...)`.
fn process_words(process: &Process, extra: &[String]) -> String {
    let mut words = format!("PID {} ({}", process.pid, process.comm);
    let _ = write!(words, ", {}", process.state.words());
    if let Some(wchan) = &process.wchan {
        let _ = write!(words, " in {wchan}");
    }
    let _ = write!(words, ", {}", started_words(process.started));
    if let Some(user) = &process.user {
        let _ = write!(words, ", user {user}");
    }
    let _ = write!(words, ", parent {}", process.ppid);
    if let Some(procfs_pid) = process.procfs_pid {
        let _ = write!(words, ", PID {procfs_pid} in the procfs read");
    }
    if !process.visible_here {
        words.push_str(", not visible in this PID namespace");
    }
    words.push_str(&container_words(
        process.cgroup.container_id.as_deref(),
        process.container.as_ref(),
        pod_words(process).as_deref(),
    ));
    if process.container_ended() {
        words.push_str(if process.cgroup.container_id.is_some() {
            ", whose container has ended"
        } else {
            ", whose PID namespace has ended"
        });
    }
    if let Some(job) = &process.slurm_job {
        let _ = write!(words, ", {}", job_words(job));
        match job.state {
            JobState::Running => words.push_str(", running"),
            JobState::StepEnded => words.push_str(", a step that has ended while its job runs"),
            JobState::Ended => words.push_str(", a job that has ended"),
            JobState::Unknown => {}
        }
    }
    for part in extra {
        let _ = write!(words, ", {part}");
    }
    words.push(')');
    words
}

/// `Slurm job 4242 step 0 of user alice`.
fn job_words(job: &SlurmJob) -> String {
    let mut words = format!("Slurm job {}", job.job_id);
    if let Some(step) = &job.step {
        let _ = write!(words, " step {step}");
    }
    if let Some(user) = &job.user {
        let _ = write!(words, " of user {user}");
    }
    words
}

/// A process's pod as people know it, `ml/sglang-0`, or its uid when no name is known.
fn pod_words(process: &Process) -> Option<String> {
    match &process.pod {
        Some(pod) => Some(pod.to_string()),
        None => process.cgroup.pod_uid.clone(),
    }
}

/// `, container 3f2a9c0b1d2e, pod ml/sglang-0` for a process in a container, or
/// `, container trainer (3f2a9c0b1d2e, image pytorch/pytorch:2.4, compose project lab)`
/// where its engine named it; empty for a process on the host.
fn container_words(
    container_id: Option<&str>,
    named: Option<&ContainerName>,
    pod: Option<&str>,
) -> String {
    let mut words = String::new();
    match (container_id, named) {
        (Some(id), Some(named)) => {
            let mut about = vec![short_container_id(id).to_string()];
            if let Some(image) = &named.image {
                about.push(format!("image {image}"));
            }
            if let Some(project) = &named.compose_project {
                about.push(format!("compose project {project}"));
            }
            if let Some(pod) = &named.pod {
                about.push(format!("podman pod {pod}"));
            }
            let _ = write!(words, ", container {} ({})", named.name, about.join(", "));
        }
        (Some(id), None) => {
            let _ = write!(words, ", container {}", short_container_id(id));
        }
        (None, _) => {}
    }
    if let Some(pod) = pod {
        let _ = write!(words, ", pod {pod}");
    }
    words
}

/// The evidence against a culprit, or for a bystander, in words.
fn evidence_words(suspect: &Suspect, gpu: u32) -> Vec<String> {
    let evidence = &suspect.evidence;
    let also_session = |pid: u32| evidence.contains(&Evidence::SessionOf { pid });
    let also_group = |pid: u32| evidence.contains(&Evidence::ProcessGroupOf { pid });
    evidence
        .iter()
        .filter_map(|evidence| {
            Some(match evidence {
                Evidence::MapsGpu => format!("holds a context on GPU {gpu}: maps its device file"),
                Evidence::MapsGpuWithoutContext { access } => format!(
                    "maps GPU {gpu}'s device file {}: the driver is initialised but it holds no context",
                    match access {
                        NarrowAccess::WriteOnly => "write-only",
                        NarrowAccess::ReadOnly => "read-only",
                        NarrowAccess::NoAccess => "without access",
                    }
                ),
                Evidence::MpsControlDaemon { server } => format!(
                    "the MPS control daemon: parent of MPS server PID {server}, listed by NVML on no GPU, leading its own session; killing it frees no client's memory and ends MPS for every client"
                ),
                Evidence::MpsServer { daemon } => format!(
                    "the MPS server: on GPU {gpu}'s compute list and not its MPS list, which names the clients, child of MPS control daemon PID {daemon}; it holds every client's context, and ending it ends MPS for every client"
                ),
                Evidence::MpsCommandName => "named as MPS's processes are".into(),
                Evidence::Inherited => "inherited: NVML lists it on no GPU".into(),
                Evidence::ChildOf { pid } => format!("child of exited PID {pid}"),
                Evidence::ProcessGroupOf { pid } if also_session(*pid) => {
                    format!("in the process group and session of exited PID {pid}")
                }
                Evidence::ProcessGroupOf { pid } => {
                    format!("in the process group of exited PID {pid}")
                }
                // Said with the process group above.
                Evidence::SessionOf { pid } if also_group(*pid) => return None,
                Evidence::SessionOf { pid } => format!("in the session of exited PID {pid}"),
                Evidence::AdoptedByOwnersParent { pid, parent } => {
                    format!("adopted by PID {parent}, the parent of exited PID {pid}")
                }
                Evidence::NoContext => format!(
                    "holds the device file but maps nothing of GPU {gpu}: an NVML client such as a monitoring agent"
                ),
                Evidence::OwnerOfOtherGpus { gpus } => format!(
                    "a live job of GPU {} without a context on GPU {gpu}",
                    list(gpus.iter().map(u32::to_string))
                ),
                Evidence::KnownAgent => "a known NVML client".into(),
                Evidence::MappingsUnreadable => "its mappings could not be read".into(),
                Evidence::InstanceUnknown => {
                    "which MIG instance its context is in cannot be told".into()
                }
            })
        })
        .collect()
}

/// `1, 2 and 3`.
fn list(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    match items.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// `1, 2, 3` or `1, 2, ..., 8, and 9992 more`.
fn pid_list(pids: &[u32]) -> String {
    let mut named: Vec<String> = pids
        .iter()
        .take(MAX_PIDS_NAMED)
        .map(u32::to_string)
        .collect();
    if pids.len() > MAX_PIDS_NAMED {
        named.push(format!("and {} more", pids.len() - MAX_PIDS_NAMED));
    }
    named.join(", ")
}

/// Why a holder cannot be named, in words.
fn blindness_words(reason: Blindness) -> String {
    match reason {
        Blindness::MappingsUnreadable { processes } => format!(
            "{processes} process{} hold{} the device file, but {} mappings could not be read (run as root, or with CAP_SYS_PTRACE)",
            plural(processes, "es"),
            if processes == 1 { "s" } else { "" },
            if processes == 1 { "its" } else { "their" }
        ),
        Blindness::CulpritsNotVisible => "the processes that hold it live in another PID namespace than this one, where kill cannot reach them: run check on the host".into(),
        Blindness::WorkersNotVisible => "they live in another PID namespace than this one, where kill cannot reach them: run check on the host".into(),
        Blindness::ScanCutShort => {
            "the scan for holders ran out of time before it saw every process".into()
        }
        Blindness::ScanBlocked { seconds } => format!(
            "a /proc read has been blocked for {seconds} s, so the scan for holders did not see every process (a process in uninterruptible sleep, state D, blocks reads of its memory map)"
        ),
        Blindness::ScanDenied { processes } => format!(
            "the descriptors of {processes} process{} could not be read (run as root, or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE)",
            plural(processes, "es")
        ),
        Blindness::NoScan => "no scan for holders was made".into(),
    }
}

/// The first few suspects in words with their evidence, then how many more there are:
/// `PID 524 (...), PID 525 (...) and 3 more`.
fn suspects_words<'a>(suspects: impl IntoIterator<Item = &'a Suspect>, gpu: u32) -> String {
    let suspects: Vec<&Suspect> = suspects.into_iter().collect();
    let named: Vec<String> = suspects
        .iter()
        .take(MAX_PIDS_NAMED)
        .map(|suspect| process_words(&suspect.process, &evidence_words(suspect, gpu)))
        .collect();
    let mut words = named.join(", ");
    let more = suspects.len().saturating_sub(MAX_PIDS_NAMED);
    if more > 0 {
        let _ = write!(words, " and {more} more");
    }
    words
}

fn plural(count: u64, suffix: &str) -> &str {
    if count == 1 {
        ""
    } else {
        suffix
    }
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

/// The verdict on what `label` names (a GPU or one of its MIG instances) of GPU `index`.
fn verdict_of(label: &str, index: u32, outcome: &GpuOutcome) -> Verdict {
    let account = match outcome {
        GpuOutcome::Measured(account) => account,
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
    let notes: Vec<String> = account
        .notes
        .iter()
        .map(|note| note_words(note, account, index))
        .collect();
    let (sentence, suggestion) = match account.sentence() {
        Sentence::Idle => (format!("{label}: idle; nothing orphaned."), None),
        Sentence::WithinOverhead { used_bytes } => (
            format!(
                "{label}: {} used, within the driver's overhead; nothing orphaned.",
                size_words(used_bytes)
            ),
            None,
        ),
        Sentence::Owned { bytes, processes } => (
            format!(
                "{label}: {} owned by {processes} live process{}; nothing orphaned.",
                size_words(bytes),
                plural(processes, "es")
            ),
            None,
        ),
        Sentence::CannotTell {
            unjudged_owners,
            unattributed,
        } => (
            cannot_tell_sentence(label, &unjudged_owners, unattributed),
            None,
        ),
        Sentence::LeftBehind { bytes, witnessed } => {
            let count = account.left_behind.len() as u64;
            let mut sentence = format!(
                "{label}: {} held by {count} process{} {}left behind by a server that exited: {}; nothing orphaned",
                size_words(bytes),
                plural(count, "es"),
                if witnessed { "" } else { "possibly " },
                left_behind_words(account)
            );
            let suggestion = remedy_words(&mut sentence, index, account);
            (sentence, suggestion)
        }
        Sentence::KilledStuck { bytes, pids } => {
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
            let suggestion = remedy_words(&mut sentence, index, account);
            (sentence, suggestion)
        }
        Sentence::BeingFreed { bytes, pids } => (
            format!(
                "{label}: {} being freed: {} exiting and the driver is freeing {} memory (0.13-0.18 s after a SIGKILL on an H200); nothing orphaned.",
                size_words(bytes),
                if pids.len() == 1 {
                    format!("owner PID {} is", pids[0])
                } else {
                    format!("owner PIDs {} are", pid_list(&pids))
                },
                if pids.len() == 1 { "its" } else { "their" }
            ),
            Some(format!("vram-exporter check --gpu {index} --wait 5s")),
        ),
        Sentence::Orphaned { bytes, charged_to } => {
            let mut sentence = format!("{label}: {} held", size_words(bytes));
            sentence.push_str(&charged_to_words(&charged_to));
            let suggestion = remedy_words(&mut sentence, index, account);
            (sentence, suggestion)
        }
    };
    Verdict {
        sentence,
        notes,
        suggestion,
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
                UnattributedTrust::Blind =>
                    ", and this process cannot see other PID namespaces' processes",
                UnattributedTrust::OwnersUncertain =>
                    ", and it may belong to an owner that cannot be judged",
                UnattributedTrust::Inconsistent => ", and NVML's figures contradict each other",
                UnattributedTrust::OsManaged => {
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

/// The rest of an orphan's sentence from its remedy, and the command to suggest.
fn remedy_words(sentence: &mut String, index: u32, account: &GpuAccount) -> Option<String> {
    match &account.remedy {
        Remedy::Kill { targets } => {
            let _ = write!(
                sentence,
                "; still held by {} - killing {} should free it.",
                suspects_words(&account.culprits, index),
                them(targets)
            );
            Some(kill_line(targets, index))
        }
        Remedy::CancelJobs { jobs, targets } => {
            let cancel = list(jobs.iter().map(|job| format!("Slurm job {}", job.job_id)));
            let _ = write!(
                sentence,
                "; still held by {} - cancelling {cancel}{} should free it.",
                suspects_words(&account.culprits, index),
                match targets.as_slice() {
                    [] => String::new(),
                    [target] => format!(" and killing {}", target.pid),
                    _ => " and killing the others".to_string(),
                }
            );
            let ids: Vec<String> = jobs.iter().map(|job| job.job_id.to_string()).collect();
            let mut command = format!("scancel {}", ids.join(" "));
            if !targets.is_empty() {
                let _ = write!(command, "; kill {}", target_pids(targets));
            }
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
            Some(format!(
                "{command}   # {}; then: vram-exporter check --gpu {index} --wait 30s",
                why.join("; ")
            ))
        }
        Remedy::Wait => {
            if !account.culprits.is_empty() {
                let _ = write!(
                    sentence,
                    "; still held by {}, killed but stuck in the driver",
                    suspects_words(&account.culprits, index)
                );
            }
            sentence.push_str(
                "; a kill is delivered only when the call it waits in returns: wait, and look again.",
            );
            Some(format!("vram-exporter check --gpu {index} --wait 60s"))
        }
        Remedy::KillLeftBehind { targets } => {
            let _ = write!(sentence, " - killing {} should free it.", them(targets));
            Some(kill_line(targets, index))
        }
        Remedy::ResetOrReboot { stuck } => {
            if !account.culprits.is_empty() {
                let _ = write!(
                    sentence,
                    "; still held by {}, killed but stuck in the driver",
                    suspects_words(&account.culprits, index)
                );
            }
            let _ = write!(
                sentence,
                "; the kill has waited over {KILL_STUCK_SECONDS} s, so another kill cannot end {}: only a GPU reset, or a reboot, frees the memory.",
                if stuck.len() == 1 { "it" } else { "them" }
            );
            Some(format!(
                "nvidia-smi --gpu-reset -i {index}   # {RESET_CONDITIONS}; the driver refuses it while PID {} still hold{} the GPU: then reboot the node (after draining its workloads)",
                target_pids(stuck),
                if stuck.len() == 1 { "s" } else { "" }
            ))
        }
        Remedy::RestartMps {
            servers,
            daemons,
            clients,
        } => {
            let ends = if clients.is_empty() {
                "every client of MPS".to_string()
            } else {
                format!(
                    "every client of MPS (on GPU {index}: PID {})",
                    pid_list(clients)
                )
            };
            let _ = write!(
                sentence,
                "; no client process holds it, but the MPS server (PID {}) does: only restarting MPS frees it, which ends {ends}.",
                pid_list(servers)
            );
            Some(format!(
                "echo quit | nvidia-cuda-mps-control   # as the user of MPS control daemon PID {}, with its CUDA_MPS_PIPE_DIRECTORY; ends MPS server PID {} and {ends}; then start the daemon again (nvidia-cuda-mps-control -d) and: vram-exporter check --gpu {index} --wait 30s",
                pid_list(daemons),
                pid_list(servers)
            ))
        }
        Remedy::StopOwners { pids } => {
            let _ = write!(
                sentence,
                "; no other process holds GPU {index}'s device file, but its live owner{} (PID {}) may hold the exited owner's context too: stopping {} may free it; otherwise only a GPU reset can.",
                plural(pids.len() as u64, "s"),
                pid_list(pids),
                if pids.len() == 1 { "it" } else { "them" }
            );
            Some(format!(
                "vram-exporter check --gpu {index} --wait 60s   # after stopping PID {}",
                pid_list(pids)
            ))
        }
        Remedy::ResetGpu { blockers } if blockers.is_empty() => {
            let _ = write!(
                sentence,
                "; no process holds GPU {index}'s device file: only a GPU reset can free it."
            );
            Some(format!(
                "nvidia-smi --gpu-reset -i {index}   # {RESET_CONDITIONS}"
            ))
        }
        Remedy::ResetGpu { blockers } => {
            let _ = write!(
                sentence,
                "; no process holds a context on GPU {index}, and only NVML clients hold its device file (PID {}): only a GPU reset can free it, once they are stopped.",
                pid_list(blockers)
            );
            Some(format!(
                "nvidia-smi --gpu-reset -i {index}   # after stopping PID {}; {RESET_CONDITIONS}",
                pid_list(blockers)
            ))
        }
        Remedy::Reboot => {
            sentence.push_str(
                "; the driver asks for a reboot of the node: no kill or GPU reset frees it.",
            );
            Some("systemctl reboot   # after draining the node's workloads".to_string())
        }
        Remedy::CannotTell {
            reason: reason @ Blindness::WorkersNotVisible,
        } => {
            let _ = write!(
                sentence,
                "; no kill is suggested: {}.",
                blindness_words(*reason)
            );
            None
        }
        Remedy::CannotTell { reason } => {
            let _ = write!(
                sentence,
                "; cannot tell which process holds it: {}.",
                blindness_words(*reason)
            );
            reason.look_again().map(|how| match how {
                LookAgain::AsRoot => format!("sudo vram-exporter check --gpu {index}"),
                LookAgain::AsBefore => format!("vram-exporter check --gpu {index}"),
            })
        }
        Remedy::None => None,
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

/// `95 s`, `12 min`, `3 h 5 min`.
fn duration_words(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// `524` for one target, `them` for several.
fn them(targets: &[KillTarget]) -> String {
    match targets {
        [one] => one.pid.to_string(),
        _ => "them".to_string(),
    }
}

/// `kill 795 796   # 795 is ...; then: vram-exporter check --gpu 0 --wait 30s`.
fn kill_line(targets: &[KillTarget], index: u32) -> String {
    format!(
        "kill {}   # {}; then: vram-exporter check --gpu {index} --wait 30s",
        target_pids(targets),
        who_they_are(targets).join("; ")
    )
}

/// `795 796`: the PIDs to kill.
fn target_pids(targets: &[KillTarget]) -> String {
    let pids: Vec<String> = targets
        .iter()
        .map(|target| target.pid.to_string())
        .collect();
    pids.join(" ")
}

/// `795 is python3, started ...` for the first few targets: each names itself with its
/// start time.
fn who_they_are(targets: &[KillTarget]) -> Vec<String> {
    targets
        .iter()
        .take(MAX_PIDS_NAMED)
        .map(|target| {
            format!(
                "{} is {}, {}",
                target.pid,
                target.comm,
                started_words(target.started)
            )
        })
        .collect()
}

/// What a recovery action asks of the operator.
fn recovery_words(action: RecoveryAction) -> &'static str {
    match action {
        RecoveryAction::NoneNeeded => "nothing is needed",
        RecoveryAction::GpuReset => "end every process on the GPU and reset it",
        RecoveryAction::NodeReboot => "reboot the node",
        RecoveryAction::DrainP2p => "stop peer-to-peer traffic, then read the action again",
        RecoveryAction::DrainAndReset => "stop peer-to-peer traffic, then reset the GPU",
        RecoveryAction::RecoverImexDomain => "recover the IMEX domain (multi-node NVLink)",
        RecoveryAction::BusReset => "reset the GPU's PCIe bus",
        RecoveryAction::SystemReboot => "reboot the whole system",
        RecoveryAction::Unrecognised(_) => {
            "a value this build does not know; see the driver's documentation"
        }
    }
}

fn note_words(note: &Note, account: &GpuAccount, gpu: u32) -> String {
    match note {
        Note::DriverAsks { action } => format!(
            "The driver's recovery action for this GPU is {}: {}.",
            action.as_str(),
            recovery_words(*action)
        ),
        Note::ProcessListDenied { message } => format!(
            "NVML refused this GPU's process list ({message}): owners may be missing, so memory charged to no listed process is not called orphaned (a MIG GPU's aggregate list needs root; run as root, or read each MIG device)."
        ),
        Note::MemoryInconsistent => "NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): they are clamped to the total, and memory charged to no process is not called orphaned.".into(),
        Note::UnattributedNotCounted { bytes, trust } => match trust {
            UnattributedTrust::Blind => format!(
                "{} is charged to no visible process, but this process is not in the host PID namespace, where NVML hides other namespaces' processes: not called orphaned.",
                size_words(*bytes)
            ),
            UnattributedTrust::OsManaged => format!(
                "{} is charged to no process, but the operating system manages this GPU's memory (a coherent GPU in NUMA mode), where pages stay allocated after a process exits: not called orphaned.",
                size_words(*bytes)
            ),
            _ => format!(
                "{} is charged to no process, but an owner's usage or state cannot be told, so it may be that owner's: not called orphaned.",
                size_words(*bytes)
            ),
        },
        Note::OwnerStopped { pid, comm } => format!(
            "PID {pid} ({comm}) is stopped: its memory stays allocated until it is continued (kill -CONT {pid}) or killed."
        ),
        Note::OwnerInUninterruptibleSleep { pid, comm } => format!(
            "PID {pid} ({comm}) is in uninterruptible sleep, usually inside the driver; it cannot die until that call returns."
        ),
        Note::OwnerZombieLeader { pid, comm } => format!(
            "PID {pid} ({comm}) has a zombie main thread but live threads still hold the GPU."
        ),
        Note::OwnerUnknown { pid, detail } => format!(
            "PID {pid} cannot be judged: {}; it is counted as unknown, not as gone.",
            match detail {
                WhyUnknown::Unreadable { error } => format!("its /proc entry cannot be read ({error})"),
                WhyUnknown::NotVisible => "the procfs read shows another PID namespace, without this PID (mount this namespace's /proc, or run with the host's PID namespace)".into(),
                WhyUnknown::ContextUnreadable => "its mappings cannot be read, so whether it holds a context on this GPU cannot be told (run as root, or with CAP_SYS_PTRACE)".into(),
                WhyUnknown::NoDeviceNode => "NVML did not say which device node this GPU is".into(),
            }
        ),
        Note::OwnerPidReused { pid, was, now } => format!(
            "PID {pid}{} is gone: the PID now names {}, which holds no context on GPU {gpu}.",
            was.as_ref().map(|comm| format!(" ({comm})")).unwrap_or_default(),
            process_words(now, &[])
        ),
        Note::OwnerUsageUnavailable { pid, comm } => format!(
            "NVML cannot report the memory of PID {pid} ({}).",
            comm.as_deref().unwrap_or("?")
        ),
        Note::OwnerContainerEnded { pid, comm, cgroup } => format!(
            "PID {pid} ({comm}{}) still owns its memory although its container has ended: it survived the SIGKILL that ends a container's processes, so it is stuck (usually in the driver); if it stays, only a reboot or GPU reset frees the memory.",
            container_words(cgroup.container_id.as_deref(), None, cgroup.pod_uid.as_deref())
        ),
        Note::MoreOwnerNotes { count } => format!(
            "{count} more such notes about owners left out; vram-exporter check --json lists every owner."
        ),
        Note::MoreHoldersPossible { reason } => {
            format!("Other holders may be missing: {}.", blindness_words(*reason))
        }
        Note::CulpritsContainerEnded { pids } => format!(
            "The container of PID {} has ended, and the kernel SIGKILLs every process of a container that ends: {} survived it, so {} stuck (usually in the driver, in state D) and killing again may not free the memory; if it stays, only a reboot or GPU reset will.",
            pid_list(pids),
            if pids.len() == 1 { "it" } else { "they" },
            if pids.len() == 1 { "it is" } else { "they are" }
        ),
        Note::CulpritsLeftBySlurm { culprits } => {
            let sentences: Vec<String> = culprits
                .iter()
                .take(MAX_PIDS_NAMED)
                .map(|left| left_by_slurm_words(left.pid, &left.job))
                .collect();
            sentences.join(" ")
        }
        Note::OwnerLeftBySlurm { pid, comm, job } => format!(
            "PID {pid} ({comm}) still owns its memory although {}: Slurm left it behind and will not end it; killing it frees the memory.",
            match job.state {
                JobState::StepEnded => format!("step {} of Slurm job {} has ended", job.step.as_deref().unwrap_or("?"), job.job_id),
                _ => format!("Slurm job {} has ended", job.job_id),
            }
        ),
        Note::CulpritInUninterruptibleSleep => "A holder in uninterruptible sleep dies only when it leaves the driver call it waits in; if it never does, only a reboot or GPU reset frees the memory.".into(),
        Note::CulpritStopped => "A stopped holder still dies on SIGKILL; SIGTERM waits until it is continued.".into(),
        Note::UndeterminedHolders { pids } => format!(
            "PID {} also hold{} the device file, but {} mappings could not be read: whether {} a context cannot be told.",
            pid_list(pids),
            if pids.len() == 1 { "s" } else { "" },
            if pids.len() == 1 { "its" } else { "their" },
            if pids.len() == 1 { "it holds" } else { "they hold" }
        ),
        // The bystanders each note names are the account's, in its order.
        Note::BystandersNotBlamed { pids } => format!(
            "Not blamed, holding the device file without a context on GPU {gpu}: {}.",
            suspects_words(named(&account.bystanders, pids), gpu)
        ),
        Note::MpsNotBlamed { pids } => format!(
            "Not blamed, the MPS control daemon and server, which serve every MPS client of GPU {gpu}: {}.",
            suspects_words(named(&account.bystanders, pids), gpu)
        ),
    }
}

/// The suspects with these PIDs, in their own order.
fn named<'a>(suspects: &'a [Suspect], pids: &'a [u32]) -> impl Iterator<Item = &'a Suspect> {
    suspects
        .iter()
        .filter(|suspect| pids.contains(&suspect.process.pid))
}

/// How long something has been stuck, as a person reads it: `0.6 s`, `25 s`.
pub fn seconds_words(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{seconds:.0} s")
    }
}

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

/// Why Slurm will not end a culprit of `job`, and what to do instead.
fn left_by_slurm_words(pid: u32, job: &SlurmJob) -> String {
    let step = job.step.as_deref().unwrap_or("?");
    match job.state {
        JobState::Ended => format!(
            "PID {pid} is of Slurm job {} (step {step}), which has ended: the process survived its job, so Slurm no longer tracks it and scancel cannot end it; kill it (a process that leaves its parent escapes proctrack/linuxproc and proctrack/pgid; under proctrack/cgroup only one stuck in the driver survives).",
            job.job_id
        ),
        JobState::StepEnded => format!(
            "PID {pid} is of step {step} of Slurm job {}, which has ended while the job runs on: the process survived its step, and cancelling the job would stop its work without ending this process; kill it.",
            job.job_id
        ),
        JobState::Unknown => format!(
            "PID {pid} is of Slurm job {} (step {step}); whether Slurm still runs that step cannot be told (the look for its slurmstepd did not finish): if it does, scancel {} ends it too.",
            job.job_id, job.job_id
        ),
        JobState::Running => String::new(),
    }
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
    if !gpu.assigned_to.is_empty() {
        let pods: Vec<String> = gpu
            .assigned_to
            .iter()
            .map(|assigned| format!("{} (container {})", assigned.pod, assigned.container))
            .collect();
        let _ = writeln!(out, "  assigned to {}", pods.join(", "));
    }
    let account = match &gpu.outcome {
        GpuOutcome::Measured(account) => account,
        GpuOutcome::NotAnswering {
            call,
            stuck_seconds,
        } => {
            let _ = writeln!(
                out,
                "  (no readings: stuck {} in {call})",
                seconds_words(*stuck_seconds)
            );
            return out;
        }
        GpuOutcome::Failed { .. } => {
            let _ = writeln!(out, "  (no readings)");
            return out;
        }
    };
    let memory = account.memory;
    let _ = writeln!(
        out,
        "  used {}   reserved {}   free {}   total {}",
        size_words(memory.used),
        size_words(memory.reserved),
        size_words(memory.free),
        size_words(memory.total)
    );
    for instance in &gpu.instances {
        let _ = match instance.account() {
            Some(instance_account) => writeln!(
                out,
                "  MIG {}: used {} of {}, {} owner{}",
                instance.label(),
                size_words(instance_account.memory.used),
                size_words(instance_account.memory.total),
                instance_account.owners.len(),
                plural(instance_account.owners.len() as u64, "s")
            ),
            None => writeln!(out, "  MIG {}: (no readings)", instance.label()),
        };
    }
    if account.owners.is_empty() {
        let _ = writeln!(out, "  no processes listed by NVML");
    } else {
        let rows: Vec<Row> = account.owners.iter().map(owner_row).collect();
        table(
            &mut out,
            ["PID", "COMMAND", "STATE", "MEMORY"],
            &rows,
            "owners",
        );
    }
    for (title, suspects) in [
        (
            "holding it with a context (the culprits):",
            account.culprits.iter().collect::<Vec<_>>(),
        ),
        (
            "holding the device file without a context here (not blamed):",
            account.bystanders_apart(false).collect(),
        ),
        (
            "the MPS control daemon and server (not blamed):",
            account.bystanders_apart(true).collect(),
        ),
        (
            "holding the device file, mappings unreadable:",
            account.undetermined.iter().collect(),
        ),
    ] {
        if suspects.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {title}");
        let rows: Vec<Row> = suspects
            .iter()
            .map(|suspect| suspect_row(suspect))
            .collect();
        table(
            &mut out,
            ["PID", "COMMAND", "STATE", "PARENT"],
            &rows,
            "holders",
        );
    }
    out
}

/// One row of a process table: PID, command, state, a figure, the container, and the
/// Slurm job step.
struct Row {
    cells: [String; 4],
    container: Option<String>,
    job: Option<String>,
}

fn owner_row(owner: &Owner) -> Row {
    // The series' word first, then what it does not say: `running (sleeping)`.
    let state = owner.state().as_str();
    let state = match owner.state_qualifier() {
        None => state.to_string(),
        Some(StateQualifier::Process(process)) => format!("{state} ({})", process.words()),
        Some(StateQualifier::Reused) => format!("{state} (reused)"),
    };
    Row {
        cells: [
            owner.pid.to_string(),
            owner
                .process()
                .or(owner.exiting())
                .map_or("-", |process| process.comm.as_str())
                .to_string(),
            state,
            owner.used_bytes.map_or_else(
                || "n/a".to_string(),
                |bytes| format!("{} MiB", thousands(bytes >> 20)),
            ),
        ],
        container: owner.process().map(container_cell),
        job: owner.process().and_then(job_cell),
    }
}

fn suspect_row(suspect: &Suspect) -> Row {
    let process = &suspect.process;
    Row {
        cells: [
            process.pid.to_string(),
            process.comm.clone(),
            process.state.words().to_string(),
            process.ppid.to_string(),
        ],
        container: Some(container_cell(process)),
        job: job_cell(process),
    }
}

/// Header and rows, with a CONTAINER column when any row has a container and a JOB column
/// when any runs in a Slurm job.
fn table(out: &mut String, header: [&str; 4], rows: &[Row], what: &str) {
    let containers = rows
        .iter()
        .any(|row| row.container.as_deref().is_some_and(|cell| cell != "-"));
    let jobs = rows.iter().any(|row| row.job.is_some());
    let width = rows
        .iter()
        .filter_map(|row| row.container.as_deref())
        .map(str::len)
        .chain(["CONTAINER".len()])
        .max()
        .unwrap_or_default();
    let line = |cells: [&str; 4], container: Option<&str>, job: Option<&str>| {
        let mut line = format!(
            "  {:>8}  {:<16}  {:<28}  {:>12}",
            cells[0], cells[1], cells[2], cells[3]
        );
        if let (true, Some(container)) = (containers, container) {
            let _ = write!(line, "  {container:<width$}");
        }
        if jobs {
            let _ = write!(line, "  {}", job.unwrap_or("-"));
        }
        line.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(header, Some("CONTAINER"), Some("JOB")));
    for row in rows.iter().take(MAX_ROWS) {
        let cells = [
            row.cells[0].as_str(),
            row.cells[1].as_str(),
            row.cells[2].as_str(),
            row.cells[3].as_str(),
        ];
        let _ = writeln!(
            out,
            "{}",
            line(
                cells,
                Some(row.container.as_deref().unwrap_or("-")),
                row.job.as_deref()
            )
        );
    }
    if rows.len() > MAX_ROWS {
        let _ = writeln!(
            out,
            "  ... and {} more {what}; vram-exporter check --json lists them all",
            rows.len() - MAX_ROWS
        );
    }
}

/// A process's container by name where its engine named it, else its short id;
/// `(ended)` when it outlived it; `-` on the host.
fn container_cell(process: &Process) -> String {
    let Some(id) = process.cgroup.container_id.as_deref() else {
        return "-".to_string();
    };
    let shown = process
        .container
        .as_ref()
        .map_or_else(|| short_container_id(id), |named| named.name.as_str());
    if process.container_ended() {
        format!("{shown} (ended)")
    } else {
        shown.to_string()
    }
}

/// A process's Slurm job step as Slurm writes it, `4242.0`, `(ended)` when Slurm no
/// longer runs it.
fn job_cell(process: &Process) -> Option<String> {
    let job = process.slurm_job.as_ref()?;
    Some(match job.state {
        JobState::Running | JobState::Unknown => job.step_id(),
        JobState::StepEnded | JobState::Ended => format!("{} (ended)", job.step_id()),
    })
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
        let verdicts = std::iter::once(verdict(gpu)).chain(
            gpu.instances
                .iter()
                .map(|instance| instance_verdict(gpu, instance)),
        );
        for verdict in verdicts {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_show_mib_as_nvidia_smi_prints_them() {
        assert_eq!(size_words(76_107 << 20), "74.3 GiB (76,107 MiB)");
        assert_eq!(size_words(512), "512 B");
        assert_eq!(size_words(615 << 20), "615.0 MiB");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }
}
