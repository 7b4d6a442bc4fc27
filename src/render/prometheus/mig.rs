//! MIG devices: each one's identity and memory, and its verdict as a GPU's.

use super::encode::{
    flag, gauge, holders_by_role, nonzero_by_kind, orphaned_by_reason, per_gpu, state_label,
    MeasuredInstances, MemorySeries,
};
use super::labels::{MigInfoLabels, MigLabels};
use crate::classify::{GpuVerdict, OwnerState};
use prometheus_client::encoding::DescriptorEncoder;
use std::fmt;
use strum::VariantArray;

// MIG devices and what the driver says a GPU needs.

/// The four memory gauges of a MIG device.
pub(super) const MIG_MEMORY: [MemorySeries; 4] = [
    (
        "vram_mig_total_bytes",
        "Memory of this MIG device's GPU instance in bytes.",
        |m| m.total,
    ),
    (
        "vram_mig_used_bytes",
        "Memory allocated in this MIG device in bytes, excluding the driver's reservation (NVML v2).",
        |m| m.used,
    ),
    (
        "vram_mig_reserved_bytes",
        "Memory of this MIG device reserved by the driver in bytes.",
        |m| m.reserved,
    ),
    (
        "vram_mig_free_bytes",
        "Memory of this MIG device neither used nor reserved, in bytes.",
        |m| m.free,
    ),
];

/// The verdict on each MIG instance: owners by state, orphaned memory by reason, and the
/// holders of its capability nodes by role.
pub(super) fn encode_instance_verdicts(
    encoder: &mut DescriptorEncoder,
    measured: &MeasuredInstances<'_>,
) -> fmt::Result {
    let accounts = || {
        measured
            .iter()
            .map(|(gpu, instance, account)| (MigLabels::of(gpu, instance), *account))
    };
    gauge(
        encoder,
        "vram_mig_owner_processes",
        "Processes NVML charges memory to in this MIG instance, by state (as vram_owner_processes).",
        nonzero_by_kind(
            accounts(),
            OwnerState::VARIANTS,
            state_label,
            |account, state| account.tally.processes(state),
        ),
    )?;
    gauge(
        encoder,
        "vram_mig_orphaned_bytes",
        "Memory of this MIG instance held without a live owner, by reason (as vram_orphaned_bytes).",
        orphaned_by_reason(accounts()),
    )?;
    gauge(
        encoder,
        "vram_mig_holder_processes",
        "Processes holding this MIG instance's capability nodes while it has orphaned memory, by role (as vram_holder_processes).",
        holders_by_role(accounts()),
    )
}

pub(super) fn encode_mig(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuVerdict],
    measured: &MeasuredInstances<'_>,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_mig_mode",
        "1 when MIG is enabled on this GPU, 0 when disabled; absent for GPUs without MIG. Read at most every 30 s: it changes only at a GPU reset.",
        per_gpu(gpus, |gpu| Some(flag(gpu.mig?.enabled))),
    )?;
    gauge(
        encoder,
        "vram_gpu_mig_mode_pending",
        "The MIG mode this GPU takes at its next reset (1 enabled, 0 disabled); differs from vram_gpu_mig_mode while a change waits for the reset, and shows a change within 30 s.",
        per_gpu(gpus, |gpu| Some(flag(gpu.mig?.pending))),
    )?;
    let instances = || {
        gpus.iter()
            .flat_map(|gpu| gpu.instances.iter().map(move |instance| (gpu, instance)))
    };
    gauge(
        encoder,
        "vram_mig_info",
        "Identity of each MIG device (a compute instance inside a GPU instance); always 1.",
        instances().map(|(gpu, instance)| {
            let labels = MigInfoLabels {
                device: MigLabels::of(gpu, instance),
                mig_uuid: instance.uuid.clone(),
                name: instance.name.clone(),
            };
            (labels, 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_up",
        "1 when this MIG device's memory and process calls answered, 0 when one failed and its other series are missing.",
        instances().map(|(gpu, instance)| {
            (
                MigLabels::of(gpu, instance),
                flag(instance.account().is_some()),
            )
        }),
    )?;
    for (name, help, value) in MIG_MEMORY {
        gauge(
            encoder,
            name,
            help,
            measured.iter().map(|(gpu, instance, account)| {
                (MigLabels::of(gpu, instance), value(&account.memory))
            }),
        )?;
    }
    gauge(
        encoder,
        "vram_mig_processes",
        "Processes NVML lists in this MIG device (compute, graphics and MPS, once each); with a refused list, those of the lists that answered.",
        measured.iter().map(|(gpu, instance, account)| {
            (MigLabels::of(gpu, instance), account.owners.len() as u64)
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_process_list_denied",
        "1 when NVML refused a process list of this MIG device (no permission): who owns its memory cannot be told.",
        measured.iter().map(|(gpu, instance, account)| {
            (
                MigLabels::of(gpu, instance),
                flag(account.processes_denied.is_some()),
            )
        }),
    )
}
