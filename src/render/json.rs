//! Render a [`Report`] as JSON for scripts (`check --json`).

use super::text::{verdict, Verdict};
use crate::classify::{GpuOutcome, GpuVerdict, Owner, OwnerState, Report, ScanSummary};
use crate::observe::{GpuError, Holder, MemoryReading};
use serde::Serialize;
use std::collections::BTreeMap;

/// The whole document.
#[derive(Debug, Serialize)]
pub struct CheckDocument<'a> {
    /// Whether NVML answered.
    pub nvml_up: bool,
    /// Why it did not.
    pub nvml_error: Option<&'a str>,
    /// Driver version.
    pub driver_version: Option<&'a str>,
    /// Whether we run in the host PID namespace (`null`: could not tell).
    pub host_pid_namespace: Option<bool>,
    /// The holder scan, when one ran.
    pub holder_scan: Option<ScanSummary>,
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
    /// The failure, when the GPU did not answer.
    pub error: Option<GpuError>,
    /// Memory figures, when it did (clamped to the total; see `memory_inconsistent`).
    pub memory: Option<MemoryReading>,
    /// NVML's memory figures contradicted each other and were clamped (only when true).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub memory_inconsistent: bool,
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
    /// Live holders NVML does not list.
    pub unlisted_holders: &'a [Holder],
    /// Live owners and unlisted holders whose container has ended (only when some have).
    #[serde(skip_serializing_if = "is_zero")]
    pub exited_container_processes: u64,
    /// The verdict in words.
    pub verdict: Verdict,
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
pub fn check_document<'a>(report: &'a Report, gpus: &[&'a GpuVerdict]) -> CheckDocument<'a> {
    CheckDocument {
        nvml_up: report.nvml_up,
        nvml_error: report.nvml_error.as_deref(),
        driver_version: report.driver_version.as_deref(),
        host_pid_namespace: report.host_pid_namespace,
        holder_scan: report.holder_scan,
        orphaned_bytes: gpus
            .iter()
            .map(|gpu| gpu.orphaned_bytes())
            .fold(0, u64::saturating_add),
        gpus: gpus.iter().map(|gpu| gpu_document(gpu, report)).collect(),
    }
}

fn gpu_document<'a>(gpu: &'a GpuVerdict, report: &Report) -> GpuDocument<'a> {
    let (error, account) = match &gpu.outcome {
        GpuOutcome::Measured(account) => (None, Some(account)),
        GpuOutcome::Failed { error, .. } => (Some(*error), None),
    };
    GpuDocument {
        index: gpu.index,
        uuid: &gpu.uuid,
        name: &gpu.name,
        pci_bus_id: &gpu.pci_bus_id,
        minor: gpu.minor,
        error,
        memory: account.map(|account| account.memory),
        memory_inconsistent: account.is_some_and(|account| account.memory_inconsistent),
        owners: account.map_or(&[], |account| account.owners.as_slice()),
        owners_by_state: account
            .map(|account| {
                OwnerState::ALL
                    .into_iter()
                    .map(|state| {
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
        unlisted_holders: account.map_or(&[], |account| account.unlisted_holders.as_slice()),
        exited_container_processes: account
            .map_or(0, |account| account.exited_container_processes()),
        verdict: verdict(gpu, report),
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}
