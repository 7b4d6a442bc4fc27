//! The phrases every sentence is made of: sizes, dates, durations, lists of PIDs, a
//! process with what is known of it, the evidence against a holder.

use crate::classify::{
    short_container_id, Blindness, ContainerName, Ended, Evidence, JobState, KillTarget,
    NarrowAccess, Process, SlurmJob, Started, Suspect,
};
use crate::dates::utc_words;
use crate::units::format_bytes;
use std::fmt::Write;

/// Most PIDs a sentence names before it says how many more there are.
pub(super) const MAX_PIDS_NAMED: usize = 8;

/// A size as people compare it: `74.3 GiB (76,107 MiB)`, MiB being what nvidia-smi prints.
pub fn size_words(bytes: u64) -> String {
    if bytes < 1 << 30 {
        return format_bytes(bytes);
    }
    format!("{} ({} MiB)", format_bytes(bytes), thousands(bytes >> 20))
}

/// `76107` as `76,107`.
pub(in crate::render) fn thousands(value: u64) -> String {
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
pub(super) fn started_words(started: Started) -> String {
    match started {
        Started::At { unix_seconds } => format!("started {}", utc_words(unix_seconds)),
        Started::AfterBoot { seconds } => format!("started {seconds} s after boot"),
    }
}

/// `PID 564 (python3, sleeping, started ..., user root, parent 1, container ...)`.
pub(super) fn process_words(process: &Process, extra: &[String]) -> String {
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
    if let Some(ended) = process.ended() {
        words.push_str(match ended {
            Ended::Container => ", whose container has ended",
            Ended::PidNamespace => ", whose PID namespace has ended",
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
pub(super) fn job_words(job: &SlurmJob) -> String {
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
pub(super) fn container_words(
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
pub(super) fn list(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    match items.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// `1, 2, 3` or `1, 2, ..., 8, and 9992 more`.
pub(super) fn pid_list(pids: &[u32]) -> String {
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
pub(super) fn blindness_words(reason: Blindness) -> String {
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
pub(super) fn suspects_words<'a>(
    suspects: impl IntoIterator<Item = &'a Suspect>,
    gpu: u32,
) -> String {
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

pub(in crate::render) fn plural(count: u64, suffix: &str) -> &str {
    if count == 1 {
        ""
    } else {
        suffix
    }
}

/// `95 s`, `12 min`, `3 h 5 min`.
pub(super) fn duration_words(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// How long something has been stuck, as a person reads it: `0.6 s`, `25 s`.
pub fn seconds_words(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{seconds:.0} s")
    }
}

/// `524` for one target, `them` for several.
pub(super) fn them(targets: &[KillTarget]) -> String {
    match targets {
        [one] => one.pid.to_string(),
        _ => "them".to_string(),
    }
}

/// `795 796`: the PIDs to kill.
pub(super) fn target_pids(targets: &[KillTarget]) -> String {
    let pids: Vec<String> = targets
        .iter()
        .map(|target| target.pid.to_string())
        .collect();
    pids.join(" ")
}

/// `795 is python3, started ...` for the first few targets: each names itself with its
/// start time.
pub(super) fn who_they_are(targets: &[KillTarget]) -> Vec<String> {
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

/// Most PIDs a short list names before it says `+N`.
const PIDS_SHORTLY: usize = 3;

/// Why a holder cannot be named, shortly.
pub(super) fn blindness_shortly(reason: Blindness) -> &'static str {
    match reason {
        Blindness::MappingsUnreadable { .. } => "mappings unreadable",
        Blindness::CulpritsNotVisible | Blindness::WorkersNotVisible => "in another PID namespace",
        Blindness::ScanCutShort => "holder scan cut short",
        Blindness::ScanBlocked { .. } => "a /proc read blocks",
        Blindness::ScanDenied { .. } => "descriptors unreadable",
        Blindness::NoScan => "no holder scan",
    }
}

/// `524`, `524,525` or `524,525,526 +4`.
pub(in crate::render) fn pids_shortly(pids: &[u32]) -> String {
    let named: Vec<String> = pids.iter().take(PIDS_SHORTLY).map(u32::to_string).collect();
    let mut words = named.join(",");
    if pids.len() > PIDS_SHORTLY {
        words.push_str(&format!(" +{}", pids.len() - PIDS_SHORTLY));
    }
    words
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
