//! The JSON scenario file the fake answers from (format in docs/fake-nvml.md).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use std::{env, fs, thread};

use serde::Deserialize;
use std::sync::{Arc, Mutex};

/// Environment variable naming the scenario file.
const SCENARIO_ENV: &str = "FAKE_NVML_SCENARIO";

/// An NVML error code, named in scenario files as in nvml-wrapper's `NvmlError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Error {
    /// `NVML_ERROR_UNINITIALIZED`
    Uninitialized = 1,
    /// `NVML_ERROR_INVALID_ARGUMENT`
    InvalidArg = 2,
    /// `NVML_ERROR_NOT_SUPPORTED`
    NotSupported = 3,
    /// `NVML_ERROR_NO_PERMISSION`
    NoPermission = 4,
    /// `NVML_ERROR_NOT_FOUND`
    NotFound = 6,
    /// `NVML_ERROR_INSUFFICIENT_SIZE`
    InsufficientSize = 7,
    /// `NVML_ERROR_DRIVER_NOT_LOADED`
    DriverNotLoaded = 9,
    /// `NVML_ERROR_TIMEOUT`
    Timeout = 10,
    /// `NVML_ERROR_GPU_IS_LOST`
    GpuLost = 15,
    /// `NVML_ERROR_RESET_REQUIRED`
    ResetRequired = 16,
    /// `NVML_ERROR_LIB_RM_VERSION_MISMATCH`
    LibRmVersionMismatch = 18,
    /// `NVML_ERROR_UNKNOWN`
    Unknown = 999,
}

/// The whole simulated machine.
// Unknown fields are rejected so that a misspelt key fails loudly instead of being ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What `nvmlInit_v2` returns instead of success.
    #[serde(default)]
    pub init_error: Option<Error>,
    /// What `nvmlSystemGetDriverVersion` answers.
    pub driver_version: String,
    /// The devices, in index order.
    pub gpus: Vec<Gpu>,
    /// Critical Xid events that have happened, each delivered once to every event set
    /// created before it appeared (see [`XidEvent::seq`]).
    #[serde(default)]
    pub xid_events: Vec<XidEvent>,
    /// Per exported symbol (or `*` for every call), how long any call of it sleeps first
    /// and the hang it plays first, whatever it is asked about: the library-level calls
    /// (`nvmlInit_v2`, `nvmlDeviceGetCount_v2`, ...) are slowed here, and so is every call
    /// of a slow driver.
    #[serde(flatten)]
    pub faults: Faults,
}

/// Failing, slow and hung calls: `errors`, `delays_ms` and `hangs`, the same keys at each
/// level of the file, where they apply to every call (the top level) or to the calls
/// about one GPU or MIG device. Only a device has `errors`: a library-level call fails by
/// the scenario's own keys (`init_error`), and a top level with `errors` is refused.
// Flattened into each level: serde still refuses, for the level's `deny_unknown_fields`,
// a key that neither the level's own fields nor these take.
#[derive(Debug, Default, Deserialize)]
pub struct Faults {
    /// Per exported symbol, the error that call returns for this device.
    #[serde(default)]
    pub errors: HashMap<String, Error>,
    /// Per exported symbol (or `*` for every call), how long the call sleeps first; a
    /// named entry wins over `*`.
    #[serde(default)]
    pub delays_ms: HashMap<String, u64>,
    /// Per exported symbol (or `*`), a hang the call plays first (see [`Hang`]).
    #[serde(default)]
    pub hangs: HashMap<String, Hang>,
}

/// A call that blocks, as NVML's do on a GPU that fell off the bus or under a wedged
/// driver, until the scenario says it ends: once `until_file` exists, or after `for_ms`,
/// whichever comes first. At least one of them is required, so that a test's hang always
/// ends. A call that starts after its end condition holds does not block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hang {
    /// The hang ends once this path exists (looked at every 10 ms).
    #[serde(default)]
    pub until_file: Option<PathBuf>,
    /// The hang ends after this many milliseconds.
    #[serde(default)]
    pub for_ms: Option<u64>,
}

impl Hang {
    /// Blocks until the hang's end.
    fn play(&self) {
        let started = Instant::now();
        loop {
            if self.until_file.as_ref().is_some_and(|file| file.exists()) {
                return;
            }
            if self
                .for_ms
                .is_some_and(|ms| started.elapsed() >= Duration::from_millis(ms))
            {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the hang says when it ends.
    fn ends(&self) -> bool {
        self.until_file.is_some() || self.for_ms.is_some()
    }
}

/// One critical Xid error, as `nvmlEventSetWait_v2` delivers it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    /// Position in the machine's event history: a set delivers the events whose `seq`
    /// is above the highest one present when it was created, in `seq` order, once each.
    pub seq: u64,
    /// Index of the GPU it happened on.
    pub gpu: usize,
    /// The Xid number (79: fallen off the bus).
    pub xid: u64,
    /// The GPU instance it happened in, on a MIG GPU.
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// The compute instance it happened in, on a MIG GPU.
    #[serde(default)]
    pub compute_instance_id: Option<u32>,
}

/// One simulated device.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// The device UUID, `GPU-...`.
    pub uuid: String,
    /// The product name.
    pub name: String,
    /// Raw name bytes that override `name`, to send invalid UTF-8.
    #[serde(default)]
    pub name_bytes: Option<Vec<u8>>,
    /// The PCI bus id, `DDDDDDDD:BB:DD.F` in hex.
    pub pci_bus_id: String,
    /// The minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// Framebuffer memory.
    pub memory: Memory,
    /// The processes with a context on this device.
    #[serde(flatten)]
    pub processes: ProcessLists,
    /// The errors, hangs and delays of the calls on this device (`*`: every call on it).
    #[serde(flatten)]
    pub faults: Faults,
    /// MIG mode and MIG devices; absent on a GPU without MIG support.
    #[serde(default)]
    pub mig: Option<Mig>,
    /// Raw value of the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`; absent on a driver
    /// older than 565, whose field answers `NotSupported`.
    #[serde(default)]
    pub recovery_action: Option<u32>,
    /// Row remapping; absent on GPUs before Ampere (`NotSupported`).
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement; absent where the GPU does not retire pages (`NotSupported`).
    #[serde(default)]
    pub retired_pages: Option<RetiredPages>,
    /// The NUMA node of the GPU's memory, on coherent platforms in NUMA mode.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// `nvmlDeviceGetSupportedEventTypes`' bitmask; [`DEFAULT_EVENT_TYPES`] when absent.
    #[serde(default)]
    pub supported_events: Option<u64>,
}

/// Event types a GPU supports unless its scenario says otherwise: single- and
/// double-bit ECC, P-state, critical Xid and clock changes.
pub const DEFAULT_EVENT_TYPES: u64 = 0x1F;

/// MIG on one GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    /// Whether MIG is enabled now.
    pub current: bool,
    /// The mode after the next reset; `current` when absent.
    #[serde(default)]
    pub pending: Option<bool>,
    /// `nvmlDeviceGetMaxMigDeviceCount`; 7 (an H100/H200's) when absent.
    #[serde(default)]
    pub max_devices: Option<u32>,
    /// The MIG devices, in MIG device index order; only reachable while `current`.
    #[serde(default)]
    pub devices: Vec<MigDevice>,
}

/// One MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDevice {
    /// The MIG device UUID, `MIG-...`.
    pub uuid: String,
    /// The name NVML gives it, e.g. `NVIDIA H200 MIG 1g.18gb`.
    pub name: String,
    /// The GPU instance id.
    pub gpu_instance_id: u32,
    /// The compute instance id within the GPU instance.
    pub compute_instance_id: u32,
    /// The instance's memory.
    pub memory: Memory,
    /// The processes with a context in this instance.
    #[serde(flatten)]
    pub processes: ProcessLists,
    /// The errors, hangs and delays of the calls on this MIG device (`*`: every call on it).
    #[serde(flatten)]
    pub faults: Faults,
}

/// The three process lists of a GPU or a MIG device, flattened into it as [`Faults`] is.
#[derive(Debug, Default, Deserialize)]
pub struct ProcessLists {
    /// Processes with a compute context.
    #[serde(default)]
    pub compute_processes: Vec<Process>,
    /// Processes with a graphics context.
    #[serde(default)]
    pub graphics_processes: Vec<Process>,
    /// Processes running through MPS.
    #[serde(default)]
    pub mps_processes: Vec<Process>,
}

/// What `nvmlDeviceGetRemappedRows` answers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    /// Rows remapped after correctable errors.
    pub correctable: u32,
    /// Rows remapped after uncorrectable errors.
    pub uncorrectable: u32,
    /// A remapping waits for the next GPU reset.
    pub pending: bool,
    /// A remapping failed (no spare row left).
    pub failure: bool,
}

/// What the retired-page calls answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredPages {
    /// Pages retired after multiple single-bit ECC errors.
    pub multiple_single_bit: u32,
    /// Pages retired after a double-bit ECC error.
    pub double_bit: u32,
    /// Retirements wait for the next reboot or reset.
    pub pending: bool,
}

/// Framebuffer memory in bytes, split as `nvmlMemory_v2_t` does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Installed memory.
    pub total: u64,
    /// Memory the driver keeps for itself.
    pub reserved: u64,
    /// Memory allocated by processes.
    pub used: u64,
    /// Free memory; derived from the others when absent.
    #[serde(default)]
    pub free: Option<u64>,
}

/// One process holding a context on a device.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// The process id.
    pub pid: u32,
    /// Its memory usage; `None` when NVML cannot tell.
    pub used_bytes: Option<u64>,
}

impl Scenario {
    /// Reads the scenario file afresh, so tests can change it between two calls.
    pub fn load() -> Result<Arc<Self>, Error> {
        let Some(path) = env::var_os(SCENARIO_ENV) else {
            say_once(
                None,
                format_args!(
                    "fake-nvml: {SCENARIO_ENV} is not set, so there is no scenario and NVML answers as on a host without a driver (NVML_ERROR_DRIVER_NOT_LOADED): set it to a scenario file, e.g. {SCENARIO_ENV}=fake-nvml/examples/healthy-and-orphan.json (docs/fake-nvml.md)"
                ),
            );
            return Err(Error::Unknown);
        };
        // Parsing the file on every call would make the fake, not the exporter, the cost
        // a benchmark measures: a parsed scenario is kept while the file is the same file
        // (tests replace it by renaming a new one over it) with the same size and time.
        // That key alone can miss a change: the kernel stamps files from a coarse clock
        // (a few ms), and a file renamed over the last one can get its freed inode back,
        // so two scenarios of the same size written within one tick look the same. While
        // the file is that young its bytes decide; a benchmark's scenario is older.
        let meta = fs::metadata(&path).ok();
        let key = meta.as_ref().map(|meta| {
            use std::os::unix::fs::MetadataExt;
            (
                path.clone(),
                meta.dev(),
                meta.ino(),
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec(),
            )
        });
        let young = meta
            .and_then(|meta| meta.modified().ok())
            .and_then(|modified| modified.elapsed().ok())
            .is_none_or(|age| age < SAME_TICK);
        static PARSED: Mutex<Option<Parsed>> = Mutex::new(None);
        let mut parsed = PARSED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let text = if young {
            Some(Self::read(&path)?)
        } else {
            None
        };
        if let (Some(key), Some((known, known_text, scenario))) = (&key, parsed.as_ref()) {
            if key == known && text.as_ref().is_none_or(|text| text == known_text) {
                return Ok(Arc::clone(scenario));
            }
        }
        let text = match text {
            Some(text) => text,
            None => Self::read(&path)?,
        };
        let scenario = Arc::new(Self::parse(&path, &text)?);
        if let Some(key) = key {
            *parsed = Some((key, text, Arc::clone(&scenario)));
        }
        Ok(scenario)
    }

    fn read(path: &std::ffi::OsStr) -> Result<Vec<u8>, Error> {
        fs::read(path).map_err(|err| {
            // A missing file is a legitimate "no driver" scenario, which tests use: said
            // once, since a misspelled name looks the same. Anything else is a test bug.
            if err.kind() == ErrorKind::NotFound {
                say_once(
                    Some(path),
                    format_args!(
                        "fake-nvml: {SCENARIO_ENV} names {}, which does not exist, so NVML answers as on a host without a driver (NVML_ERROR_DRIVER_NOT_LOADED) until it does",
                        path.to_string_lossy()
                    ),
                );
            } else {
                eprintln!("fake-nvml: cannot read {}: {err}", path.to_string_lossy());
            }
            Error::Unknown
        })
    }

    fn parse(path: &std::ffi::OsStr, text: &[u8]) -> Result<Self, Error> {
        let scenario: Scenario = serde_json::from_slice(text).map_err(|err| {
            eprintln!("fake-nvml: cannot parse {}: {err}", path.to_string_lossy());
            Error::Unknown
        })?;
        // An error is a device's: at the top level it would silently do nothing.
        if !scenario.faults.errors.is_empty() {
            eprintln!(
                "fake-nvml: cannot use {}: errors belong to a GPU or a MIG device (a library-level call fails by init_error)",
                path.to_string_lossy()
            );
            return Err(Error::Unknown);
        }
        // A hang without an end would outlive the test that set it.
        let hangs = scenario
            .faults
            .hangs
            .iter()
            .chain(scenario.gpus.iter().flat_map(|gpu| {
                let devices = gpu.mig.iter().flat_map(|mig| &mig.devices);
                gpu.faults
                    .hangs
                    .iter()
                    .chain(devices.flat_map(|device| &device.faults.hangs))
            }));
        for (symbol, hang) in hangs {
            if !hang.ends() {
                eprintln!(
                    "fake-nvml: cannot use {}: the hang of {symbol} needs until_file or for_ms",
                    path.to_string_lossy()
                );
                return Err(Error::Unknown);
            }
        }
        Ok(scenario)
    }

    /// The device at `index`, or `InvalidArg` past the end.
    pub fn gpu(&self, index: usize) -> Result<&Gpu, Error> {
        self.gpus.get(index).ok_or(Error::InvalidArg)
    }
}

/// What identifies one version of the scenario file: path, device, inode, size, mtime.
type FileKey = (std::ffi::OsString, u64, u64, u64, i64, i64);

/// The scenario last parsed: its file's key, its bytes and what they said.
type Parsed = (FileKey, Vec<u8>, Arc<Scenario>);

/// Younger than this, a scenario file may have been rewritten within the same tick of the
/// kernel's file clock (4 ms at HZ=250), so its bytes are compared, not only its key.
/// Prints `message` to standard error unless the last message was about the same
/// scenario path (`None`: the variable unset): NVML is called many times a second, and
/// one line says it.
fn say_once(path: Option<&std::ffi::OsStr>, message: std::fmt::Arguments) {
    static LAST: Mutex<Option<Option<std::ffi::OsString>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let this = path.map(std::ffi::OsStr::to_os_string);
    if last.as_ref() != Some(&this) {
        eprintln!("{message}");
        *last = Some(this);
    }
}

const SAME_TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// The entry for `symbol` in `table`, or its `*` entry for every call.
fn for_symbol<'a, T>(table: &'a HashMap<String, T>, symbol: &str) -> Option<&'a T> {
    table.get(symbol).or_else(|| table.get("*"))
}

impl Faults {
    /// Plays the hang and the delay held for `symbol`.
    pub fn slow_down(&self, symbol: &str) {
        if let Some(hang) = for_symbol(&self.hangs, symbol) {
            hang.play();
        }
        if let Some(&ms) = for_symbol(&self.delays_ms, symbol) {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// Plays the hang and the delay held for `symbol`, then answers the error held for it.
    fn enter(&self, symbol: &str) -> Result<(), Error> {
        self.slow_down(symbol);
        self.errors.get(symbol).map_or(Ok(()), |&err| Err(err))
    }
}

impl Scenario {
    /// Plays the machine-wide hang and delay for the call `symbol`.
    pub fn slow_down(&self, symbol: &str) {
        self.faults.slow_down(symbol);
    }
}

impl Gpu {
    /// Plays this device's hang, delay and injected error for the call `symbol`.
    pub fn enter(&self, symbol: &str) -> Result<(), Error> {
        self.faults.enter(symbol)
    }

    /// The MIG devices reachable now: none unless MIG is enabled.
    pub fn mig_devices(&self) -> &[MigDevice] {
        match &self.mig {
            Some(mig) if mig.current => &mig.devices,
            _ => &[],
        }
    }

    /// The name as sent to the caller.
    pub fn name_bytes(&self) -> &[u8] {
        self.name_bytes.as_deref().unwrap_or(self.name.as_bytes())
    }

    /// Domain, bus and device numbers parsed from the bus id, if it is well formed.
    pub fn pci_location(&self) -> Option<(u32, u32, u32)> {
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (domain, rest) = self.pci_bus_id.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, _function) = rest.split_once('.')?;
        Some((hex(domain)?, hex(bus)?, hex(device)?))
    }
}

impl MigDevice {
    /// Plays this MIG device's hang, delay and injected error for the call `symbol`.
    pub fn enter(&self, symbol: &str) -> Result<(), Error> {
        self.faults.enter(symbol)
    }
}

impl Scenario {
    /// The highest event sequence number present, 0 without events.
    pub fn last_event(&self) -> u64 {
        self.xid_events
            .iter()
            .map(|event| event.seq)
            .max()
            .unwrap_or(0)
    }
}

impl Memory {
    /// Free memory, as given or as what the driver and processes leave.
    pub fn free(&self) -> u64 {
        self.free.unwrap_or_else(|| {
            self.total
                .saturating_sub(self.reserved)
                .saturating_sub(self.used)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// One GPU with one MIG device, with `gpu` and `device` merged into them and `top`
    /// into the scenario.
    fn scenario(top: Value, gpu: Value, device: Value) -> Result<Scenario, Error> {
        let merge = |mut base: Value, extra: Value| {
            base.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            base
        };
        let memory = json!({"total": 100, "reserved": 1, "used": 0});
        let device = merge(
            json!({"uuid": "MIG-0", "name": "MIG 1g", "gpu_instance_id": 1,
                   "compute_instance_id": 0, "memory": memory}),
            device,
        );
        let gpu = merge(
            json!({"uuid": "GPU-0", "name": "GPU", "pci_bus_id": "00000000:19:00.0",
                   "minor": 0, "memory": memory,
                   "mig": {"current": true, "devices": [device]}}),
            gpu,
        );
        let text = merge(json!({"driver_version": "580.159.04", "gpus": [gpu]}), top);
        Scenario::parse(
            std::ffi::OsStr::new("a test's scenario"),
            text.to_string().as_bytes(),
        )
    }

    #[test]
    fn each_level_takes_its_faults_and_refuses_a_key_it_does_not_know() {
        let none = || json!({});
        let faults = json!({"delays_ms": {"*": 5}, "hangs": {"nvmlShutdown": {"for_ms": 1}}});
        let errors = json!({"errors": {"nvmlDeviceGetMemoryInfo_v2": "GpuLost"}});
        let parsed = scenario(faults.clone(), errors.clone(), errors.clone()).unwrap();
        assert_eq!(parsed.faults.delays_ms["*"], 5);
        let gpu = &parsed.gpus[0];
        assert_eq!(
            gpu.faults.errors["nvmlDeviceGetMemoryInfo_v2"],
            Error::GpuLost
        );
        let device = &gpu.mig.as_ref().unwrap().devices[0];
        assert_eq!(
            device.enter("nvmlDeviceGetMemoryInfo_v2"),
            Err(Error::GpuLost)
        );
        assert!(scenario(none(), faults.clone(), faults).is_ok());
        // A misspelt key at any level, and errors where no device is, are refused.
        let misspelt = || json!({"delay_ms": {"*": 5}});
        for (top, gpu, device) in [
            (misspelt(), none(), none()),
            (none(), misspelt(), none()),
            (none(), none(), misspelt()),
            (errors, none(), none()),
        ] {
            assert!(scenario(top, gpu, device).is_err());
        }
    }
}
