//! Pure functions from one [`Observation`] to the whole verdict per GPU, as data: who owns
//! the memory and in which state, how much no live process owns and why, which process
//! keeps it (with the evidence) and which merely watches, what would free it, and what
//! `check` exits with. The renderers put this into words and series and decide nothing.
//!
//! One folder per job, each importing only those below it:
//! - `processes/`: who a process is (identity, start time, container, pod, Slurm job);
//! - `owners/`: the verdict on each process NVML charges, and after a kill
//!   (`owners/after_kill.rs`): workers left behind, kills stuck in the driver;
//! - `holders/`: who holds a GPU's device files (culprits, bystanders, MPS parts) and
//!   what the holder scan could not see;
//! - `account/`: each GPU's memory account, one method per figure;
//! - `verdict/`: what an account amounts to (`finding.rs`), what frees it (`remedy.rs`,
//!   `commands.rs`) and the notes (`notes.rs`), each decider with its own types;
//! - `report.rs` the host's verdict, `selection.rs` what `check` reports of the GPUs
//!   asked about; [`classify`] here walks the GPUs.

pub mod account;
mod exporter_process;
pub mod holders;
pub mod owners;
pub mod processes;
mod report;
mod selection;
mod settings;
#[cfg(test)]
pub(crate) mod tests;
pub mod verdict;

use account::{account_for_gpu, AccountScope, HostContext};
pub use account::{
    GpuAccount, LeftBehindBytes, NotCounted, OrphanReason, StateTally, UnattributedTrust,
};
pub use exporter_process::{exporter_process, ExporterProcess};
pub use holders::scan::{Blindness, ScanSummary};
use holders::Within;
pub use holders::{Evidence, Role, Suspect};
pub use owners::after_kill::{killed_stuck, KilledStuck, LeftBehindOwner, KILL_STUCK_SECONDS};
pub use owners::{
    judge_owner, GoneReason, Owner, OwnerState, Standing, StateQualifier, WhyGone, WhyUnknown,
    ENDING_AT_MOST_MILLIS, FREEING_MEASURED,
};
pub use processes::pods::{GpuPod, KubernetesView, PodName};
pub use processes::slurm::{JobState, LeftBySlurm, SlurmEnded, SlurmJob};
pub use processes::{
    Ended, KillTarget, Process, ProcessLens, ProcessState, Started, WitnessedFact,
};
pub use report::{
    orphaned_bytes_of, AssignedPod, GpuOutcome, GpuVerdict, Health, InstanceVerdict, Judged,
    MigMode, NvmlStatus, Report, Sight, Written,
};
pub use selection::{ForeignOwner, GpuName, Headed, Headline, HeldAs, NoSuchGpu, Selection};
pub use settings::Settings;
pub use verdict::commands::{Command, Suggestion};
pub use verdict::finding::{ChargedTo, CheckStatus, Departure, Finding, FindingKind, Owned};
pub use verdict::notes::{CulpritLeftBySlurm, Note};
pub use verdict::remedy::{JobToCancel, Remedy, WaitOn, Whose};
use verdict::Circumstances;
pub use verdict::Verdict;

use crate::observe::{GpuReading, GpuState, NvmlProcess, NvmlReading, Observation, ProcessList};
use std::collections::BTreeMap;

// What the verdict carries of the observation, named here so that the renderers need
// nothing from `observe`.
pub use crate::observe::containers::{ContainerName, Engine, EngineError, EngineHealth};
pub use crate::observe::health::CallHealth;
pub use crate::observe::kubernetes::{KubeletSource, SourceError, SourceHealth};
pub use crate::observe::procfs::short_container_id;
pub use crate::observe::witness::NoState;
pub use crate::observe::{
    CgroupAttribution, GpuError, Identity, Leader, Lineage, MemoryReading, NamespaceInit,
    NarrowAccess, NodeSet, NvmlFailure, NvmlLists, ProcfsView, RecoveryAction, References,
    Relative, RemappedRows, RetiredPages, StuckCall, StuckRead, WitnessReading, XidReading,
};

/// Classify a whole observation.
pub fn classify(observation: &Observation, settings: &Settings) -> Report {
    let kubernetes = observation
        .kubernetes
        .as_ref()
        .filter(|kubernetes| kubernetes.shown())
        .map(|kubernetes| processes::pods::kubernetes_view(kubernetes, &observation.nvml));
    let lens = ProcessLens {
        boot_time_unix_seconds: observation.boot_time_unix_seconds,
        ticks_per_second: observation.clock_ticks_per_second,
        procfs_view: observation.procfs_view,
        slurm: observation.slurm.as_ref(),
        containers: observation.containers.as_ref(),
        kubernetes: kubernetes.as_ref(),
        witness: observation
            .witness
            .as_ref()
            .map(|reading| &*reading.witnessed),
        now_unix_millis: observation.taken_at_unix_millis(),
    };
    let scan = scan_summary(observation);
    let (nvml, mut gpus) = match &observation.nvml {
        NvmlReading::Up {
            driver_version,
            gpus,
        } => (
            NvmlStatus::Up {
                driver_version: driver_version.clone(),
            },
            gpu_verdicts(gpus, observation, settings, &lens, scan),
        ),
        NvmlReading::Down {
            error,
            reason,
            stuck,
        } => (
            NvmlStatus::Down {
                error: error.clone(),
                reason: *reason,
                stuck: stuck.clone(),
            },
            Vec::new(),
        ),
    };
    if let Some(view) = &kubernetes {
        assign_pods(&mut gpus, view);
    }
    Report {
        nvml,
        host_pid_namespace: observation.host_pid_namespace,
        procfs_view: observation.procfs_view,
        gpus,
        procfs_errors: observation.procfs_errors,
        holder_scan: scan,
        procfs_stuck: observation.procfs_stuck.clone(),
        kubernetes,
        container_engines: observation
            .containers
            .as_ref()
            .map(|reading| reading.engines.clone()),
        exporter_process: observation.own_process.as_ref().map(exporter_process),
        witness: observation.witness.clone(),
    }
}

/// The holder scan as the verdict and the exporter's series state it.
fn scan_summary(observation: &Observation) -> Option<ScanSummary> {
    observation.holder_scan.as_ref().map(|scan| ScanSummary {
        cut_short: scan.cut_short,
        permission_errors: scan.permission_errors,
        duration_seconds: scan.duration_seconds,
        // A scan cut short while the reader was stuck was cut short by the blocked read.
        blocked_seconds: observation
            .procfs_stuck
            .as_ref()
            .filter(|_| scan.cut_short)
            .map(|stuck| stuck.stuck_seconds as u64),
    })
}

/// The verdict on every GPU NVML answered for: owners first, for every GPU, since a
/// holder of one GPU may be another's owner; then each GPU's account against them all.
fn gpu_verdicts(
    gpus: &[GpuReading],
    observation: &Observation,
    settings: &Settings,
    lens: &ProcessLens,
    scan: Option<ScanSummary>,
) -> Vec<GpuVerdict> {
    let judged: Vec<Option<Vec<Owner>>> = gpus
        .iter()
        .map(|gpu| match &gpu.state {
            GpuState::Ok { processes, .. } => {
                Some(judge_owners(processes, gpu.minor, observation, lens))
            }
            GpuState::Failed { .. } | GpuState::NotAnswering { .. } => None,
        })
        .collect();
    let mut live_owner_gpus: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (gpu, owners) in gpus.iter().zip(&judged) {
        for owner in owners
            .iter()
            .flatten()
            .filter(|owner| owner.state().is_live())
        {
            let gpus = live_owner_gpus.entry(owner.pid).or_default();
            if !gpus.contains(&gpu.index) {
                gpus.push(gpu.index);
            }
        }
    }
    let host = HostContext {
        observation,
        settings,
        lens,
        scan,
        live_owner_gpus,
        listed: observation.nvml.listed_pids().into_keys().collect(),
    };
    gpus.iter()
        .zip(judged)
        .map(|(gpu, owners)| GpuVerdict {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            name: gpu.name.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            minor: gpu.minor,
            assigned_to: Vec::new(),
            outcome: match (&gpu.state, owners) {
                (GpuState::Ok { memory, processes }, Some(owners)) => judge(
                    *memory,
                    owners,
                    scope_of(gpu, processes, Within::Gpu),
                    &host,
                ),
                (GpuState::Ok { .. }, None) => {
                    unreachable!("owners are judged for every GPU that answered")
                }
                (state, _) => unanswered(state),
            },
            instances: instance_verdicts(gpu, &host),
            mig: gpu.mig.as_ref().map(|mig| MigMode {
                enabled: mig.enabled,
                pending: mig.pending,
            }),
            health: Health::of(&gpu.health),
        })
        .collect()
}

/// The account of one GPU or MIG instance, and the verdict on it.
fn judge(
    memory: MemoryReading,
    owners: Vec<Owner>,
    scope: AccountScope,
    host: &HostContext<'_>,
) -> GpuOutcome {
    let circumstances = Circumstances {
        scan: host.scan,
        recovery: scope.recovery,
        taken_at: host.observation.taken_at_unix_seconds,
        gpu: scope.index,
        // A look that went by no witness state cannot have seen a server killed.
        unwatched: host
            .observation
            .witness
            .as_ref()
            .is_some_and(|witness| witness.no_state.is_some()),
    };
    let account = account_for_gpu(memory, owners, scope, host);
    let verdict = Verdict::of(&account, circumstances);
    GpuOutcome::Measured(Box::new(Judged { account, verdict }))
}

/// What an account of `gpu` (or of one MIG instance of it) covers.
fn scope_of(gpu: &GpuReading, processes: &ProcessList, within: Within) -> AccountScope {
    AccountScope {
        index: gpu.index,
        minor: gpu.minor,
        denied: processes.denied().map(str::to_string),
        within,
        recovery: gpu.health.recovery_action,
        os_managed: gpu.health.numa_node.is_some(),
    }
}

/// The outcome of a GPU or MIG device whose readings did not succeed.
fn unanswered(state: &GpuState) -> GpuOutcome {
    match state {
        GpuState::Failed { error, message } => GpuOutcome::Failed {
            error: *error,
            message: message.clone(),
        },
        GpuState::NotAnswering {
            call,
            stuck_seconds,
        } => GpuOutcome::NotAnswering {
            call: call.clone(),
            stuck_seconds: *stuck_seconds,
        },
        GpuState::Ok { .. } => unreachable!("a GPU that answered has an account"),
    }
}

/// Every MIG instance of `gpu` judged as a GPU of its own: its owners by their mappings of
/// the GPU's node, its culprits among the holders of its capability nodes. NVML lists MIG
/// devices only while MIG is enabled.
fn instance_verdicts(gpu: &GpuReading, host: &HostContext<'_>) -> Vec<InstanceVerdict> {
    let Some(mig) = gpu.mig.as_ref() else {
        return Vec::new();
    };
    mig.devices
        .iter()
        .map(|device| InstanceVerdict {
            index: device.index,
            uuid: device.uuid.clone(),
            name: device.name.clone(),
            profile: device.profile.clone(),
            gpu_instance_id: device.gpu_instance_id,
            compute_instance_id: device.compute_instance_id,
            outcome: match &device.state {
                GpuState::Ok { memory, processes } => {
                    let owners = judge_owners(processes, gpu.minor, host.observation, host.lens);
                    let within = match &device.capabilities {
                        Some(caps) => Within::Instance(
                            caps.gpu_instance
                                .into_iter()
                                .chain(caps.compute_instance)
                                .collect(),
                        ),
                        None => Within::UnknownInstance,
                    };
                    judge(*memory, owners, scope_of(gpu, processes, within), host)
                }
                state => unanswered(state),
            },
        })
        .collect()
}

fn judge_owners(
    processes: &ProcessList,
    minor: Option<u32>,
    observation: &Observation,
    lens: &ProcessLens,
) -> Vec<Owner> {
    // A snapshot may list a PID twice; the live reading never does.
    NvmlProcess::distinct(processes.entries().iter().copied())
        .iter()
        .map(|process| judge_owner(process, observation.owners.get(&process.pid), minor, lens))
        .collect()
}

/// The pods each GPU is assigned to. Every process the verdicts mention carries its own
/// pod already: it is named where the process is made ([`Process::new`]), so that no copy
/// of one can miss it.
fn assign_pods(gpus: &mut [GpuVerdict], view: &KubernetesView) {
    for gpu in gpus {
        gpu.assigned_to = view
            .gpu_pods
            .iter()
            .filter(|assigned| assigned.gpu == gpu.index)
            .map(|assigned| AssignedPod {
                pod: PodName {
                    namespace: assigned.namespace.clone(),
                    name: assigned.pod.clone(),
                },
                container: assigned.container.clone(),
            })
            .collect();
    }
}
