//! Render a [`Report`] as JSON for scripts (`check --json`): the classifier's verdict as
//! data, with the same words `check` prints.
//!
//! The classifier's types serialise themselves where scripts read them as they are
//! (owners, holders, remedies, notes, a MIG instance's account). The document and each
//! GPU in it are shaped here, because their keys are a contract older than the types:
//! NVML's answer as three keys, one object per GPU whether or not it answered (`error` or
//! `memory` null), the account's figures flat beside the sentence `check` prints.

use super::words::{instance_verdict, verdict, Verdict};
use crate::classify::{
    AssignedPod, CheckStatus, FindingKind, GpuAccount, GpuError, GpuVerdict, InstanceVerdict,
    LeftBehindOwner, MemoryReading, Note, NvmlFailure, Owner, OwnerState, ProcfsView, Remedy,
    ScanSummary, Selection, StuckCall, StuckRead, Suggestion, Suspect, WitnessReading,
};
use serde::Serialize;
use std::collections::BTreeMap;
use strum::VariantArray;

/// The whole document.
#[derive(Debug, Serialize)]
pub struct CheckDocument<'a> {
    /// What `check` reports for the GPUs shown, as its exit status says it.
    pub status: CheckStatus,
    /// Whether NVML answered.
    pub nvml_up: bool,
    /// Why it did not.
    pub nvml_error: Option<&'a str>,
    /// The kind of failure, when NVML did not answer (as `vram_nvml_error` labels it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_failure: Option<NvmlFailure>,
    /// The call NVML is stuck in, when it does not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_stuck: Option<&'a StuckCall>,
    /// The `/proc` reader, when it had not returned at the look's deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub procfs_stuck: Option<&'a StuckRead>,
    /// Driver version.
    pub driver_version: Option<&'a str>,
    /// Whether we run in the host PID namespace (`null`: could not tell).
    pub host_pid_namespace: Option<bool>,
    /// Whether the procfs read shows our own PID namespace (`own`) or another (`foreign`).
    pub procfs_view: ProcfsView,
    /// The holder scan, when one ran.
    pub holder_scan: Option<ScanSummary>,
    /// The witness state the look went by: its file, when it was written, or why there
    /// was none to go by (`no_state`). Each process says which of its facts came from it
    /// (`from_witness`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witness: Option<&'a WitnessReading>,
    /// Orphaned bytes over the GPUs shown.
    pub orphaned_bytes: u64,
    /// One entry per GPU shown.
    pub gpus: Vec<GpuDocument<'a>>,
}

/// One GPU.
#[derive(Debug, Serialize)]
pub struct GpuDocument<'a> {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: &'a str,
    /// Product name.
    pub name: &'a str,
    /// PCI bus id.
    pub pci_bus_id: &'a str,
    /// Minor number of the device node.
    pub minor: Option<u32>,
    /// What `check` reports for this GPU.
    pub status: CheckStatus,
    /// The containers the kubelet assigned it to.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub assigned_to: &'a [AssignedPod],
    /// The failure, when the GPU did not answer (`timeout` for one that is stuck).
    pub error: Option<GpuError>,
    /// The call it is stuck in and for how long, when it does not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_answering: Option<NotAnswering<'a>>,
    /// Memory figures, when it did (clamped to the total; see `memory_inconsistent`).
    pub memory: Option<MemoryReading>,
    /// NVML's memory figures contradicted each other and were clamped (only when true).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub memory_inconsistent: bool,
    /// What the verdict amounts to, when the GPU answered.
    pub finding: Option<FindingKind>,
    /// Owners with their verdicts.
    pub owners: &'a [Owner],
    /// Processes and bytes per owner state.
    pub owners_by_state: BTreeMap<&'static str, StateDocument>,
    /// Bytes charged to gone owners.
    pub orphaned_owner_gone_bytes: u64,
    /// Unattributed bytes counted as orphaned.
    pub orphaned_unattributed_bytes: u64,
    /// Unattributed bytes whether or not they count as orphaned.
    pub unattributed_bytes: u64,
    /// All orphaned bytes.
    pub orphaned_bytes: u64,
    /// Processes with a context on the GPU that keep its orphaned memory, with evidence.
    pub culprits: &'a [Suspect],
    /// Processes holding its device file without a context here, with why not blamed.
    pub bystanders: &'a [Suspect],
    /// Processes holding its device file whose mappings could not be read.
    pub undetermined: &'a [Suspect],
    /// Live owners a killed server left behind (seen, or possibly), with how it is known.
    pub left_behind: &'a [LeftBehindOwner],
    /// Bytes of those whose server the exporter saw exit (`vram_left_behind_bytes`).
    pub left_behind_bytes: u64,
    /// Bytes of those only possibly left behind (`vram_possibly_left_behind_bytes`).
    pub possibly_left_behind_bytes: u64,
    /// What would give orphaned memory back.
    pub remedy: Option<&'a Remedy>,
    /// Facts worth a line each, as data.
    pub notes: &'a [Note],
    /// Live owners and culprits whose container has ended (only when some have).
    #[serde(skip_serializing_if = "is_zero")]
    pub exited_container_processes: u64,
    /// The verdict in words, and the suggested commands as data.
    pub verdict: VerdictDocument<'a>,
    /// The verdict on each MIG instance, while MIG is enabled.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceDocument<'a>>,
}

/// One MIG instance: the same verdict as a GPU's, for its own memory and processes.
#[derive(Debug, Serialize)]
pub struct InstanceDocument<'a> {
    /// The instance, its account and verdict, or the failure.
    #[serde(flatten)]
    pub instance: &'a InstanceVerdict,
    /// All orphaned bytes.
    pub orphaned_bytes: u64,
    /// The verdict in words, and the suggested commands as data.
    pub verdict: VerdictDocument<'a>,
}

/// A verdict in words beside the commands it suggests, as data: `commands` (each a
/// `program`, its `args`, and the `stdin` it reads, if any), `then` (the look that tells
/// whether they worked) and `wait_seconds` (how long that look waits), each only where
/// something is suggested.
#[derive(Debug, Serialize)]
pub struct VerdictDocument<'a> {
    /// The sentence, notes and suggested command line `check` prints.
    #[serde(flatten)]
    pub words: Verdict,
    /// The suggested commands, as data.
    #[serde(flatten)]
    pub suggested: Option<&'a Suggestion>,
}

/// A GPU that does not answer: the call it is stuck in.
#[derive(Debug, Serialize)]
pub struct NotAnswering<'a> {
    /// The NVML function.
    pub call: &'a str,
    /// Seconds it had been stuck when the look was made.
    pub stuck_seconds: f64,
}

/// Count and bytes of owners in one state.
#[derive(Debug, Serialize)]
pub struct StateDocument {
    /// Processes.
    pub processes: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Build the document for the GPUs chosen.
pub fn check_document<'a>(selection: &Selection<'a>) -> CheckDocument<'a> {
    let (report, gpus) = (selection.report, &selection.gpus);
    CheckDocument {
        status: selection.status,
        nvml_up: report.nvml.is_up(),
        nvml_error: report.nvml.error(),
        nvml_failure: report.nvml.failure(),
        nvml_stuck: report.nvml.stuck(),
        procfs_stuck: report.procfs_stuck.as_ref(),
        driver_version: report.nvml.driver_version(),
        host_pid_namespace: report.host_pid_namespace,
        procfs_view: report.procfs_view,
        holder_scan: report.holder_scan,
        witness: report.witness.as_deref(),
        orphaned_bytes: selection.orphaned_bytes(),
        gpus: gpus.iter().map(|gpu| gpu_document(gpu)).collect(),
    }
}

fn gpu_document(gpu: &GpuVerdict) -> GpuDocument<'_> {
    let (error, account) = (gpu.outcome.error_kind(), gpu.outcome.account());
    let decided = gpu.outcome.verdict();
    let left_behind = account.map_or_else(Default::default, GpuAccount::left_behind_bytes);
    GpuDocument {
        index: gpu.index,
        uuid: &gpu.uuid,
        name: &gpu.name,
        pci_bus_id: &gpu.pci_bus_id,
        minor: gpu.minor,
        status: gpu.status(),
        assigned_to: &gpu.assigned_to,
        error,
        not_answering: gpu
            .outcome
            .stuck()
            .map(|(call, stuck_seconds)| NotAnswering {
                call,
                stuck_seconds,
            }),
        memory: account.map(|account| account.memory),
        memory_inconsistent: account.is_some_and(|account| account.memory_inconsistent),
        finding: gpu.outcome.finding(),
        owners: account.map_or(&[], |account| account.owners.as_slice()),
        owners_by_state: account
            .map(|account| {
                OwnerState::VARIANTS
                    .iter()
                    .map(|&state| {
                        (
                            state.as_str(),
                            StateDocument {
                                processes: account.tally.processes(state),
                                bytes: account.tally.bytes(state),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        orphaned_owner_gone_bytes: account.map_or(0, |account| account.orphaned_owner_gone_bytes),
        orphaned_unattributed_bytes: account
            .map_or(0, |account| account.orphaned_unattributed_bytes()),
        unattributed_bytes: account.map_or(0, |account| account.unattributed_bytes),
        orphaned_bytes: gpu.orphaned_bytes(),
        culprits: account.map_or(&[], |account| account.culprits.as_slice()),
        bystanders: account.map_or(&[], |account| account.bystanders.as_slice()),
        undetermined: account.map_or(&[], |account| account.undetermined.as_slice()),
        left_behind: account.map_or(&[], |account| account.left_behind.as_slice()),
        left_behind_bytes: left_behind.witnessed,
        possibly_left_behind_bytes: left_behind.possibly,
        remedy: decided.map(|verdict| &verdict.remedy),
        notes: decided.map_or(&[], |verdict| verdict.notes.as_slice()),
        exited_container_processes: account
            .map_or(0, |account| account.exited_container_processes()),
        verdict: VerdictDocument {
            words: verdict(gpu),
            suggested: decided.map(|verdict| &verdict.suggestion),
        },
        instances: gpu
            .instances
            .iter()
            .map(|instance| InstanceDocument {
                instance,
                orphaned_bytes: instance
                    .account()
                    .map_or(0, crate::classify::GpuAccount::orphaned_bytes),
                verdict: VerdictDocument {
                    words: instance_verdict(gpu, instance),
                    suggested: instance.verdict().map(|verdict| &verdict.suggestion),
                },
            })
            .collect(),
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}
