//! A verdict's notes, a line each: the facts classify chose to note, in words.

use super::phrases::{
    blindness_words, container_words, pid_list, process_words, size_words, suspects_words,
    MAX_PIDS_NAMED,
};
use crate::classify::{
    GpuAccount, LeftBySlurm, NotCounted, Note, RecoveryAction, SlurmEnded, SlurmJob, Suspect,
    WhyUnknown,
};

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

pub(super) fn note_words(note: &Note, account: &GpuAccount, gpu: u32) -> String {
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
            NotCounted::Blind => format!(
                "{} is charged to no visible process, but this process is not in the host PID namespace, where NVML hides other namespaces' processes: not called orphaned.",
                size_words(*bytes)
            ),
            NotCounted::OsManaged => format!(
                "{} is charged to no process, but the operating system manages this GPU's memory (a coherent GPU in NUMA mode), where pages stay allocated after a process exits: not called orphaned.",
                size_words(*bytes)
            ),
            NotCounted::OwnersUncertain => format!(
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
        Note::OwnerUnwatched { owner } => format!(
            "PID {} ({}) lives on after the leader of its process group, PID {}, exited, adopted by PID {}, as a killed server's worker would; this look went by no witness state, so it could not have seen a server killed: an exporter serving on this host would have (--path.state).",
            owner.pid, owner.comm, owner.group_leader, owner.adopted_by
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
                .map(|left| left_by_slurm_words(left.pid, &left.job, left.why))
                .collect();
            sentences.join(" ")
        }
        Note::OwnerLeftBySlurm { pid, comm, job, ended } => format!(
            "PID {pid} ({comm}) still owns its memory although {}: Slurm left it behind and will not end it; killing it frees the memory.",
            match ended {
                SlurmEnded::Step => format!("step {} of Slurm job {} has ended", job.step.as_deref().unwrap_or("?"), job.job_id),
                SlurmEnded::Job => format!("Slurm job {} has ended", job.job_id),
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

/// Why Slurm will not end a culprit of `job`, and what to do instead.
fn left_by_slurm_words(pid: u32, job: &SlurmJob, why: LeftBySlurm) -> String {
    let step = job.step.as_deref().unwrap_or("?");
    match why {
        LeftBySlurm::Ended(SlurmEnded::Job) => format!(
            "PID {pid} is of Slurm job {} (step {step}), which has ended: the process survived its job, so Slurm no longer tracks it and scancel cannot end it; kill it (a process that leaves its parent escapes proctrack/linuxproc and proctrack/pgid; under proctrack/cgroup only one stuck in the driver survives).",
            job.job_id
        ),
        LeftBySlurm::Ended(SlurmEnded::Step) => format!(
            "PID {pid} is of step {step} of Slurm job {}, which has ended while the job runs on: the process survived its step, and cancelling the job would stop its work without ending this process; kill it.",
            job.job_id
        ),
        LeftBySlurm::Unknown => format!(
            "PID {pid} is of Slurm job {} (step {step}); whether Slurm still runs that step cannot be told (the look for its slurmstepd did not finish): if it does, scancel {} ends it too.",
            job.job_id, job.job_id
        ),
    }
}
