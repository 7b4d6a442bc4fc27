//! What a GPU or a MIG device holds: its memory, and the processes NVML charges for it,
//! from the union of its three process lists, each read with one call into a buffer
//! kept between scrapes.

use crate::observe::nvml::reading::{
    GpuError, GpuState, MemoryReading, NvmlLists, NvmlProcess, ProcessList,
};
use crate::observe::worker::calling;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_t,
};
use std::cell::RefCell;
use std::ffi::c_uint;

/// Memory and processes of a GPU or a MIG device. A refused process list does not fail
/// the device: its memory is still known, and the refusal is kept in the list.
pub(super) fn read_state(device: &Device) -> GpuState {
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

pub(super) fn failed(error: NvmlError) -> GpuState {
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
}
