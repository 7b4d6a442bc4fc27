//! Reading one GPU through NVML: its identity, memory and process lists, its MIG devices
//! (each through its own handle), and what the driver says it needs. A call this driver
//! or GPU does not support leaves its part unknown, never fails the GPU.
//!
//! This runs on the GPU's own reader thread; each blocking call is named first
//! ([`calling`]), so a GPU stuck in one is reported with it.

use super::reading::{
    GpuError, GpuHealth, GpuReading, GpuState, MemoryReading, MigDeviceReading, MigReading,
    NvmlLists, NvmlProcess, ProcessList, RecoveryAction, RemappedRows, RetiredPages,
};
use crate::observe::worker::calling;
use crate::sync::lock;
use nvml_wrapper::enum_wrappers::device::RetirementCause;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_t,
};
use std::cell::RefCell;
use std::ffi::c_uint;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Identity of a GPU as last seen, so a GPU that is lost keeps its labels.
#[derive(Debug, Clone, Default)]
pub(super) struct Identity {
    uuid: String,
    name: String,
    pci_bus_id: String,
    minor: Option<u32>,
}

impl Identity {
    /// Whether every part of it has answered.
    fn is_whole(&self) -> bool {
        !self.uuid.is_empty()
            && !self.name.is_empty()
            && !self.pci_bus_id.is_empty()
            && self.minor.is_some()
    }

    /// GPU `index` with this identity in `state`, and nothing else known of it (a GPU
    /// that did not answer).
    pub(super) fn reading(&self, index: u32, state: GpuState) -> GpuReading {
        GpuReading {
            index,
            uuid: self.uuid.clone(),
            name: self.name.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            minor: self.minor,
            state,
            mig: None,
            health: GpuHealth::default(),
        }
    }
}

/// What a GPU cannot answer, and its MIG mode, which changes only at a reset: kept so
/// that a scrape does not ask again. Measured on an H200 (driver 580), asked in a
/// scrape's order: `nvmlDeviceGetMigMode` takes 170 to 360 us and
/// `nvmlDeviceGetRetiredPagesPendingStatus` 90 to 300 us to say NotSupported, against
/// about 80 us for everything else a scrape asks of a GPU.
#[derive(Debug, Default)]
pub(super) struct Answers {
    retired_pages_unsupported: bool,
    numa_node_unsupported: bool,
    /// The MIG mode (current, pending) and when it was read; `None` inside: no MIG.
    mig_mode: Option<(Instant, Option<(u32, u32)>)>,
    /// Whether the GPU's identity (UUID, name, PCI bus id, minor number) has been read
    /// whole: none of it changes while NVML stays loaded (these answers are forgotten
    /// when it is loaded again), so a scrape asks for it only until all four answered.
    identity_whole: bool,
    /// What the driver last said the GPU needs, while the GPU answers.
    health: Option<KeptHealth>,
}

/// A health reading kept between scrapes, with when it was read and how many critical
/// Xid events had been counted by then.
#[derive(Debug)]
struct KeptHealth {
    read_at: Instant,
    xid_events: u64,
    health: GpuHealth,
}

/// How long a GPU's MIG mode is served from memory. Enabling or disabling MIG takes
/// effect only at a GPU reset, which ends every process on it, so a verdict made with a
/// mode this old concerns a GPU with nothing running yet; a pending change shows this
/// much later at most.
const MIG_MODE_FOR: Duration = Duration::from_secs(30);

/// How long a GPU's health (recovery action, row remapping, retired pages, NUMA node) is
/// served from memory while the GPU answers and no critical Xid event has arrived. The
/// driver changes them after a fault, and a fault it can report raises a critical Xid
/// (Xid 154 announces a new recovery action; 48, 63, 64, 79, 94 and 95 the faults
/// behind one), which makes the next scrape ask again; without one, a change shows this
/// much later at most. They are two of the seven driver calls a scrape makes of a GPU:
/// 15 and 18 us of CPU each on an H100 when asked cold (`nvml_call_cost.py --interval`).
const HEALTH_FOR: Duration = Duration::from_secs(30);

/// GPU `index`, its identity kept in `known`: updated as soon as it is read, before the
/// calls that may hang, so a GPU stuck in one keeps its labels. `xid_events` is the
/// number of critical Xid events counted so far, 0 where nothing watches them.
pub(super) fn read_gpu(
    nvml: &Nvml,
    index: u32,
    known: &Mutex<Identity>,
    answers: &mut Answers,
    xid_events: u64,
) -> GpuReading {
    let mut cached = lock(known).clone();
    calling("nvmlDeviceGetHandleByIndex_v2");
    let (state, mig, health) = match nvml.device_by_index(index) {
        Ok(device) => {
            if !answers.identity_whole {
                refresh_identity(&device, &mut cached);
                lock(known).clone_from(&cached);
                answers.identity_whole = cached.is_whole();
            }
            let mut state = read_state(&device);
            let mig = read_mig(&device, answers);
            if let Some(mig) = &mig {
                complete_from_instances(&mut state, mig);
            }
            let answered = matches!(state, GpuState::Ok { .. });
            let health = health(&device, answers, answered, xid_events);
            (state, mig, health)
        }
        Err(error) => (failed(error), None, GpuHealth::default()),
    };
    GpuReading {
        index,
        uuid: cached.uuid.clone(),
        name: cached.name.clone(),
        pci_bus_id: cached.pci_bus_id.clone(),
        minor: cached.minor,
        state,
        mig,
        health,
    }
}

/// Keep what answers; a lost GPU keeps the identity it had when it last answered.
fn refresh_identity(device: &Device, cached: &mut Identity) {
    calling("nvmlDeviceGetUUID");
    if let Ok(uuid) = device.uuid() {
        cached.uuid = uuid;
    }
    calling("nvmlDeviceGetName");
    match device.name() {
        Ok(name) => cached.name = name,
        // A name that is not UTF-8 is still a name: keep it, with U+FFFD for what is not.
        Err(NvmlError::Utf8Error(_)) => {
            if let Some(name) = lossy_name(device) {
                cached.name = name;
            }
        }
        Err(_) => {}
    }
    calling("nvmlDeviceGetPciInfo_v3");
    if let Ok(pci) = device.pci_info() {
        cached.pci_bus_id = pci.bus_id;
    }
    calling("nvmlDeviceGetMinorNumber");
    if let Ok(minor) = device.minor_number() {
        cached.minor = Some(minor);
    }
}

/// Bytes of NVML's longest device name, with its terminating NUL
/// (`NVML_DEVICE_NAME_V2_BUFFER_SIZE`).
const NAME_BUFFER_BYTES: usize = 96;

/// The device name as raw bytes, decoded lossily: nvml-wrapper refuses names that are
/// not UTF-8.
fn lossy_name(device: &Device) -> Option<String> {
    let get_name = device.nvml().lib().nvmlDeviceGetName.as_ref().ok()?;
    let mut buffer = [0 as std::ffi::c_char; NAME_BUFFER_BYTES];
    // SAFETY: the handle comes from a live `Device` of this library, and NVML writes at
    // most `buffer.len()` bytes, NUL included, into the buffer we own.
    let status = unsafe {
        get_name(
            device.handle(),
            buffer.as_mut_ptr(),
            NAME_BUFFER_BYTES as std::ffi::c_uint,
        )
    };
    if status != 0 {
        return None;
    }
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&byte| byte != 0)
        .map(|&byte| byte as u8)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Memory and processes of a GPU or a MIG device. A refused process list does not fail
/// the device: its memory is still known, and the refusal is kept in the list.
fn read_state(device: &Device) -> GpuState {
    calling("nvmlDeviceGetMemoryInfo_v2");
    let info = match device.memory_info() {
        Ok(info) => info,
        Err(error) => return failed(error),
    };
    let memory = MemoryReading {
        total: info.total,
        reserved: info.reserved,
        used: info.used,
        free: info.free,
    };
    match read_processes(device) {
        Ok(processes) => GpuState::Ok { memory, processes },
        Err(error) => failed(error),
    }
}

/// The union of the three process lists, or what answered of them when one was refused.
fn read_processes(device: &Device) -> Result<ProcessList, NvmlError> {
    // Each list with which it is.
    let lists = [
        (process_list(device, ListKind::Compute), NvmlLists::COMPUTE),
        (
            process_list(device, ListKind::Graphics),
            NvmlLists::GRAPHICS,
        ),
        (process_list(device, ListKind::Mps), NvmlLists::MPS),
    ];
    let mut answered = Vec::new();
    let mut denied = None;
    for (list, which) in lists {
        match list {
            Ok(list) => answered.push((list, which)),
            Err(NvmlError::NoPermission) => {
                denied.get_or_insert_with(|| NvmlError::NoPermission.to_string());
            }
            Err(error) => return Err(error),
        }
    }
    let processes = union_by_pid(answered);
    Ok(match denied {
        None => ProcessList::Listed(processes),
        Some(denied) => ProcessList::Denied {
            denied,
            partial: processes,
        },
    })
}

/// A MIG GPU's aggregate lists need root, while each MIG device's own lists may answer:
/// when every instance listed its processes, together they are the GPU's.
fn complete_from_instances(state: &mut GpuState, mig: &MigReading) {
    let GpuState::Ok { processes, .. } = state else {
        return;
    };
    if processes.denied().is_none() || !mig.enabled || mig.error.is_some() {
        return;
    }
    let mut union = Vec::new();
    for device in &mig.devices {
        match &device.state {
            GpuState::Ok {
                processes: ProcessList::Listed(listed),
                ..
            } => union.extend(listed.iter().copied()),
            _ => return,
        }
    }
    let mut union = NvmlProcess::distinct(union);
    union.sort_by_key(|process| process.pid);
    *processes = ProcessList::Listed(union);
}

/// MIG mode and, while enabled, every MIG device through its own handle; `None` for a
/// GPU (or driver) without MIG.
fn read_mig(device: &Device, answers: &mut Answers) -> Option<MigReading> {
    let now = Instant::now();
    let (current, pending) = match answers.mig_mode {
        Some((read_at, mode)) if now.duration_since(read_at) < MIG_MODE_FOR => mode?,
        _ => {
            calling("nvmlDeviceGetMigMode");
            let mode = match device.mig_mode() {
                Ok(mode) => Some((mode.current, mode.pending)),
                Err(error) => {
                    tracing::debug!(error = %error, "no MIG mode");
                    None
                }
            };
            answers.mig_mode = Some((now, mode));
            mode?
        }
    };
    let mut mig = MigReading {
        enabled: current == MIG_ENABLED,
        pending: pending == MIG_ENABLED,
        devices: Vec::new(),
        error: None,
    };
    if !mig.enabled {
        return Some(mig);
    }
    calling("nvmlDeviceGetMaxMigDeviceCount");
    let slots = match device.mig_device_count() {
        Ok(slots) => slots,
        Err(error) => {
            mig.error = Some(error.to_string());
            return Some(mig);
        }
    };
    for index in 0..slots {
        calling("nvmlDeviceGetMigDeviceHandleByIndex");
        match device.mig_device_by_index(index) {
            Ok(instance) => mig.devices.push(read_mig_device(index, &instance)),
            // Indices without a MIG device, below the GPU's maximum.
            Err(NvmlError::NotFound) => {}
            Err(error) => mig.devices.push(MigDeviceReading {
                index,
                uuid: String::new(),
                name: String::new(),
                profile: String::new(),
                gpu_instance_id: None,
                compute_instance_id: None,
                capabilities: None,
                state: failed(error),
            }),
        }
    }
    Some(mig)
}

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

fn read_mig_device(index: u32, device: &Device) -> MigDeviceReading {
    calling("nvmlDeviceGetName");
    let name = match device.name() {
        Ok(name) => name,
        Err(NvmlError::Utf8Error(_)) => lossy_name(device).unwrap_or_default(),
        Err(_) => String::new(),
    };
    calling("nvmlDeviceGetUUID");
    let uuid = device.uuid().unwrap_or_default();
    MigDeviceReading {
        index,
        uuid,
        profile: mig_profile(&name).to_string(),
        name,
        gpu_instance_id: instance_id(device, InstanceKind::Gpu),
        compute_instance_id: instance_id(device, InstanceKind::Compute),
        capabilities: None,
        state: read_state(device),
    }
}

/// The profile a MIG device's name ends with: `1g.18gb` of `NVIDIA H200 MIG 1g.18gb`,
/// `1c.3g.20gb` of a compute instance smaller than its GPU instance.
fn mig_profile(name: &str) -> &str {
    name.rsplit_once(" MIG ")
        .map_or("", |(_, profile)| profile.trim())
}

/// Which id of a MIG device to ask for.
#[derive(Clone, Copy)]
enum InstanceKind {
    Gpu,
    Compute,
}

/// A MIG device's GPU or compute instance id; nvml-wrapper does not wrap these calls.
fn instance_id(device: &Device, kind: InstanceKind) -> Option<u32> {
    let lib = device.nvml().lib();
    let call = match kind {
        InstanceKind::Gpu => {
            calling("nvmlDeviceGetGpuInstanceId");
            lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?
        }
        InstanceKind::Compute => {
            calling("nvmlDeviceGetComputeInstanceId");
            lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?
        }
    };
    let mut id = 0;
    // SAFETY: the handle comes from a live `Device` of this library, and NVML writes one
    // unsigned int into `id`, which we own.
    let status = unsafe { call(device.handle(), &mut id) };
    (status == 0).then_some(id)
}

/// What the driver says the GPU needs: as kept, while the GPU answered (`answered`), the
/// reading is younger than [`HEALTH_FOR`] and no critical Xid event arrived since;
/// otherwise asked again. A GPU that fails is asked on every scrape: what it needs is
/// then the question.
fn health(device: &Device, answers: &mut Answers, answered: bool, xid_events: u64) -> GpuHealth {
    let now = Instant::now();
    if let Some(kept) = answers.health.as_ref().filter(|kept| {
        answered && kept.xid_events == xid_events && now.duration_since(kept.read_at) < HEALTH_FOR
    }) {
        return kept.health.clone();
    }
    let health = read_health(device, answers);
    answers.health = answered.then(|| KeptHealth {
        read_at: now,
        xid_events,
        health: health.clone(),
    });
    health
}

/// What the driver says the GPU needs. Each reading that this driver or GPU cannot give
/// is `None`: a missing feature is not a failure of the GPU.
fn read_health(device: &Device, answers: &mut Answers) -> GpuHealth {
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

/// Which of a device's process lists to read.
#[derive(Debug, Clone, Copy)]
enum ListKind {
    Compute,
    Graphics,
    Mps,
}

/// NVML's raw process-list call (the `_v3` and `_v2` ones take the same entries): the
/// device, the room in the buffer (on return, the entries written or, when they do not
/// fit, the entries there are), the buffer.
type ListCall =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// Entries a thread's list buffer starts with; it grows to the longest list it was
/// given and keeps that room.
const FIRST_LIST_ROOM: usize = 16;
/// Room added beyond what NVML said it needs, for processes that start before the next
/// call.
const LIST_HEADROOM: usize = 8;
/// Calls at one list that keeps outgrowing its buffer, processes starting meanwhile.
const LIST_ATTEMPTS: usize = 4;
/// More entries than any GPU has processes: a count beyond it is not believed.
const MOST_LIST_ENTRIES: usize = 1 << 16;

const NO_ENTRY: nvmlProcessInfo_t = nvmlProcessInfo_t {
    pid: 0,
    usedGpuMemory: 0,
    gpuInstanceId: 0,
    computeInstanceId: 0,
};

thread_local! {
    /// The buffer this thread reads process lists into, kept from one list and one
    /// scrape to the next, so that a list is read with one call.
    static LIST_BUFFER: RefCell<Vec<nvmlProcessInfo_t>> = const { RefCell::new(Vec::new()) };
}

/// One process list of `device`, read with one NVML call into a buffer kept between
/// calls, a second only when the list has outgrown it. nvml-wrapper's safe API asks for
/// a non-empty list twice (the count, then the entries), and the driver walks its
/// processes for each: on an H200 with 64 owners the compute list took 1.3 ms a call.
/// Drivers older than the `_v3` calls still answer the `_v2` ones; a list this driver
/// or GPU cannot give (no such call, or NotSupported) is empty, not a failure.
fn process_list(device: &Device, kind: ListKind) -> Result<Vec<ProcessInfo>, NvmlError> {
    let lib = device.nvml().lib();
    let (v3, v2) = match kind {
        ListKind::Compute => (
            (
                &lib.nvmlDeviceGetComputeRunningProcesses_v3,
                "nvmlDeviceGetComputeRunningProcesses_v3",
            ),
            Some((
                &lib.nvmlDeviceGetComputeRunningProcesses_v2,
                "nvmlDeviceGetComputeRunningProcesses_v2",
            )),
        ),
        ListKind::Graphics => (
            (
                &lib.nvmlDeviceGetGraphicsRunningProcesses_v3,
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
            ),
            Some((
                &lib.nvmlDeviceGetGraphicsRunningProcesses_v2,
                "nvmlDeviceGetGraphicsRunningProcesses_v2",
            )),
        ),
        ListKind::Mps => (
            (
                &lib.nvmlDeviceGetMPSComputeRunningProcesses_v3,
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            ),
            None,
        ),
    };
    let (call, name): (ListCall, _) = match (v3, v2) {
        ((Ok(v3), name), _) => (*v3, name),
        ((Err(_), _), Some((Ok(v2), name))) => (*v2, name),
        _ => return Ok(Vec::new()),
    };
    // SAFETY: the handle comes from a live `Device` of the library `call` belongs to.
    let handle = unsafe { device.handle() };
    match LIST_BUFFER.with_borrow_mut(|buffer| read_list((call, name), handle, buffer)) {
        Err(NvmlError::NotSupported) => Ok(Vec::new()),
        other => other,
    }
}

/// The entries `call` (with its NVML name, said before each call for the reader's
/// deadline) lists for `handle`, read into `buffer`, which grows when they do not fit
/// (NVML then says how many there are) and keeps its room.
fn read_list(
    (call, name): (ListCall, &'static str),
    handle: nvmlDevice_t,
    buffer: &mut Vec<nvmlProcessInfo_t>,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    if buffer.len() < FIRST_LIST_ROOM {
        buffer.resize(FIRST_LIST_ROOM, NO_ENTRY);
    }
    for _ in 0..LIST_ATTEMPTS {
        let mut count = c_uint::try_from(buffer.len()).unwrap_or(c_uint::MAX);
        calling(name);
        // SAFETY: the buffer holds `count` entries, which NVML writes at most, and both
        // the count and the buffer are ours for the call.
        let status = unsafe { call(handle, &mut count, buffer.as_mut_ptr()) };
        if status == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            let needed = count as usize;
            if needed > MOST_LIST_ENTRIES {
                return Err(NvmlError::InsufficientSize(Some(needed)));
            }
            let room = (needed + LIST_HEADROOM).max(buffer.len() + LIST_HEADROOM);
            buffer.resize(room, NO_ENTRY);
            continue;
        }
        nvml_try(status)?;
        let listed = (count as usize).min(buffer.len());
        return Ok(buffer[..listed]
            .iter()
            .map(|&entry| ProcessInfo::from(entry))
            .collect());
    }
    Err(NvmlError::InsufficientSize(None))
}

/// One entry per PID over the lists (see [`NvmlProcess::distinct`]), in PID order, with
/// the lists that name it; each list says which it is.
fn union_by_pid(
    lists: impl IntoIterator<Item = (Vec<ProcessInfo>, NvmlLists)>,
) -> Vec<NvmlProcess> {
    let mut processes = NvmlProcess::distinct(lists.into_iter().flat_map(|(list, which)| {
        list.into_iter().map(move |info| NvmlProcess {
            pid: info.pid,
            used_bytes: match info.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            mps_only: which == NvmlLists::MPS,
            lists: which,
        })
    }));
    processes.sort_by_key(|process| process.pid);
    processes
}

fn failed(error: NvmlError) -> GpuState {
    let kind = match error {
        NvmlError::GpuLost => GpuError::GpuLost,
        NvmlError::ResetRequired => GpuError::ResetRequired,
        NvmlError::NotSupported => GpuError::NotSupported,
        NvmlError::NoPermission => GpuError::NoPermission,
        NvmlError::Timeout => GpuError::Timeout,
        _ => GpuError::Unknown,
    };
    GpuState::Failed {
        error: kind,
        message: error.to_string(),
    }
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

    thread_local! {
        /// What the model list call answers on this test's thread: the entries it has,
        /// the status it returns instead, and how often it was called.
        static MODEL_LIST: RefCell<(Vec<nvmlProcessInfo_t>, nvmlReturn_t, usize)> =
            const { RefCell::new((Vec::new(), 0, 0)) };
    }

    /// A process-list call as NVML makes it: the entries when they fit, else
    /// InsufficientSize with the count needed.
    unsafe extern "C" fn model_list_call(
        _device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) -> nvmlReturn_t {
        MODEL_LIST.with_borrow_mut(|(entries, status, calls)| {
            *calls += 1;
            if *status != 0 {
                return *status;
            }
            // SAFETY: the caller passes its count and a buffer of that many entries.
            unsafe {
                let room = *count as usize;
                *count = entries.len() as c_uint;
                if room < entries.len() {
                    return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
                }
                std::ptr::copy_nonoverlapping(entries.as_ptr(), infos, entries.len());
            }
            0
        })
    }

    /// The model call lists `processes` entries (the last with its memory not
    /// available), or answers `status`; its call count starts again.
    fn model_lists(processes: u32, status: nvmlReturn_t) {
        let entries = (1..=processes)
            .map(|pid| nvmlProcessInfo_t {
                pid,
                usedGpuMemory: if pid == processes {
                    u64::MAX
                } else {
                    u64::from(pid) << 20
                },
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            })
            .collect();
        MODEL_LIST.set((entries, status, 0));
    }

    fn model_calls() -> usize {
        MODEL_LIST.with_borrow(|(_, _, calls)| *calls)
    }

    fn read_model(buffer: &mut Vec<nvmlProcessInfo_t>) -> Result<Vec<ProcessInfo>, NvmlError> {
        read_list((model_list_call, "model"), std::ptr::null_mut(), buffer)
    }

    #[test]
    fn a_process_list_is_read_with_one_call_into_a_buffer_that_is_kept() {
        let mut buffer = Vec::new();
        model_lists(3, 0);
        let listed = read_model(&mut buffer).unwrap();
        assert_eq!(model_calls(), 1);
        assert_eq!(
            listed.iter().map(|info| info.pid).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(listed[1].used_gpu_memory, UsedGpuMemory::Used(2 << 20));
        assert_eq!(listed[2].used_gpu_memory, UsedGpuMemory::Unavailable);
        // An empty list is one call too.
        model_lists(0, 0);
        assert!(read_model(&mut buffer).unwrap().is_empty());
        assert_eq!(model_calls(), 1);
    }

    #[test]
    fn a_list_longer_than_the_buffer_grows_it_once() {
        let mut buffer = Vec::new();
        let longer = FIRST_LIST_ROOM as u32 * 4;
        model_lists(longer, 0);
        assert_eq!(read_model(&mut buffer).unwrap().len(), longer as usize);
        assert_eq!(
            model_calls(),
            2,
            "one call to learn the length, one to read"
        );
        // The next read of a list as long, or a little longer, takes one call.
        model_lists(longer + LIST_HEADROOM as u32, 0);
        assert_eq!(
            read_model(&mut buffer).unwrap().len(),
            longer as usize + LIST_HEADROOM
        );
        assert_eq!(model_calls(), 1);
    }

    #[test]
    fn a_refused_or_absurd_list_is_an_error() {
        let mut buffer = Vec::new();
        model_lists(2, 4); // NVML_ERROR_NO_PERMISSION
        assert!(matches!(
            read_model(&mut buffer),
            Err(NvmlError::NoPermission)
        ));
        assert_eq!(model_calls(), 1);
        // A count beyond any GPU's is not a buffer to allocate.
        model_lists(MOST_LIST_ENTRIES as u32 + 1, 0);
        assert!(matches!(
            read_model(&mut buffer),
            Err(NvmlError::InsufficientSize(_))
        ));
        assert!(buffer.len() <= MOST_LIST_ENTRIES);
    }

    #[test]
    fn mig_profiles_are_the_end_of_the_name() {
        assert_eq!(mig_profile("NVIDIA H200 MIG 1g.18gb"), "1g.18gb");
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"),
            "1c.3g.20gb"
        );
        assert_eq!(mig_profile("NVIDIA H200"), "");
    }

    fn memory(used: u64) -> MemoryReading {
        MemoryReading {
            total: 18 << 30,
            reserved: 0,
            used,
            free: (18 << 30) - used,
        }
    }

    fn instance(index: u32, processes: ProcessList) -> MigDeviceReading {
        MigDeviceReading {
            index,
            uuid: format!("MIG-{index}"),
            name: "NVIDIA H200 MIG 1g.18gb".into(),
            profile: "1g.18gb".into(),
            gpu_instance_id: Some(index + 1),
            compute_instance_id: Some(0),
            capabilities: None,
            state: GpuState::Ok {
                memory: memory(1 << 30),
                processes,
            },
        }
    }

    fn process(pid: u32) -> NvmlProcess {
        NvmlProcess {
            pid,
            used_bytes: Some(1 << 30),
            mps_only: false,
            lists: NvmlLists::COMPUTE,
        }
    }

    #[test]
    fn each_process_carries_the_lists_that_name_it() {
        // What the H200 listed under MPS (driver 580): the server on the compute list, a
        // live client on the compute and MPS lists, a graphics process on its own list.
        let info = |pid: u32, bytes: u64| ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(bytes),
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        let processes = union_by_pid([
            (
                vec![info(466, 69_206_016), info(449, 3_860_856_832)],
                NvmlLists::COMPUTE,
            ),
            (vec![info(900, 1 << 20)], NvmlLists::GRAPHICS),
            (vec![info(449, 3_860_856_832)], NvmlLists::MPS),
        ]);
        let lists: Vec<(u32, NvmlLists, bool)> = processes
            .iter()
            .map(|process| (process.pid, process.lists, process.mps_only))
            .collect();
        assert_eq!(
            lists,
            [
                (449, NvmlLists::COMPUTE.and(NvmlLists::MPS), false),
                (466, NvmlLists::COMPUTE, false),
                (900, NvmlLists::GRAPHICS, false),
            ]
        );
        // A PID on the MPS list alone is the one case its own mappings cannot prove.
        let alone = union_by_pid([(vec![info(7, 1)], NvmlLists::MPS)]);
        assert!(alone[0].mps_only && alone[0].lists == NvmlLists::MPS);
    }

    fn denied() -> ProcessList {
        ProcessList::Denied {
            denied: "Insufficient Permissions".into(),
            partial: Vec::new(),
        }
    }

    #[test]
    fn a_refused_aggregate_is_completed_from_instances_that_all_answered() {
        let mig = MigReading {
            enabled: true,
            pending: true,
            devices: vec![
                instance(0, ProcessList::Listed(vec![process(30)])),
                instance(1, ProcessList::Listed(vec![])),
                instance(2, ProcessList::Listed(vec![process(20), process(30)])),
            ],
            error: None,
        };
        let mut state = GpuState::Ok {
            memory: memory(2 << 30),
            processes: denied(),
        };
        complete_from_instances(&mut state, &mig);
        let GpuState::Ok { processes, .. } = &state else {
            unreachable!()
        };
        assert_eq!(
            processes,
            &ProcessList::Listed(vec![process(20), process(30)])
        );
    }

    #[test]
    fn one_refused_instance_keeps_the_aggregate_refused() {
        let mig = MigReading {
            enabled: true,
            pending: true,
            devices: vec![
                instance(0, ProcessList::Listed(vec![process(30)])),
                instance(1, denied()),
            ],
            error: None,
        };
        let mut state = GpuState::Ok {
            memory: memory(2 << 30),
            processes: denied(),
        };
        complete_from_instances(&mut state, &mig);
        let GpuState::Ok { processes, .. } = &state else {
            unreachable!()
        };
        assert!(processes.denied().is_some());
    }
}
