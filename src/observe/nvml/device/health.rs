//! What the driver says a GPU needs (its recovery action, row remapping, retired pages,
//! NUMA node), kept between scrapes while the GPU answers and no critical Xid event has
//! arrived; a call this driver or GPU does not support leaves its part unknown.

use crate::observe::nvml::reading::{GpuHealth, RecoveryAction, RemappedRows, RetiredPages};
use crate::observe::worker::calling;
use nvml_wrapper::enum_wrappers::device::RetirementCause;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper::Device;
use std::time::{Duration, Instant};

/// What a GPU's health calls cannot answer, and what they last answered.
#[derive(Debug, Default)]
pub(super) struct HealthAnswers {
    retired_pages_unsupported: bool,
    numa_node_unsupported: bool,
    /// What the driver last said the GPU needs, while the GPU answers.
    kept: Option<KeptHealth>,
}

/// A health reading kept between scrapes, with when it was read and how many critical
/// Xid events had been counted by then.
#[derive(Debug)]
struct KeptHealth {
    read_at: Instant,
    xid_events: u64,
    health: GpuHealth,
}

/// How long a GPU's health (recovery action, row remapping, retired pages, NUMA node) is
/// served from memory while the GPU answers and no critical Xid event has arrived. The
/// driver changes them after a fault, and a fault it can report raises a critical Xid
/// (Xid 154 announces a new recovery action; 48, 63, 64, 79, 94 and 95 the faults
/// behind one), which makes the next scrape ask again; without one, a change shows this
/// much later at most. They are two of the seven driver calls a scrape makes of a GPU:
/// 15 and 18 us of CPU each on an H100 when asked cold (`nvml_call_cost.py --interval`).
const HEALTH_FOR: Duration = Duration::from_secs(30);

/// What the driver says the GPU needs: as kept, while the GPU answered (`answered`), the
/// reading is younger than [`HEALTH_FOR`] and no critical Xid event arrived since;
/// otherwise asked again. A GPU that fails is asked on every scrape: what it needs is
/// then the question.
pub(super) fn health(
    device: &Device,
    answers: &mut HealthAnswers,
    answered: bool,
    xid_events: u64,
) -> GpuHealth {
    let now = Instant::now();
    if let Some(kept) = answers.kept.as_ref().filter(|kept| {
        answered && kept.xid_events == xid_events && now.duration_since(kept.read_at) < HEALTH_FOR
    }) {
        return kept.health.clone();
    }
    let health = read_health(device, answers);
    answers.kept = answered.then(|| KeptHealth {
        read_at: now,
        xid_events,
        health: health.clone(),
    });
    health
}

/// What the driver says the GPU needs. Each reading that this driver or GPU cannot give
/// is `None`: a missing feature is not a failure of the GPU.
fn read_health(device: &Device, answers: &mut HealthAnswers) -> GpuHealth {
    calling("nvmlDeviceGetFieldValues");
    let recovery_action =
        recovery_action(device.field_values_for(&[FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)]));
    calling("nvmlDeviceGetRemappedRows");
    let remapped_rows = remapped_rows(device);
    let retired_pages = unless_unsupported(&mut answers.retired_pages_unsupported, || {
        retired_pages(device)
    });
    let numa_node = unless_unsupported(&mut answers.numa_node_unsupported, || {
        calling("nvmlDeviceGetNumaNodeId");
        device.numa_node_id()
    });
    GpuHealth {
        recovery_action,
        remapped_rows,
        retired_pages,
        numa_node,
        xid: None,
    }
}

/// The answer of `ask`, which is not asked again once it said NotSupported.
fn unless_unsupported<T>(
    unsupported: &mut bool,
    ask: impl FnOnce() -> Result<T, NvmlError>,
) -> Option<T> {
    if *unsupported {
        return None;
    }
    match ask() {
        Ok(answer) => Some(answer),
        Err(NvmlError::NotSupported) => {
            *unsupported = true;
            None
        }
        Err(_) => None,
    }
}

/// The recovery action from a field-value answer: absent when the call or the field
/// failed (a driver before 565 answers `NotSupported` for the field, an older library
/// lacks the call).
fn recovery_action(
    answer: Result<
        Vec<Result<nvml_wrapper::struct_wrappers::device::FieldValueSample, NvmlError>>,
        NvmlError,
    >,
) -> Option<RecoveryAction> {
    let sample = answer.ok()?.into_iter().next()?.ok()?;
    let raw = match sample.value.ok()? {
        SampleValue::U32(value) => value,
        SampleValue::U64(value) => u32::try_from(value).ok()?,
        SampleValue::I64(value) => u32::try_from(value).ok()?,
        SampleValue::F64(_) => return None,
    };
    Some(RecoveryAction::from_raw(raw))
}

/// Row remapping; nvml-wrapper does not wrap this call.
fn remapped_rows(device: &Device) -> Option<RemappedRows> {
    let call = device
        .nvml()
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .ok()?;
    let (mut correctable, mut uncorrectable, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: the handle comes from a live `Device` of this library, and NVML writes one
    // unsigned int into each of the four, which we own.
    let status = unsafe {
        call(
            device.handle(),
            &mut correctable,
            &mut uncorrectable,
            &mut pending,
            &mut failure,
        )
    };
    (status == 0).then_some(RemappedRows {
        correctable,
        uncorrectable,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// Page retirement, when the GPU retires pages at all.
fn retired_pages(device: &Device) -> Result<RetiredPages, NvmlError> {
    calling("nvmlDeviceGetRetiredPagesPendingStatus");
    let pending = device.are_pages_pending_retired()?;
    let count = |cause| {
        calling("nvmlDeviceGetRetiredPages_v2");
        device.retired_pages(cause).map(|pages| pages.len() as u32)
    };
    Ok(RetiredPages {
        multiple_single_bit_ecc: count(RetirementCause::MultipleSingleBitEccErrors)?,
        double_bit_ecc: count(RetirementCause::DoubleBitEccError)?,
        pending,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::struct_wrappers::device::FieldValueSample;

    fn sample(value: Result<SampleValue, NvmlError>) -> FieldValueSample {
        FieldValueSample {
            field: FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
            timestamp: 0,
            latency: 0,
            value,
        }
    }

    #[test]
    fn recovery_action_is_read_or_absent_never_an_error() {
        assert_eq!(
            recovery_action(Ok(vec![Ok(sample(Ok(SampleValue::U32(1))))])),
            Some(RecoveryAction::GpuReset)
        );
        assert_eq!(
            recovery_action(Ok(vec![Ok(sample(Ok(SampleValue::U64(2))))])),
            Some(RecoveryAction::NodeReboot)
        );
        assert_eq!(
            recovery_action(Ok(vec![Ok(sample(Ok(SampleValue::U32(42))))])),
            Some(RecoveryAction::Unrecognised(42))
        );
        // A driver before 565 answers the field NotSupported; an older library lacks
        // the call; a lost GPU fails it: the action is unknown, the GPU is not failed.
        for absent in [
            Ok(vec![Ok(sample(Err(NvmlError::NotSupported)))]),
            Err(NvmlError::FailedToLoadSymbol(
                "nvmlDeviceGetFieldValues".into(),
            )),
            Err(NvmlError::GpuLost),
            Ok(vec![]),
            Ok(vec![Ok(sample(Ok(SampleValue::F64(1.0))))]),
        ] {
            assert_eq!(recovery_action(absent), None);
        }
    }
}
