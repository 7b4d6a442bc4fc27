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

mod ffi;
mod scenario;

use std::ffi::{c_char, c_uint};

use ffi::{call, device_call, Device, Memory, MemoryV2, PciInfo, ProcessInfo, Return};
use scenario::{Error, Scenario};

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
                .mig_devices
                .iter()
                .position(|mig| mig.as_bytes() == uuid)
            {
                *out = ffi::mig_handle(index, slot);
                return Ok(());
            }
        }
        Err(Error::NotFound)
    })
}

/// The GPU a MIG device handle belongs to (`InvalidArg` for a GPU's own handle).
#[no_mangle]
pub extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: Device,
    device: Option<&mut Device>,
) -> Return {
    call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", || {
        let out = device.ok_or(Error::InvalidArg)?;
        let index = ffi::mig_parent_index(mig_device)?;
        Scenario::load()?.gpu(index)?;
        *out = ffi::handle(index);
        Ok(())
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

/// The GPU's `uuid`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Device,
    uuid: *mut c_char,
    length: c_uint,
) -> Return {
    device_call("nvmlDeviceGetUUID", device, |_, gpu| {
        // SAFETY: the caller's buffer holds `length` bytes.
        unsafe { ffi::write_c_str(uuid, length as usize, gpu.uuid.as_bytes()) }
    })
}

/// The GPU's `name`, or its raw `name_bytes`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Device,
    name: *mut c_char,
    length: c_uint,
) -> Return {
    device_call("nvmlDeviceGetName", device, |_, gpu| {
        // SAFETY: the caller's buffer holds `length` bytes.
        unsafe { ffi::write_c_str(name, length as usize, gpu.name_bytes()) }
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

/// The GPU's memory in the v1 layout, whose `used` includes the reserved memory.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(device: Device, memory: Option<&mut Memory>) -> Return {
    device_call("nvmlDeviceGetMemoryInfo", device, |_, gpu| {
        let m = &gpu.memory;
        *memory.ok_or(Error::InvalidArg)? = Memory {
            total: m.total,
            free: m.free(),
            used: m.reserved.saturating_add(m.used),
        };
        Ok(())
    })
}

/// The GPU's `memory`.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Device,
    memory: Option<&mut MemoryV2>,
) -> Return {
    device_call("nvmlDeviceGetMemoryInfo_v2", device, |_, gpu| {
        let out = memory.ok_or(Error::InvalidArg)?;
        let m = &gpu.memory;
        // The caller's version stays as given, as NVML leaves it.
        out.total = m.total;
        out.reserved = m.reserved;
        out.free = m.free();
        out.used = m.used;
        Ok(())
    })
}

/// The GPU's `compute_processes`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    device_call(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        |_, gpu| {
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&gpu.compute_processes, info_count, infos) }
        },
    )
}

/// The GPU's `graphics_processes`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    device_call(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        |_, gpu| {
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&gpu.graphics_processes, info_count, infos) }
        },
    )
}

/// The GPU's `mps_processes`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: Device,
    info_count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Return {
    device_call(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        device,
        |_, gpu| {
            // SAFETY: the caller's array holds `*info_count` entries.
            unsafe { ffi::write_processes(&gpu.mps_processes, info_count, infos) }
        },
    )
}
