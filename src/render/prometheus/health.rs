//! What the driver says a GPU needs: its recovery action, row remapping or page
//! retirement, and its Xid errors.

use super::encode::{active_kind, counter, flag, gauge, per_gpu};
use super::labels::{ActionLabel, CauseLabel, GpuLabels, XidLabel};
use crate::classify::{GpuVerdict, RecoveryAction};
use prometheus_client::encoding::DescriptorEncoder;
use std::fmt;
use strum::IntoEnumIterator;

/// A family's name and help.
pub(super) type Family = (&'static str, &'static str);

/// What a GPU says of one kind of memory repair: the repairs by cause, and whether one
/// waits for the next reset.
pub(super) type Repairs = ([u32; 2], bool);

/// Row remapping's families: rows by cause, and a remapping waiting.
pub(super) const ROW_REMAPPING: [Family; 2] = [
    (
        "vram_gpu_remapped_rows",
        "Memory rows this GPU has remapped to spare rows, by the errors that caused it (correctable, uncorrectable); absent on GPUs without row remapping.",
    ),
    (
        "vram_gpu_row_remap_pending",
        "1 when a row remapping waits for the next reset of this GPU.",
    ),
];

/// Page retirement's families: pages by cause, and retirements waiting.
pub(super) const PAGE_RETIREMENT: [Family; 2] = [
    (
        "vram_gpu_retired_pages",
        "Memory pages this GPU has retired, by cause (multiple_single_bit_ecc, double_bit_ecc); absent on GPUs that remap rows instead.",
    ),
    (
        "vram_gpu_retired_pages_pending",
        "1 when page retirements of this GPU wait for the next reboot or reset.",
    ),
];

/// The causes of row remappings, in the order of [`remapped_rows`]' counts.
pub(super) const ROW_CAUSES: [&str; 2] = ["correctable", "uncorrectable"];

pub(super) fn remapped_rows(gpu: &GpuVerdict) -> Option<Repairs> {
    let rows = gpu.health.remapped_rows?;
    Some(([rows.correctable, rows.uncorrectable], rows.pending))
}

/// The causes of page retirements, in the order of [`retired_pages`]' counts.
pub(super) const PAGE_CAUSES: [&str; 2] = ["multiple_single_bit_ecc", "double_bit_ecc"];

pub(super) fn retired_pages(gpu: &GpuVerdict) -> Option<Repairs> {
    let pages = gpu.health.retired_pages?;
    Some((
        [pages.multiple_single_bit_ecc, pages.double_bit_ecc],
        pages.pending,
    ))
}

/// One kind of memory repair as two families: its counts by cause, and whether one waits;
/// absent for GPUs that `read` has nothing of.
pub(super) fn repairs(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuVerdict],
    [counted, pending]: [Family; 2],
    causes: [&'static str; 2],
    read: fn(&GpuVerdict) -> Option<Repairs>,
) -> fmt::Result {
    gauge(
        encoder,
        counted.0,
        counted.1,
        gpus.iter().flat_map(|gpu| {
            read(gpu).into_iter().flat_map(move |(counts, _)| {
                causes.into_iter().zip(counts).map(|(cause, count)| {
                    ((GpuLabels::of(gpu), CauseLabel { cause }), u64::from(count))
                })
            })
        }),
    )?;
    gauge(
        encoder,
        pending.0,
        pending.1,
        per_gpu(gpus, move |gpu| Some(flag(read(gpu)?.1))),
    )
}

pub(super) fn encode_gpu_health(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuVerdict],
) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_process_list_denied",
        "1 when NVML refused a process list of this GPU (no permission; a MIG GPU's aggregate lists need root) and its MIG devices could not make up for it: memory no listed process is charged for is not called orphaned.",
        per_gpu(gpus, |gpu| {
            Some(flag(gpu.account()?.processes_denied.is_some()))
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_recovery_action",
        "1 for the recovery action the driver asks for, one series per GPU (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, system_reboot; unknown for a value this exporter does not know); absent where the driver cannot say (before 565).",
        active_kind(
            gpus,
            // Every named action, then `Unrecognised(0)`: `unknown` for any value this
            // build does not know.
            RecoveryAction::iter(),
            |kind| ActionLabel {
                action: kind.as_str(),
            },
            // Every unrecognised value is the one `unknown` series: compare kinds, not values.
            |gpu, kind| {
                let action = gpu.health.recovery_action?;
                Some(std::mem::discriminant(&action) == std::mem::discriminant(kind))
            },
        ),
    )?;
    repairs(encoder, gpus, ROW_REMAPPING, ROW_CAUSES, remapped_rows)?;
    gauge(
        encoder,
        "vram_gpu_row_remap_failure",
        "1 when a row remapping of this GPU failed (no spare row left): the GPU should be replaced.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.remapped_rows?.failure))),
    )?;
    repairs(encoder, gpus, PAGE_RETIREMENT, PAGE_CAUSES, retired_pages)?;
    gauge(
        encoder,
        "vram_gpu_memory_os_managed",
        "1 when this GPU's memory is a NUMA node the operating system manages (GH200, GB200 in NUMA mode): used memory then includes pages kept after processes exit, and memory charged to no process is normal.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.memory_os_managed))),
    )?;
    gauge(
        encoder,
        "vram_xid_watched",
        "1 while the exporter receives this GPU's critical Xid events, 0 when it cannot (not supported, NVML failing); absent outside the server.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.xid.as_ref()?.watched))),
    )?;
    counter(
        encoder,
        "vram_xid_errors",
        "Critical Xid errors NVML reported for this GPU since the exporter started, by Xid (79: fallen off the bus; 999: an Xid NVML cannot name).",
        gpus.iter().flat_map(|gpu| {
            gpu.health.xid.iter().flat_map(move |xid| {
                xid.counts
                    .iter()
                    .map(move |(&xid, &count)| ((GpuLabels::of(gpu), XidLabel { xid }), count))
            })
        }),
    )
}
