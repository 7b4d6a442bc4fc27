//! Each GPU's identity and memory, its owners by state, its orphaned and left-behind
//! memory and who holds it, and the per-process series.

use super::encode::{
    active_kind, flag, gauge, holders_by_role, nonzero_by_kind, orphaned_by_reason, per_gpu,
    state_label, Measured, MemorySeries, TallyOf,
};
use super::labels::{
    CallLabel, ErrorLabel, GpuInfoLabels, GpuLabels, HolderLabels, LeftBehindLabels, PlaceLabels,
    ProcessLabels, ReasonLabel,
};
use crate::classify::{GoneReason, GpuAccount, GpuError, GpuVerdict, OwnerState, StateTally};
use prometheus_client::encoding::DescriptorEncoder;
use std::fmt;
use strum::{IntoEnumIterator, VariantArray};

/// At most this many `vram_holder_info` series per GPU: each is a label set of its own.
pub const MAX_HOLDER_SERIES_PER_GPU: usize = 16;

pub(super) fn gpu_identity(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_info",
        "Identity of each GPU; always 1.",
        gpus.iter().map(|gpu| {
            let labels = GpuInfoLabels {
                gpu: GpuLabels::of(gpu),
                name: gpu.name.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                minor: gpu.minor,
            };
            (labels, 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_up",
        "1 when every NVML call for this GPU answered, 0 when one failed or has not returned (vram_gpu_error says which) and its other series are missing.",
        per_gpu(gpus, |gpu| Some(flag(gpu.account().is_some()))),
    )?;
    gauge(
        encoder,
        "vram_gpu_error",
        "1 for the kind of NVML failure this GPU shows (gpu_lost, reset_required, not_supported, no_permission, unknown, timeout: a call that has not returned); absent while the GPU answers.",
        active_kind(
            gpus,
            GpuError::iter(),
            |kind| ErrorLabel {
                error: kind.as_str(),
            },
            |gpu, kind| Some(gpu.outcome.error_kind() == Some(*kind)),
        ),
    )?;
    gauge(
        encoder,
        "vram_gpu_stuck_seconds",
        "Seconds the NVML call this GPU is stuck in has been running; only for a GPU that does not answer, which is asked nothing more until the call returns.",
        gpus.iter().filter_map(|gpu| {
            let (call, seconds) = gpu.outcome.stuck()?;
            Some((
                (
                    GpuLabels::of(gpu),
                    CallLabel {
                        call: call.to_string(),
                    },
                ),
                seconds,
            ))
        }),
    )
}

/// The four memory gauges of a GPU.
pub(super) const GPU_MEMORY: [MemorySeries; 4] = [
    ("vram_total_bytes", "Installed GPU memory in bytes.", |m| {
        m.total
    }),
    (
        "vram_used_bytes",
        "GPU memory allocated by contexts in bytes, excluding the driver's reservation (NVML v2).",
        |m| m.used,
    ),
    (
        "vram_reserved_bytes",
        "GPU memory reserved by the driver in bytes; never owned by a process.",
        |m| m.reserved,
    ),
    (
        "vram_free_bytes",
        "GPU memory neither used nor reserved, in bytes.",
        |m| m.free,
    ),
];

pub(super) fn memory(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    for (name, help, value) in GPU_MEMORY {
        gauge(
            encoder,
            name,
            help,
            measured
                .iter()
                .map(|(gpu, account)| (GpuLabels::of(gpu), value(&account.memory))),
        )?;
    }
    gauge(
        encoder,
        "vram_memory_inconsistent",
        "1 when NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): the figures are clamped to the total and unattributed memory is not called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), flag(account.memory_inconsistent))),
    )
}

/// The measured GPUs' accounts under their labels.
pub(super) fn gpu_accounts<'a>(
    measured: &'a Measured<'a>,
) -> impl Iterator<Item = (GpuLabels, &'a GpuAccount)> + 'a {
    measured
        .iter()
        .map(|(gpu, account)| (GpuLabels::of(gpu), *account))
}

pub(super) fn owners(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    let by_state_series: [(&str, &str, TallyOf); 2] = [
        (
            "vram_owner_processes",
            "Processes NVML charges memory to on this GPU, by state; gone means no live process holds the context any more (it exited, or its PID names another process now). A state without owners has no series.",
            StateTally::processes,
        ),
        (
            "vram_owned_bytes",
            "Bytes NVML charges to owners in each state; a state without owners has no series.",
            StateTally::bytes,
        ),
    ];
    for (name, help, tally) in by_state_series {
        let owners = nonzero_by_kind(
            gpu_accounts(measured),
            OwnerState::VARIANTS,
            state_label,
            move |account, state| tally(&account.tally, state),
        );
        gauge(encoder, name, help, owners)?;
    }
    gauge(
        encoder,
        "vram_gone_owner_processes",
        "Gone owners by why: exited, or reused (the PID names another process now, one without a context on this GPU or with another start time); a reason without owners has no series.",
        nonzero_by_kind(
            gpu_accounts(measured),
            GoneReason::VARIANTS,
            |reason| ReasonLabel {
                reason: reason.as_str(),
            },
            GpuAccount::gone,
        ),
    )?;
    gauge(
        encoder,
        "vram_owner_processes_usage_unavailable",
        "Owners whose memory usage NVML reports as unavailable; while a live one exists, unattributed memory is not called orphaned. Absent when there are none.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.usage_unavailable_owners))
            .filter(|(_, owners)| *owners != 0),
    )?;
    gauge(
        encoder,
        "vram_exited_container_processes",
        "Live owners and culprits of this GPU whose container has ended (PID 1 of their PID namespace exited): they survived the SIGKILL that ends a container, typically stuck in the driver. Absent when there are none.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.exited_container_processes()))
            .filter(|(_, processes)| *processes != 0),
    )
}

/// Orphaned memory, and the processes that hold it.
pub(super) fn orphans(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_orphaned_bytes",
        "GPU memory held without a live owner: charged to gone owners (owner_gone) or charged to nobody above the noise floor (unattributed).",
        orphaned_by_reason(gpu_accounts(measured)),
    )?;
    gauge(
        encoder,
        "vram_unattributed_bytes",
        "Used bytes charged to no listed process, above the per-context noise floor; reported even when it cannot be called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.unattributed_bytes)),
    )?;
    gauge(
        encoder,
        "vram_holder_processes",
        "Processes holding this GPU's device file while it has orphaned memory, by role: culprit (holds a context here: its end frees the memory), bystander (no context here: an NVML client or another GPU's job; or the MPS control daemon or server; never blamed), undetermined (mappings unreadable). Only roles with holders have a series: none while nothing is orphaned.",
        holders_by_role(gpu_accounts(measured)),
    )?;
    gauge(
        encoder,
        "vram_holder_info",
        "One series per culprit: a process with a context on this GPU that keeps its orphaned memory alive, named by PID and start time; always 1.",
        measured.iter().flat_map(|(gpu, account)| {
            account
                .culprits
                .iter()
                .take(MAX_HOLDER_SERIES_PER_GPU)
                .map(move |culprit| {
                    let process = &culprit.process;
                    let labels = HolderLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: process.pid,
                        start_time: process.started_unix_seconds,
                        comm: process.comm.clone(),
                        state: process.state.owner_state().as_str(),
                        place: PlaceLabels::of(Some(process)),
                    };
                    (labels, 1i64)
                })
        }),
    )
}

/// Memory that workers of an exited server hold, and those workers.
pub(super) fn left_behind(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_left_behind_bytes",
        "Bytes NVML charges to live owners whose parent (the server that started them) the exporter saw exit: workers a killed server left behind, holding memory for nobody. Not orphaned: killing them frees it.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.left_behind_bytes().witnessed)),
    )?;
    gauge(
        encoder,
        "vram_possibly_left_behind_bytes",
        "Bytes NVML charges to live owners that are possibly left behind: the exporter never saw their server, and their scope says it has exited (a multiprocessing worker whose pipes to its parent lead nowhere, adopted after its group's leader exited). Not counted in vram_left_behind_bytes, and never paged on.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.left_behind_bytes().possibly)),
    )?;
    gauge(
        encoder,
        "vram_left_behind_since_timestamp_seconds",
        "One series per owner counted in vram_left_behind_bytes, named by PID and start time with the parent that exited: when the exporter saw the parent gone, in seconds since the epoch.",
        measured.iter().flat_map(|(gpu, account)| {
            account
                .left_behind
                .iter()
                .filter(|owner| owner.seen.witnessed())
                .filter_map(|owner| {
                    let (parent, exit_seen) = owner.seen.parent_exit()?;
                    Some((owner, parent, exit_seen))
                })
                .take(MAX_HOLDER_SERIES_PER_GPU)
                .map(move |(owner, parent, exit_seen)| {
                    let process = &owner.process;
                    let labels = LeftBehindLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: process.pid,
                        start_time: process.started_unix_seconds,
                        comm: process.comm.clone(),
                        parent_pid: parent.pid,
                        parent_comm: parent.comm.clone(),
                        place: PlaceLabels::of(Some(process)),
                    };
                    (labels, exit_seen as i64)
                })
        }),
    )
}

pub(super) fn per_process(
    encoder: &mut DescriptorEncoder,
    measured: &Measured<'_>,
    limit: usize,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_process_used_bytes",
        "Bytes NVML charges each process on each GPU (opt-in, capped).",
        measured
            .iter()
            .flat_map(|(gpu, account)| {
                account.owners.iter().map(move |owner| {
                    let labels = ProcessLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: owner.pid,
                        comm: owner.comm().unwrap_or_default().to_string(),
                        state: owner.state().as_str(),
                        place: PlaceLabels::of(owner.process()),
                    };
                    (labels, owner.used_bytes.unwrap_or(0))
                })
            })
            .take(limit),
    )
}
