//! A stand-in for NVIDIA's `libnvidia-ml.so.1` that answers from a JSON scenario file,
//! so the exporter runs through nvml-wrapper unchanged on machines without a GPU.
//!
//! It exports only the NVML symbols the exporter calls; nvml-wrapper resolves symbols
//! lazily, so anything else fails only the call that needs it. The scenario format is
//! described in docs/fake-nvml.md.
//!
//! Every pointer argument must be null or valid for what NVML's own header promises
//! (the length passed with it, or `*count` entries); that is the safety contract of
//! each `unsafe` export below.
#![deny(unsafe_op_in_unsafe_fn)]
// The contract is NVML's and is the same for every export: stated once, above.
#![allow(clippy::missing_safety_doc)]

mod events;
mod ffi;
mod scenario;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use events::EventSet;
use ffi::{
    call, device_call, target_call, Device, EventData, FieldValue, Memory, MemoryV2, PciInfo,
    ProcessInfo, Return, Target,
};
use scenario::{Error, Gpu, MigDevice, Scenario, DEFAULT_EVENT_TYPES};

/// Succeeds unless the scenario sets `init_error` or cannot be read (`DriverNotLoaded`).
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Return {
    call("nvmlInit_v2", init)
}

/// Same as `nvmlInit_v2`; the flags change nothing here.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Return {
    call("nvmlInitWithFlags", init)
}

/// Shared by both init entry points.
fn init() -> Result<(), Error> {
    let scenario = Scenario::load().map_err(|_| Error::DriverNotLoaded)?;
    scenario.init_error.map_or(Ok(()), Err)
}

/// Succeeds whenever a scenario is readable; there is no state to release.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Return {
    call("nvmlShutdown", || Scenario::load().map(drop))
}

/// A static description of `result`.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Return) -> *const c_char {
    call("nvmlErrorString", || Ok(()));
    ffi::message(result).as_ptr()
}

/// The scenario's `driver_version`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Return {
    call("nvmlSystemGetDriverVersion", || {
        let scenario = Scenario::load()?;
        // SAFETY: the caller's buffer holds `length` bytes.
        unsafe { ffi::write_c_str(version, length as usize, scenario.driver_version.as_bytes()) }
    })
}

/// The number of GPUs in the scenario.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(device_count: Option<&mut c_uint>) -> Return {
    call("nvmlDeviceGetCount_v2", || {
        let out = device_count.ok_or(Error::InvalidArg)?;
        let count = Scenario::load()?.gpus.len();
        *out = c_uint::try_from(count).map_err(|_| Error::Unknown)?;
        Ok(())
    })
}

/// The handle of GPU `index`, subject to that GPU's injected errors and delays.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: Option<&mut Device>,
) -> Return {
    let symbol = "nvmlDeviceGetHandleByIndex_v2";
    call(symbol, || {
        let out = device.ok_or(Error::InvalidArg)?;
        let index = index as usize;
        Scenario::load()?.gpu(index)?.enter(symbol)?;
        *out = ffi::handle(index);
        Ok(())
    })
}

/// The handle of the GPU or MIG device with this UUID (`NotFound` for any other).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: Option<&mut Device>,
) -> Return {
    call("nvmlDeviceGetHandleByUUID", || {
        let out = device.ok_or(Error::InvalidArg)?;
        if uuid.is_null() {
            return Err(Error::InvalidArg);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let uuid = unsafe { std::ffi::CStr::from_ptr(uuid) }.to_bytes();
        let scenario = Scenario::load()?;
        for (index, gpu) in scenario.gpus.iter().enumerate() {
            if gpu.uuid.as_bytes() == uuid {
                *out = ffi::handle(index);
                return Ok(());
            }
            if let Some(slot) = gpu
                .mig_devices()
                .iter()
                .position(|mig| mig.uuid.as_bytes() == uuid)
            {
                *out = ffi::mig_handle(index, slot);
                return Ok(());
            }
        }
        Err(Error::NotFound)
    })
}

/// The index `device` was obtained with.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(device: Device, index: Option<&mut c_uint>) -> Return {
    device_call("nvmlDeviceGetIndex", device, |i, _| {
        *index.ok_or(Error::InvalidArg)? = c_uint::try_from(i).map_err(|_| Error::InvalidArg)?;
        Ok(())
    })
}

/// The GPU's or MIG device's `uuid`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Device,
    uuid: *mut c_char,
    length: c_uint,
) -> Return {
    target_call("nvmlDeviceGetUUID", device, |_, target| {
        // SAFETY: the caller's buffer holds `length` bytes.
        unsafe { ffi::write_c_str(uuid, length as usize, target.uuid().as_bytes()) }
    })
}

/// The GPU's `name` (or its raw `name_bytes`), or the MIG device's `name`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Device,
    name: *mut c_char,
    length: c_uint,
) -> Return {
    target_call("nvmlDeviceGetName", device, |_, target| {
        // SAFETY: the caller's buffer holds `length` bytes.
        unsafe { ffi::write_c_str(name, length as usize, target.name_bytes()) }
    })
}

/// The GPU's PCI location, parsed from its `pci_bus_id`.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo_v3(device: Device, pci: Option<&mut PciInfo>) -> Return {
    device_call("nvmlDeviceGetPciInfo_v3", device, |_, gpu| {
        let out = pci.ok_or(Error::InvalidArg)?;
        // A malformed bus id is still served as text, so a scenario can send one;
        // only the numbers derived from it read as zero.
        let (domain, bus, device) = gpu.pci_location().unwrap_or_default();
        let legacy = format!("{domain:04X}:{bus:02X}:{device:02X}.0");
        *out = PciInfo {
            // Left empty when a wide domain does not fit the legacy form.
            bus_id_legacy: ffi::c_array(legacy.as_bytes()).unwrap_or_default(),
            domain,
            bus,
            device,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: ffi::c_array(gpu.pci_bus_id.as_bytes())?,
        };
        Ok(())
    })
}

/// The GPU's `minor`.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMinorNumber(
    device: Device,
    minor_number: Option<&mut c_uint>,
) -> Return {
    device_call("nvmlDeviceGetMinorNumber", device, |_, gpu| {
        *minor_number.ok_or(Error::InvalidArg)? = gpu.minor;
        Ok(())
    })
}

/// The device's memory in the v1 layout, whose `used` includes the reserved memory.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(device: Device, memory: Option<&mut Memory>) -> Return {
    target_call("nvmlDeviceGetMemoryInfo", device, |_, target| {
        let m = target.memory();
        *memory.ok_or(Error::InvalidArg)? = Memory {
            total: m.total,
            free: m.free(),
            used: m.reserved.saturating_add(m.used),
        };
        Ok(())
    })
}

/// The device's `memory`.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Device,
    memory: Option<&mut MemoryV2>,
) -> Return {
    target_call("nvmlDeviceGetMemoryInfo_v2", device, |_, target| {
        let out = memory.ok_or(Error::InvalidArg)?;
        let m = target.memory();
        // The caller's version stays as given, as NVML leaves it.
        out.total = m.total;
        out.reserved = m.reserved;
        out.free = m.free();
        out.used = m.used;
        Ok(())
    })
}

/// The device's `compute_processes` (on a MIG GPU's own handle, every instance's too).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    target_call(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        |_, target| {
            let listed = target.processes(|lists| &lists.compute_processes);
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&listed, info_count, infos) }
        },
    )
}

/// The device's `graphics_processes` (on a MIG GPU's own handle, every instance's too).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    target_call(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        |_, target| {
            let listed = target.processes(|lists| &lists.graphics_processes);
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&listed, info_count, infos) }
        },
    )
}

/// The device's `mps_processes` (on a MIG GPU's own handle, every instance's too).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    target_call(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        device,
        |_, target| {
            let listed = target.processes(|lists| &lists.mps_processes);
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&listed, info_count, infos) }
        },
    )
}

// MIG: the GPU's mode and its MIG devices, reached through handles of their own.

/// The GPU's MIG mode: `NotSupported` without a `mig` entry.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMigMode(
    device: Device,
    current: Option<&mut c_uint>,
    pending: Option<&mut c_uint>,
) -> Return {
    device_call("nvmlDeviceGetMigMode", device, |_, gpu| {
        let mig = gpu.mig.as_ref().ok_or(Error::NotSupported)?;
        let (current, pending) = current.zip(pending).ok_or(Error::InvalidArg)?;
        *current = c_uint::from(mig.current);
        *pending = c_uint::from(mig.pending.unwrap_or(mig.current));
        Ok(())
    })
}

/// How many MIG devices the GPU can hold, whether or not MIG is enabled.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: Device,
    count: Option<&mut c_uint>,
) -> Return {
    device_call("nvmlDeviceGetMaxMigDeviceCount", device, |_, gpu| {
        let mig = gpu.mig.as_ref().ok_or(Error::NotSupported)?;
        *count.ok_or(Error::InvalidArg)? = max_mig_devices(gpu, mig.max_devices);
        Ok(())
    })
}

/// The larger of the declared maximum (7 by default) and the devices listed.
fn max_mig_devices(gpu: &Gpu, declared: Option<u32>) -> c_uint {
    let listed = gpu
        .mig
        .as_ref()
        .map_or(0, |mig| mig.devices.len() as c_uint);
    declared.unwrap_or(7).max(listed)
}

/// The handle of MIG device `index`: `NotFound` where no device is (MIG disabled, a
/// gap), `InvalidArg` at or past the maximum.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: Device,
    index: c_uint,
    mig_device: Option<&mut Device>,
) -> Return {
    device_call(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        device,
        |gpu_index, gpu| {
            let mig = gpu.mig.as_ref().ok_or(Error::NotSupported)?;
            let out = mig_device.ok_or(Error::InvalidArg)?;
            if index >= max_mig_devices(gpu, mig.max_devices) {
                return Err(Error::InvalidArg);
            }
            let slot = index as usize;
            if slot >= gpu.mig_devices().len() {
                return Err(Error::NotFound);
            }
            *out = ffi::mig_handle(gpu_index, slot);
            Ok(())
        },
    )
}

/// 1 for a MIG device handle, 0 for a GPU's.
#[no_mangle]
pub extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: Device,
    is_mig: Option<&mut c_uint>,
) -> Return {
    target_call("nvmlDeviceIsMigDeviceHandle", device, |_, target| {
        *is_mig.ok_or(Error::InvalidArg)? = c_uint::from(matches!(target, Target::Mig { .. }));
        Ok(())
    })
}

/// A MIG device's GPU instance id; `NotSupported` on a GPU's own handle.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetGpuInstanceId(device: Device, id: Option<&mut c_uint>) -> Return {
    target_call("nvmlDeviceGetGpuInstanceId", device, |_, target| {
        *id.ok_or(Error::InvalidArg)? = mig_of(target)?.gpu_instance_id;
        Ok(())
    })
}

/// A MIG device's compute instance id; `NotSupported` on a GPU's own handle.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: Device,
    id: Option<&mut c_uint>,
) -> Return {
    target_call("nvmlDeviceGetComputeInstanceId", device, |_, target| {
        *id.ok_or(Error::InvalidArg)? = mig_of(target)?.compute_instance_id;
        Ok(())
    })
}

/// The MIG device a handle names, or `NotSupported` for a GPU.
fn mig_of(target: Target<'_>) -> Result<&MigDevice, Error> {
    match target {
        Target::Mig { device, .. } => Ok(device),
        Target::Gpu(_) => Err(Error::NotSupported),
    }
}

/// The parent GPU's handle of a MIG device; `InvalidArg` for a GPU's own handle.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: Device,
    device: Option<&mut Device>,
) -> Return {
    target_call(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        mig_device,
        |index, target| match target {
            Target::Mig { .. } => {
                *device.ok_or(Error::InvalidArg)? = ffi::handle(index);
                Ok(())
            }
            Target::Gpu(_) => Err(Error::InvalidArg),
        },
    )
}

// What the driver says about the GPU's health.

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const FIELD_RECOVERY_ACTION: c_uint = 230;

/// Field values: the recovery action when the scenario gives one; every other field,
/// and the recovery action on an older driver, answers `NotSupported` in its own slot.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Device,
    count: c_int,
    values: *mut FieldValue,
) -> Return {
    device_call("nvmlDeviceGetFieldValues", device, |_, gpu| {
        let count = usize::try_from(count).map_err(|_| Error::InvalidArg)?;
        if count == 0 || values.is_null() {
            return Err(Error::InvalidArg);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as i64);
        for i in 0..count {
            // SAFETY: the caller's array holds `count` entries.
            let value = unsafe { &mut *values.add(i) };
            value.timestamp = now;
            value.latency_usec = 0;
            match (value.field_id, gpu.recovery_action) {
                (FIELD_RECOVERY_ACTION, Some(action)) => {
                    value.value_type = ffi::VALUE_TYPE_UNSIGNED_INT;
                    value.value = c_ulonglong::from(action);
                    value.nvml_return = 0;
                }
                _ => value.nvml_return = Error::NotSupported as Return,
            }
        }
        Ok(())
    })
}

/// The GPU's `remapped_rows`; `NotSupported` without one.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetRemappedRows(
    device: Device,
    correctable: Option<&mut c_uint>,
    uncorrectable: Option<&mut c_uint>,
    pending: Option<&mut c_uint>,
    failure: Option<&mut c_uint>,
) -> Return {
    device_call("nvmlDeviceGetRemappedRows", device, |_, gpu| {
        let rows = gpu.remapped_rows.as_ref().ok_or(Error::NotSupported)?;
        let (Some(correctable), Some(uncorrectable), Some(pending), Some(failure)) =
            (correctable, uncorrectable, pending, failure)
        else {
            return Err(Error::InvalidArg);
        };
        *correctable = rows.correctable;
        *uncorrectable = rows.uncorrectable;
        *pending = c_uint::from(rows.pending);
        *failure = c_uint::from(rows.failure);
        Ok(())
    })
}

/// Retired pages of one cause (0: multiple single-bit ECC errors, 1: a double-bit ECC
/// error), with NVML's two-step contract on the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: Device,
    cause: c_uint,
    count: Option<&mut c_uint>,
    addresses: *mut c_ulonglong,
) -> Return {
    device_call("nvmlDeviceGetRetiredPages", device, |_, gpu| {
        // SAFETY: the caller's array holds `*count` entries.
        unsafe { retired_pages(gpu, cause, count, addresses, std::ptr::null_mut()) }
    })
}

/// Like `nvmlDeviceGetRetiredPages`, with a retirement time per page.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: Device,
    cause: c_uint,
    count: Option<&mut c_uint>,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Return {
    device_call("nvmlDeviceGetRetiredPages_v2", device, |_, gpu| {
        // SAFETY: the caller's arrays hold `*count` entries.
        unsafe { retired_pages(gpu, cause, count, addresses, timestamps) }
    })
}

/// Writes made-up page addresses (and times, when asked) for the scenario's count.
///
/// # Safety
/// `addresses` and `timestamps` are null or valid for `*count` entries.
unsafe fn retired_pages(
    gpu: &Gpu,
    cause: c_uint,
    count: Option<&mut c_uint>,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), Error> {
    let pages = gpu.retired_pages.as_ref().ok_or(Error::NotSupported)?;
    let needed = match cause {
        0 => pages.multiple_single_bit,
        1 => pages.double_bit,
        _ => return Err(Error::InvalidArg),
    };
    let count = count.ok_or(Error::InvalidArg)?;
    let room = *count;
    *count = needed;
    if room < needed {
        return Err(Error::InsufficientSize);
    }
    for i in 0..needed as usize {
        let address = 0x1000 * (i as c_ulonglong + 1) + c_ulonglong::from(cause);
        if !addresses.is_null() {
            // SAFETY: i < needed <= room, the entries the caller vouched for.
            unsafe { addresses.add(i).write(address) };
        }
        if !timestamps.is_null() {
            // SAFETY: as above.
            unsafe { timestamps.add(i).write(1_700_000_000 + i as c_ulonglong) };
        }
    }
    Ok(())
}

/// Whether page retirements wait for a reboot or reset.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: Device,
    pending: Option<&mut c_uint>,
) -> Return {
    device_call(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        device,
        |_, gpu| {
            let pages = gpu.retired_pages.as_ref().ok_or(Error::NotSupported)?;
            *pending.ok_or(Error::InvalidArg)? = c_uint::from(pages.pending);
            Ok(())
        },
    )
}

/// The GPU memory's NUMA node: `NotSupported` unless the GPU is a NUMA node.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetNumaNodeId(device: Device, node: Option<&mut c_uint>) -> Return {
    device_call("nvmlDeviceGetNumaNodeId", device, |_, gpu| {
        *node.ok_or(Error::InvalidArg)? = gpu.numa_node.ok_or(Error::NotSupported)?;
        Ok(())
    })
}

// Events: critical Xid errors, delivered through event sets (see events.rs).

/// A new, empty event set.
#[no_mangle]
pub extern "C" fn nvmlEventSetCreate(set: Option<&mut EventSet>) -> Return {
    call("nvmlEventSetCreate", || {
        let out = set.ok_or(Error::InvalidArg)?;
        *out = events::create(&*Scenario::load()?);
        Ok(())
    })
}

/// The event types the GPU supports.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: Device,
    types: Option<&mut c_ulonglong>,
) -> Return {
    device_call("nvmlDeviceGetSupportedEventTypes", device, |_, gpu| {
        *types.ok_or(Error::InvalidArg)? = gpu.supported_events.unwrap_or(DEFAULT_EVENT_TYPES);
        Ok(())
    })
}

/// Registers the GPU in `set`; `NotSupported` for a type the GPU does not support.
#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: Device,
    types: c_ulonglong,
    set: EventSet,
) -> Return {
    device_call("nvmlDeviceRegisterEvents", device, |index, gpu| {
        let supported = gpu.supported_events.unwrap_or(DEFAULT_EVENT_TYPES);
        if types & !supported != 0 {
            return Err(Error::NotSupported);
        }
        events::register(set, index, types)
    })
}

/// The next event of a GPU registered in `set`, or `Timeout` after `timeout_ms`.
#[no_mangle]
pub extern "C" fn nvmlEventSetWait_v2(
    set: EventSet,
    data: Option<&mut EventData>,
    timeout_ms: c_uint,
) -> Return {
    call("nvmlEventSetWait_v2", || {
        let out = data.ok_or(Error::InvalidArg)?;
        *out = events::wait(set, Duration::from_millis(u64::from(timeout_ms)))?;
        Ok(())
    })
}

/// Releases `set`.
#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: EventSet) -> Return {
    call("nvmlEventSetFree", || events::free(set))
}
