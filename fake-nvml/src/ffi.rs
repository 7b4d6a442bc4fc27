//! NVML's C types and the plumbing every exported call shares.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::fs::OpenOptions;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::{env, ptr};

use crate::scenario::{
    Error, Gpu, Memory as MemoryFigures, MigDevice, Process, ProcessLists, Scenario,
};

/// Environment variable naming the file that records each call.
const CALL_LOG_ENV: &str = "FAKE_NVML_CALL_LOG";

/// `nvmlReturn_t`.
pub type Return = c_uint;

/// `NVML_SUCCESS`.
const SUCCESS: Return = 0;

/// `nvmlDevice_t`: an opaque handle that encodes the device index.
pub type Device = *mut c_void;

/// `NVML_VALUE_NOT_AVAILABLE` as it appears in a 64-bit usage field.
const VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlProcessInfo_t` marker for "no MIG instance".
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct PciInfo {
    /// `busIdLegacy`
    pub bus_id_legacy: [c_char; 16],
    /// `domain`
    pub domain: c_uint,
    /// `bus`
    pub bus: c_uint,
    /// `device`
    pub device: c_uint,
    /// `pciDeviceId`
    pub pci_device_id: c_uint,
    /// `pciSubSystemId`
    pub pci_sub_system_id: c_uint,
    /// `busId`
    pub bus_id: [c_char; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    /// `total`
    pub total: c_ulonglong,
    /// `free`
    pub free: c_ulonglong,
    /// `used`, which in this version includes the reserved memory.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    /// `version`, set by the caller.
    pub version: c_uint,
    /// `total`
    pub total: c_ulonglong,
    /// `reserved`
    pub reserved: c_ulonglong,
    /// `free`
    pub free: c_ulonglong,
    /// `used`
    pub used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (the v2 layout the `_v3` calls fill).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    /// `pid`
    pub pid: c_uint,
    /// `usedGpuMemory`
    pub used_gpu_memory: c_ulonglong,
    /// `gpuInstanceId`
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId`
    pub compute_instance_id: c_uint,
}

impl ProcessInfo {
    /// The entry for `process`, in the given MIG instance (`None` outside MIG).
    fn new(process: &Process, instance: Option<(u32, u32)>) -> Self {
        let (gpu_instance_id, compute_instance_id) = instance.unwrap_or((NO_INSTANCE, NO_INSTANCE));
        Self {
            pid: process.pid,
            used_gpu_memory: process.used_bytes.unwrap_or(VALUE_NOT_AVAILABLE),
            gpu_instance_id,
            compute_instance_id,
        }
    }
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    /// `fieldId`, set by the caller.
    pub field_id: c_uint,
    /// `scopeId`, set by the caller.
    pub scope_id: c_uint,
    /// `timestamp` in microseconds since the epoch.
    pub timestamp: i64,
    /// `latencyUsec`
    pub latency_usec: i64,
    /// `valueType` (`nvmlValueType_t`).
    pub value_type: c_uint,
    /// `nvmlReturn`: this field's own outcome.
    pub nvml_return: Return,
    /// `value`, a union of 8 bytes; only unsigned integers are served.
    pub value: c_ulonglong,
}

/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
pub const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    /// `device`: the handle of the GPU the event happened on.
    pub device: Device,
    /// `eventType`
    pub event_type: c_ulonglong,
    /// `eventData`: the Xid for a critical Xid event.
    pub event_data: c_ulonglong,
    /// `gpuInstanceId`
    pub gpu_instance_id: c_uint,
    /// `computeInstanceId`
    pub compute_instance_id: c_uint,
}

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_TYPE_XID_CRITICAL: c_ulonglong = 8;

/// The no-instance marker of event data and process entries.
pub const NO_INSTANCE_ID: c_uint = NO_INSTANCE;

/// Bits of a handle that hold the GPU index (plus one); the bits above hold the MIG
/// device index (plus one), zero for the GPU itself.
const GPU_BITS: u32 = 32;

/// The handle for device `index`; offset by one so that no handle is null.
pub fn handle(index: usize) -> Device {
    ptr::without_provenance_mut(index + 1)
}

/// The handle for MIG device `slot` of GPU `index`.
pub fn mig_handle(index: usize, slot: usize) -> Device {
    ptr::without_provenance_mut(((slot + 1) << GPU_BITS) | (index + 1))
}

/// The GPU index and MIG device index a handle encodes (still to be checked against
/// the scenario).
fn decode(device: Device) -> Result<(usize, Option<usize>), Error> {
    let addr = device.addr();
    let gpu = (addr & ((1 << GPU_BITS) - 1))
        .checked_sub(1)
        .ok_or(Error::InvalidArg)?;
    Ok((gpu, (addr >> GPU_BITS).checked_sub(1)))
}

/// What a handle names in the current scenario: a GPU or one of its MIG devices.
#[derive(Clone, Copy)]
pub enum Target<'a> {
    /// A whole GPU.
    Gpu(&'a Gpu),
    /// A MIG device.
    Mig {
        /// The MIG device.
        device: &'a MigDevice,
    },
}

impl Target<'_> {
    /// Plays the delay and injected error this device has for `symbol`.
    fn enter(&self, symbol: &str) -> Result<(), Error> {
        match self {
            Target::Gpu(gpu) => gpu.enter(symbol),
            Target::Mig { device, .. } => device.enter(symbol),
        }
    }

    /// The UUID.
    pub fn uuid(&self) -> &str {
        match self {
            Target::Gpu(gpu) => &gpu.uuid,
            Target::Mig { device, .. } => &device.uuid,
        }
    }

    /// The name as sent to the caller.
    pub fn name_bytes(&self) -> &[u8] {
        match self {
            Target::Gpu(gpu) => gpu.name_bytes(),
            Target::Mig { device, .. } => device.name.as_bytes(),
        }
    }

    /// The memory figures.
    pub fn memory(&self) -> &MemoryFigures {
        match self {
            Target::Gpu(gpu) => &gpu.memory,
            Target::Mig { device, .. } => &device.memory,
        }
    }

    /// The entries of one process list: a MIG device's own with its instance ids; a
    /// GPU's own followed by those of its MIG devices, since NVML answers the aggregate
    /// on the parent handle.
    pub fn processes(&self, list: fn(&ProcessLists) -> &[Process]) -> Vec<ProcessInfo> {
        let instance =
            |device: &MigDevice| Some((device.gpu_instance_id, device.compute_instance_id));
        match self {
            Target::Mig { device, .. } => list(&device.processes)
                .iter()
                .map(|process| ProcessInfo::new(process, instance(device)))
                .collect(),
            Target::Gpu(gpu) => list(&gpu.processes)
                .iter()
                .map(|process| ProcessInfo::new(process, None))
                .chain(gpu.mig_devices().iter().flat_map(|device| {
                    list(&device.processes)
                        .iter()
                        .map(move |process| ProcessInfo::new(process, instance(device)))
                }))
                .collect(),
        }
    }
}

/// Resolves `device` against `scenario`: an unknown GPU, or a MIG device that does not
/// exist now (MIG disabled, index past the end), is `InvalidArg`.
pub fn resolve(scenario: &Scenario, device: Device) -> Result<(usize, Target<'_>), Error> {
    let (index, slot) = decode(device)?;
    let gpu = scenario.gpu(index)?;
    let target = match slot {
        None => Target::Gpu(gpu),
        Some(slot) => Target::Mig {
            device: gpu.mig_devices().get(slot).ok_or(Error::InvalidArg)?,
        },
    };
    Ok((index, target))
}

/// Runs the body of exported call `symbol`: logs it, plays the machine-wide hang and
/// delay the scenario sets for it, and turns its outcome, or a panic, into a return
/// code, since unwinding into C would abort the exporter.
pub fn call(symbol: &str, body: impl FnOnce() -> Result<(), Error>) -> Return {
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        log_call(symbol);
        if let Ok(scenario) = Scenario::load() {
            scenario.slow_down(symbol);
        }
        body()
    }));
    match outcome {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(err)) => err as Return,
        Err(_) => Error::Unknown as Return,
    }
}

/// Like [`call`], for a call on one GPU: resolves the handle against the current
/// scenario and plays that device's delay and injected error first. A MIG device handle
/// answers `NotSupported`: the fake models only the calls MIG devices are asked.
pub fn device_call(
    symbol: &str,
    device: Device,
    body: impl FnOnce(usize, &Gpu) -> Result<(), Error>,
) -> Return {
    target_call(symbol, device, |index, target| match target {
        Target::Gpu(gpu) => body(index, gpu),
        Target::Mig { .. } => Err(Error::NotSupported),
    })
}

/// Like [`device_call`], for a call that a GPU and a MIG device both answer; `index` is
/// the GPU's, or the MIG device's parent's.
pub fn target_call(
    symbol: &str,
    device: Device,
    body: impl FnOnce(usize, Target<'_>) -> Result<(), Error>,
) -> Return {
    call(symbol, || {
        let scenario = Scenario::load()?;
        let (index, target) = resolve(&scenario, device)?;
        target.enter(symbol)?;
        body(index, target)
    })
}

/// Appends `symbol` to the call log, if one is configured.
fn log_call(symbol: &str) {
    let Some(path) = env::var_os(CALL_LOG_ENV) else {
        return;
    };
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
        // One write of the whole line: with O_APPEND, lines from concurrent calls
        // (or processes) never interleave. A failing log must not fail the call.
        let _ = file.write_all(format!("{symbol}\n").as_bytes());
    }
}

/// Copies `text` and a terminating NUL into the C buffer `dst` of `capacity` bytes.
///
/// # Safety
/// `dst` is null or valid for writes of `capacity` bytes.
pub unsafe fn write_c_str(dst: *mut c_char, capacity: usize, text: &[u8]) -> Result<(), Error> {
    if dst.is_null() {
        return Err(Error::InvalidArg);
    }
    if text.len() >= capacity {
        return Err(Error::InsufficientSize);
    }
    // SAFETY: the caller guarantees `capacity` bytes, and `text` plus NUL fits in them.
    unsafe {
        ptr::copy_nonoverlapping(text.as_ptr().cast(), dst, text.len());
        dst.add(text.len()).write(0);
    }
    Ok(())
}

/// `text` as a NUL-terminated C array, or `InsufficientSize` when it does not fit.
pub fn c_array<const N: usize>(text: &[u8]) -> Result<[c_char; N], Error> {
    if text.len() >= N {
        return Err(Error::InsufficientSize);
    }
    let mut array = [0; N];
    for (dst, &byte) in array.iter_mut().zip(text) {
        *dst = byte as c_char;
    }
    Ok(array)
}

/// Fills a caller's process array with NVML's two-step contract: a `count` too
/// small gets `InsufficientSize` and the count needed.
///
/// # Safety
/// `infos` is null or valid for writes of `*count` entries.
pub unsafe fn write_processes(
    processes: &[ProcessInfo],
    count: Option<&mut c_uint>,
    infos: *mut ProcessInfo,
) -> Result<(), Error> {
    let count = count.ok_or(Error::InvalidArg)?;
    let needed = c_uint::try_from(processes.len()).map_err(|_| Error::Unknown)?;
    let room = *count;
    *count = needed;
    if room < needed {
        return Err(Error::InsufficientSize);
    }
    if needed == 0 {
        return Ok(());
    }
    if infos.is_null() {
        return Err(Error::InvalidArg);
    }
    for (i, process) in processes.iter().enumerate() {
        // SAFETY: i < needed <= room, the entries the caller vouched for; `write`
        // because nvml-wrapper's MPS path hands over uninitialised memory.
        unsafe { infos.add(i).write(*process) };
    }
    Ok(())
}

/// NVML's description of a return code.
pub fn message(code: Return) -> &'static CStr {
    match code {
        SUCCESS => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        16 => c"GPU requires reset",
        18 => c"RM has detected an NVML/RM version mismatch",
        _ => c"Unknown Error",
    }
}
