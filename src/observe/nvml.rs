//! NVML, loaded at run time: the GPUs, their memory and the processes charged for it.

use super::{GpuError, GpuReading, GpuState, MemoryReading, NvmlProcess, NvmlReading};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// First wait before loading NVML again after a failure; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Identity of a GPU as last seen, so a GPU that is lost keeps its labels.
#[derive(Debug, Clone, Default)]
struct Identity {
    uuid: String,
    name: String,
    pci_bus_id: String,
    minor: Option<u32>,
}

#[derive(Debug)]
enum Library {
    Loaded(Box<Nvml>),
    Failed {
        error: String,
        retry_at: Instant,
        backoff: Duration,
    },
}

#[derive(Debug)]
struct State {
    library: Option<Library>,
    identities: HashMap<u32, Identity>,
}

/// A handle on NVML that loads it lazily and retries with back-off when it cannot.
#[derive(Debug)]
pub struct NvmlSource {
    path: Option<PathBuf>,
    /// A server says once, loudly, that it keeps going without NVML; a one-shot command
    /// reports the failure in its own output instead.
    long_running: bool,
    state: Mutex<State>,
}

impl NvmlSource {
    /// A source loading `path`, or the system's `libnvidia-ml.so.1` when `None`.
    pub fn new(path: Option<PathBuf>, long_running: bool) -> NvmlSource {
        NvmlSource {
            path,
            long_running,
            state: Mutex::new(State {
                library: None,
                identities: HashMap::new(),
            }),
        }
    }

    /// Read every GPU; NVML's own failures become a `Down` reading, never a panic.
    pub fn read(&self) -> NvmlReading {
        let mut state = crate::sync::lock(&self.state);
        let State {
            library,
            identities,
        } = &mut *state;
        let now = Instant::now();
        let must_load = match library {
            None => true,
            Some(Library::Failed { retry_at, .. }) => now >= *retry_at,
            Some(Library::Loaded(_)) => false,
        };
        if must_load {
            let previous_backoff = match library {
                Some(Library::Failed { backoff, .. }) => Some(*backoff),
                _ => None,
            };
            *library = Some(match self.load() {
                Ok(nvml) => {
                    if previous_backoff.is_some() {
                        tracing::info!("NVML loaded after earlier failures");
                    }
                    Library::Loaded(Box::new(nvml))
                }
                Err(error) => {
                    let backoff = previous_backoff.map_or(FIRST_RETRY, |b| (b * 2).min(MAX_RETRY));
                    if previous_backoff.is_none() && self.long_running {
                        tracing::error!(error = %error, retry_in = ?backoff, "cannot load NVML; serving vram_nvml_up 0 and retrying");
                    } else {
                        tracing::debug!(error = %error, retry_in = ?backoff, "NVML still not loadable");
                    }
                    Library::Failed {
                        error,
                        retry_at: now + backoff,
                        backoff,
                    }
                }
            });
        }
        match library {
            Some(Library::Loaded(nvml)) => match read_all(nvml, identities) {
                Ok(reading) => reading,
                Err(error) => {
                    // The driver went away under us (unloaded, upgraded): start over.
                    let message = format!("NVML stopped answering: {error}");
                    tracing::error!(error = %error, "NVML stopped answering; reloading on a later scrape");
                    *library = Some(Library::Failed {
                        error: message.clone(),
                        retry_at: now + FIRST_RETRY,
                        backoff: FIRST_RETRY,
                    });
                    NvmlReading::Down { error: message }
                }
            },
            Some(Library::Failed { error, .. }) => NvmlReading::Down {
                error: error.clone(),
            },
            None => unreachable!("the library was set above"),
        }
    }

    /// The UUID of the GPU each of these MIG devices (`MIG-...` UUIDs, as the kubelet
    /// names them) is part of. Devices NVML does not know, and any answer while NVML is
    /// not loaded, are left out: those devices stay unplaced rather than guessed.
    pub fn mig_parents(&self, mig_uuids: &[String]) -> BTreeMap<String, String> {
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(Library::Loaded(nvml)) = &state.library else {
            return BTreeMap::new();
        };
        mig_uuids
            .iter()
            .filter_map(|uuid| {
                let device = nvml.device_by_uuid(uuid.as_str()).ok()?;
                let parent = device.mig_parent_device().ok()?;
                Some((uuid.clone(), parent.uuid().ok()?))
            })
            .collect()
    }

    fn load(&self) -> Result<Nvml, String> {
        let result = match &self.path {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::builder()
                .lib_path(OsStr::new("libnvidia-ml.so.1"))
                .init(),
        };
        let shown = self
            .path
            .as_deref()
            .map_or_else(|| "libnvidia-ml.so.1".into(), |p| p.display().to_string());
        result.map_err(|error| format!("cannot load NVML from {shown}: {error}"))
    }
}

fn read_all(
    nvml: &Nvml,
    identities: &mut HashMap<u32, Identity>,
) -> Result<NvmlReading, NvmlError> {
    let count = nvml.device_count()?;
    let driver_version = nvml.sys_driver_version().unwrap_or_default();
    let gpus = (0..count)
        .map(|index| {
            let cached = identities.entry(index).or_default();
            read_gpu(nvml, index, cached)
        })
        .collect();
    Ok(NvmlReading::Up {
        driver_version,
        gpus,
    })
}

fn read_gpu(nvml: &Nvml, index: u32, cached: &mut Identity) -> GpuReading {
    let state = match nvml.device_by_index(index) {
        Ok(device) => {
            refresh_identity(&device, cached);
            match read_state(&device) {
                Ok((memory, processes)) => GpuState::Ok { memory, processes },
                Err(error) => failed(error),
            }
        }
        Err(error) => failed(error),
    };
    GpuReading {
        index,
        uuid: cached.uuid.clone(),
        name: cached.name.clone(),
        pci_bus_id: cached.pci_bus_id.clone(),
        minor: cached.minor,
        state,
    }
}

/// Keep what answers; a lost GPU keeps the identity it had when it last answered.
fn refresh_identity(device: &Device, cached: &mut Identity) {
    if let Ok(uuid) = device.uuid() {
        cached.uuid = uuid;
    }
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
    if let Ok(pci) = device.pci_info() {
        cached.pci_bus_id = pci.bus_id;
    }
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

fn read_state(device: &Device) -> Result<(MemoryReading, Vec<NvmlProcess>), NvmlError> {
    let info = device.memory_info()?;
    let memory = MemoryReading {
        total: info.total,
        reserved: info.reserved,
        used: info.used,
        free: info.free,
    };
    let compute = with_v2_fallback(device.running_compute_processes(), || {
        device.running_compute_processes_v2()
    })?;
    let graphics = with_v2_fallback(device.running_graphics_processes(), || {
        device.running_graphics_processes_v2()
    })?;
    let mps = optional(device.mps_running_compute_processes())?;
    Ok((
        memory,
        union_by_pid([(compute, false), (graphics, false), (mps, true)]),
    ))
}

/// Drivers older than the `_v3` process calls still answer the `_v2` ones.
fn with_v2_fallback(
    v3: Result<Vec<ProcessInfo>, NvmlError>,
    v2: impl FnOnce() -> Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    match v3 {
        Err(NvmlError::FailedToLoadSymbol(_)) => optional(v2()),
        other => optional(other),
    }
}

/// A list this driver or GPU cannot give is empty, not a failure of the GPU.
fn optional(list: Result<Vec<ProcessInfo>, NvmlError>) -> Result<Vec<ProcessInfo>, NvmlError> {
    match list {
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Ok(Vec::new()),
        other => other,
    }
}

/// One entry per PID over the lists (see [`NvmlProcess::distinct`]), in PID order; each
/// list says whether it is the MPS clients'.
fn union_by_pid<const N: usize>(lists: [(Vec<ProcessInfo>, bool); N]) -> Vec<NvmlProcess> {
    let mut processes = NvmlProcess::distinct(lists.into_iter().flat_map(|(list, mps)| {
        list.into_iter().map(move |info| NvmlProcess {
            pid: info.pid,
            used_bytes: match info.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            mps_only: mps,
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
        _ => GpuError::Unknown,
    };
    GpuState::Failed {
        error: kind,
        message: error.to_string(),
    }
}
