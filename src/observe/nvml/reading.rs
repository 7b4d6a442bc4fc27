//! What NVML says of the GPUs: plain data, serialisable, so a snapshot taken on one
//! machine replays to the same verdict on another. Each addition since the first format
//! reads from older snapshots through its serde default.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strum::{EnumIter, IntoStaticStr};

/// NVML's answer: either a driver with its GPUs, or the reason it could not be asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum NvmlReading {
    /// NVML loaded and initialised.
    Up {
        /// The kernel driver's version string.
        driver_version: String,
        /// One entry per device, in NVML index order.
        gpus: Vec<GpuReading>,
    },
    /// NVML could not be loaded or initialised, or does not answer.
    Down {
        /// Why, in one line.
        error: String,
        /// The kind of failure; `failed` in snapshots of older versions.
        #[serde(default)]
        reason: NvmlFailure,
        /// The library-level call that has not returned, when NVML does not answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stuck: Option<StuckCall>,
    },
}

/// Why NVML gave no reading at all. Its label value (in metrics and JSON alike) is its
/// name in snake case; `NvmlFailure::iter()` lists every kind in the order metrics do.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum NvmlFailure {
    /// The library could not be loaded: no driver installed, or not where
    /// `--nvml.library` says.
    Missing,
    /// The library loaded, but `nvmlInit` failed (no kernel driver loaded, a version
    /// mismatch between the library and the kernel module).
    InitFailed,
    /// A library-level call (init, the device count) has not returned in time: a wedged
    /// driver.
    NotAnswering,
    /// NVML loaded, then a call every reading needs failed (a driver unloaded or upgraded
    /// under us); any other failure.
    #[default]
    Failed,
}

impl NvmlFailure {
    /// The label value used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An NVML call that has not returned: which, and for how long when the look was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckCall {
    /// The NVML function, e.g. `nvmlDeviceGetMemoryInfo_v2`.
    pub call: String,
    /// Seconds it had been running.
    pub stuck_seconds: f64,
}

impl NvmlReading {
    /// Every PID NVML lists on a GPU that answered or on one of its MIG devices, with the
    /// minor numbers of the GPUs it is listed on (a MIG device's context maps its GPU's
    /// node).
    pub(crate) fn listed_pids(&self) -> BTreeMap<u32, Vec<u32>> {
        let mut listed: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        if let NvmlReading::Up { gpus, .. } = self {
            for gpu in gpus {
                let instances = gpu.mig.iter().flat_map(|mig| &mig.devices);
                let states =
                    std::iter::once(&gpu.state).chain(instances.map(|device| &device.state));
                for state in states {
                    if let GpuState::Ok { processes, .. } = state {
                        for process in processes.entries() {
                            let minors = listed.entry(process.pid).or_default();
                            minors.extend(gpu.minor.filter(|minor| !minors.contains(minor)));
                        }
                    }
                }
            }
        }
        listed
    }
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    /// NVML's device index.
    pub index: u32,
    /// Stable identity; empty when NVML could not say.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// PCI bus id in NVML's `domain:bus:device.function` form.
    pub pci_bus_id: String,
    /// Minor number: the GPU's device node is `/dev/nvidia<minor>`.
    pub minor: Option<u32>,
    /// Memory and owners, or why they could not be read.
    pub state: GpuState,
    /// MIG mode and the MIG devices, each read through its own handle; absent for a GPU
    /// without MIG support (and in snapshots of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigReading>,
    /// What the driver says the GPU needs: recovery action, row remapping, retired pages,
    /// critical Xid errors; read even when the memory calls fail.
    #[serde(default, skip_serializing_if = "GpuHealth::is_empty")]
    pub health: GpuHealth,
}

/// The readings of a GPU, or the error that kept us from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuState {
    /// All calls answered.
    Ok {
        /// Memory figures in bytes.
        memory: MemoryReading,
        /// Union of the compute, graphics and MPS process lists, or what answered of them
        /// when one was refused.
        processes: ProcessList,
    },
    /// A call failed; the GPU's figures are unknown.
    Failed {
        /// The kind of failure.
        error: GpuError,
        /// NVML's own words.
        message: String,
    },
    /// A call has not returned within the look's deadline (a GPU that fell off the bus,
    /// a wedged driver): the GPU's figures are unknown, and it is asked nothing more
    /// until that call returns.
    NotAnswering {
        /// The NVML function it is stuck in.
        call: String,
        /// Seconds the call had been running when the look was made.
        stuck_seconds: f64,
    },
}

/// Memory of one GPU in bytes, from NVML's v2 memory call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReading {
    /// Installed memory.
    pub total: u64,
    /// Held back by the driver; not counted in `used`.
    pub reserved: u64,
    /// Allocated by contexts (the v2 figure: excludes `reserved`).
    pub used: u64,
    /// Neither used nor reserved.
    pub free: u64,
}

/// One process NVML charges memory to on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlProcess {
    /// The PID as NVML reports it, translated into our PID namespace by the driver.
    pub pid: u32,
    /// Bytes charged, or `None` when NVML reports the value as unavailable.
    pub used_bytes: Option<u64>,
    /// Listed only as an MPS client: its context lives in the MPS server, so its own
    /// mappings cannot prove it. On an H200 (driver 580) no process was: an MPS client is
    /// on the compute list and the MPS list both, and maps its GPU's node as any context.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mps_only: bool,
    /// Which of the device's lists name it; none in snapshots of versions that did not
    /// record them.
    #[serde(default, skip_serializing_if = "NvmlLists::unknown")]
    pub lists: NvmlLists,
}

/// Which of NVML's three process lists of a device name a process. Measured on an H200
/// (driver 580) under MPS: a client, live or dead, is on the compute list and the MPS list;
/// the MPS server is on the compute list alone; the MPS control daemon is on none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlLists {
    /// The compute list (`nvmlDeviceGetComputeRunningProcesses`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compute: bool,
    /// The graphics list (`nvmlDeviceGetGraphicsRunningProcesses`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub graphics: bool,
    /// The MPS clients' list (`nvmlDeviceGetMPSComputeRunningProcesses`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mps: bool,
}

impl NvmlLists {
    /// Only the compute list.
    pub const COMPUTE: NvmlLists = NvmlLists {
        compute: true,
        graphics: false,
        mps: false,
    };
    /// Only the graphics list.
    pub const GRAPHICS: NvmlLists = NvmlLists {
        compute: false,
        graphics: true,
        mps: false,
    };
    /// Only the MPS clients' list.
    pub const MPS: NvmlLists = NvmlLists {
        compute: false,
        graphics: false,
        mps: true,
    };

    /// No list is recorded: a process NVML lists is on one, so the lists were not kept
    /// (a snapshot of an older version).
    pub fn unknown(&self) -> bool {
        !self.compute && !self.graphics && !self.mps
    }

    /// The lists of both.
    pub fn and(self, other: NvmlLists) -> NvmlLists {
        NvmlLists {
            compute: self.compute || other.compute,
            graphics: self.graphics || other.graphics,
            mps: self.mps || other.mps,
        }
    }
}

impl NvmlProcess {
    /// One entry per PID, where it first appears. A process with compute and graphics
    /// contexts appears in both lists with the same per-process figure, so the larger
    /// figure is kept rather than the sum; a PID repeated within one list (a driver bug)
    /// counts once.
    pub fn distinct(processes: impl IntoIterator<Item = NvmlProcess>) -> Vec<NvmlProcess> {
        let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
        let mut distinct: Vec<NvmlProcess> = Vec::new();
        for process in processes {
            match seen.get(&process.pid) {
                Some(&at) => {
                    distinct[at].used_bytes = distinct[at].used_bytes.max(process.used_bytes);
                    distinct[at].mps_only &= process.mps_only;
                    distinct[at].lists = distinct[at].lists.and(process.lists);
                }
                None => {
                    seen.insert(process.pid, distinct.len());
                    distinct.push(process);
                }
            }
        }
        distinct
    }
}

/// Why a GPU's readings are missing. Its label value (in metrics and JSON alike) is its
/// name in snake case; `GpuError::iter()` (strum's `IntoEnumIterator`) lists every kind
/// in the order metrics do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, IntoStaticStr, EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum GpuError {
    /// The GPU fell off the bus.
    GpuLost,
    /// The GPU needs a reset before it answers again.
    ResetRequired,
    /// The driver does not support a call we need on this GPU.
    NotSupported,
    /// The caller lacks the privilege (a MIG GPU's aggregate figures need root).
    NoPermission,
    /// Any other NVML error.
    Unknown,
    /// The GPU did not answer in time: a call still in flight at the look's deadline
    /// ([`GpuState::NotAnswering`]), or NVML's own `Timeout`.
    Timeout,
}

impl GpuError {
    /// The label value used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The processes NVML charges memory to on a device, or the sign that a list was refused.
///
/// Serialised as a plain array when listed, so snapshots of older versions read as
/// [`ProcessList::Listed`]; a refused list is an object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProcessList {
    /// Every list answered: the union of the compute, graphics and MPS lists.
    Listed(Vec<NvmlProcess>),
    /// A list was refused (`NoPermission`: on a MIG GPU the aggregate lists need root, and
    /// a MIG device's lists need access to its capability). Memory no listed process is
    /// charged for may belong to a process we were not shown: who owns it cannot be told.
    Denied {
        /// NVML's words for the refusal.
        denied: String,
        /// What the lists that did answer named, by PID.
        #[serde(default)]
        partial: Vec<NvmlProcess>,
    },
}

impl ProcessList {
    /// The processes we were shown: all of them, or those of the lists that answered.
    pub fn entries(&self) -> &[NvmlProcess] {
        match self {
            ProcessList::Listed(processes) => processes,
            ProcessList::Denied { partial, .. } => partial,
        }
    }

    /// Why the list is incomplete, `None` when every list answered.
    pub fn denied(&self) -> Option<&str> {
        match self {
            ProcessList::Listed(_) => None,
            ProcessList::Denied { denied, .. } => Some(denied),
        }
    }
}

impl From<Vec<NvmlProcess>> for ProcessList {
    fn from(processes: Vec<NvmlProcess>) -> Self {
        ProcessList::Listed(processes)
    }
}

/// MIG on one GPU: its mode and, while enabled, every MIG device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigReading {
    /// MIG is enabled now.
    pub enabled: bool,
    /// MIG will be enabled after the next GPU reset; differs from `enabled` while a change
    /// waits for that reset.
    pub pending: bool,
    /// One entry per MIG device (a compute instance inside a GPU instance), in MIG device
    /// index order; empty while MIG is disabled.
    pub devices: Vec<MigDeviceReading>,
    /// Why the MIG devices could not be enumerated, when they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One MIG device, read through its own handle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigDeviceReading {
    /// Its index among the parent's MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// `MIG-...`; empty when NVML could not say.
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA H200 MIG 1g.18gb`.
    pub name: String,
    /// The profile the name ends with, e.g. `1g.18gb` (dcgm-exporter's `GPU_I_PROFILE`);
    /// empty when the name has none.
    pub profile: String,
    /// The GPU instance id (dcgm-exporter's `GPU_I_ID`).
    pub gpu_instance_id: Option<u32>,
    /// The compute instance id within the GPU instance.
    pub compute_instance_id: Option<u32>,
    /// The `/dev/nvidia-caps/nvidia-cap<minor>` nodes that grant access to this instance:
    /// a context in it holds them open (besides `/dev/nvidia<gpu minor>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<MigCapabilities>,
    /// The instance's memory and processes, or why they could not be read.
    pub state: GpuState,
}

/// Minors of the capability device nodes of one MIG device, from the driver's
/// `/proc/driver/nvidia-caps/mig-minors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigCapabilities {
    /// The node of its GPU instance (`gpu<N>/gi<G>/access`).
    pub gpu_instance: Option<u32>,
    /// The node of its compute instance (`gpu<N>/gi<G>/ci<C>/access`).
    pub compute_instance: Option<u32>,
}

/// What the driver says a GPU needs. Each part is `None` where this driver or GPU cannot
/// say (an older driver, a GPU generation without the feature), never an error of the GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// The field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (drivers 565 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<RecoveryAction>,
    /// Row remapping (Ampere and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement (GPUs before Ampere; later ones remap rows instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<RetiredPages>,
    /// The NUMA node of the GPU's memory when the operating system manages it (GH200,
    /// GB200 and GB300 in the driver's NUMA mode): NVML's used memory then includes pages
    /// the OS keeps after processes exit, so memory charged to no process is normal there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Critical Xid errors counted since the exporter started; `None` when nothing watches
    /// them (one-shot commands, replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<XidReading>,
}

impl GpuHealth {
    /// True when nothing is known, as in snapshots of older versions.
    pub fn is_empty(&self) -> bool {
        *self == GpuHealth::default()
    }
}

/// What the driver says must happen before a GPU can be used again
/// (`nvmlDeviceGpuRecoveryAction_t`). Its label value in metrics is its name in snake case,
/// `unknown` for a value this build does not know. `RecoveryAction::iter()` gives each
/// label once, in the order metrics list them: the named actions by raw value, then
/// `Unrecognised(0)` standing for every unknown one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum RecoveryAction {
    /// Nothing: new processes can use the GPU (`NVML_GPU_RECOVERY_ACTION_NONE`).
    #[serde(rename = "none")]
    #[strum(serialize = "none")]
    NoneNeeded,
    /// End every process on the GPU and reset it (`nvidia-smi -r`).
    GpuReset,
    /// Reboot the node: the fault may have left the operating system inconsistent.
    NodeReboot,
    /// Quiesce peer-to-peer traffic (end the processes doing it, disable UVM persistence),
    /// then read the action again.
    DrainP2p,
    /// Drain peer-to-peer traffic, then reset the GPU.
    DrainAndReset,
    /// Recover the IMEX domain (multi-node NVLink), not the local GPU.
    RecoverImexDomain,
    /// Reset the GPU's PCIe bus.
    BusReset,
    /// Reboot the whole system.
    SystemReboot,
    /// A value this build does not know (a newer driver's); written to snapshots with
    /// its value, labelled `unknown` in metrics.
    #[strum(serialize = "unknown")]
    Unrecognised(u32),
}

impl RecoveryAction {
    /// Whether the driver asks for a reboot of the node or system.
    pub fn needs_reboot(self) -> bool {
        matches!(
            self,
            RecoveryAction::NodeReboot | RecoveryAction::SystemReboot
        )
    }

    /// The action NVML's raw field value names.
    pub(crate) fn from_raw(value: u32) -> RecoveryAction {
        match value {
            0 => RecoveryAction::NoneNeeded,
            1 => RecoveryAction::GpuReset,
            2 => RecoveryAction::NodeReboot,
            3 => RecoveryAction::DrainP2p,
            4 => RecoveryAction::DrainAndReset,
            5 => RecoveryAction::RecoverImexDomain,
            6 => RecoveryAction::BusReset,
            7 => RecoveryAction::SystemReboot,
            other => RecoveryAction::Unrecognised(other),
        }
    }

    /// The label value used in metrics: `unknown` for an unrecognised value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Row remapping: spare memory rows replacing rows that had ECC errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    /// Rows remapped after correctable errors.
    pub correctable: u32,
    /// Rows remapped after uncorrectable errors.
    pub uncorrectable: u32,
    /// A remapping waits for the next GPU reset.
    pub pending: bool,
    /// A remapping failed: the bank had no spare row left.
    pub failure: bool,
}

/// Page retirement: memory pages taken out of use after ECC errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    /// Pages retired after multiple single-bit ECC errors.
    pub multiple_single_bit_ecc: u32,
    /// Pages retired after a double-bit ECC error.
    pub double_bit_ecc: u32,
    /// Retirements wait for the next reboot or GPU reset.
    pub pending: bool,
}

/// Critical Xid errors of one GPU, counted by the exporter's event thread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidReading {
    /// The GPU is registered for critical Xid events now.
    pub watched: bool,
    /// Events since the exporter started, by Xid number (79: fallen off the bus). NVML
    /// reports 999 for an Xid it cannot name.
    pub counts: BTreeMap<u64, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use strum::IntoEnumIterator;

    #[test]
    fn gpu_readings_of_older_versions_read_without_mig_or_health() {
        let gpu: GpuReading = serde_json::from_value(json!({
            "index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "pci_bus_id": "00000000:19:00.0",
            "minor": 0,
            "state": { "status": "ok",
                "memory": { "total": 10, "reserved": 1, "used": 2, "free": 7 },
                "processes": [ { "pid": 432, "used_bytes": 2 } ] }
        }))
        .unwrap();
        assert_eq!(gpu.mig, None);
        assert!(gpu.health.is_empty());
        let GpuState::Ok { processes, .. } = &gpu.state else {
            panic!("{gpu:?}")
        };
        assert_eq!(processes.denied(), None);
        assert_eq!(processes.entries()[0].pid, 432);
        // Written back, it looks as it did: no new keys, the list still a plain array.
        let text = serde_json::to_value(&gpu).unwrap();
        assert!(
            text.get("mig").is_none() && text.get("health").is_none(),
            "{text}"
        );
        assert!(text["state"]["processes"].is_array(), "{text}");
    }

    #[test]
    fn a_refused_list_and_the_health_readings_round_trip() {
        let processes = ProcessList::Denied {
            denied: "Insufficient Permissions".into(),
            partial: vec![NvmlProcess {
                pid: 7,
                used_bytes: None,
                mps_only: false,
                lists: NvmlLists::COMPUTE,
            }],
        };
        let text = serde_json::to_value(&processes).unwrap();
        assert_eq!(text["denied"], "Insufficient Permissions");
        assert_eq!(
            serde_json::from_value::<ProcessList>(text).unwrap(),
            processes
        );
        let health = GpuHealth {
            recovery_action: Some(RecoveryAction::NodeReboot),
            remapped_rows: Some(RemappedRows {
                correctable: 0,
                uncorrectable: 1,
                pending: true,
                failure: false,
            }),
            retired_pages: None,
            numa_node: None,
            xid: Some(XidReading {
                watched: true,
                counts: BTreeMap::from([(79, 2)]),
            }),
        };
        let text = serde_json::to_value(&health).unwrap();
        assert_eq!(text["recovery_action"], "node_reboot");
        assert_eq!(text["xid"]["counts"]["79"], 2);
        assert_eq!(serde_json::from_value::<GpuHealth>(text).unwrap(), health);
        let unknown = serde_json::to_value(RecoveryAction::from_raw(9)).unwrap();
        assert_eq!(
            serde_json::from_value::<RecoveryAction>(unknown).unwrap(),
            RecoveryAction::Unrecognised(9)
        );
        assert_eq!(
            serde_json::to_value(RecoveryAction::NoneNeeded).unwrap(),
            "none"
        );
    }

    #[test]
    fn every_named_recovery_action_has_its_raw_value_and_label() {
        let named = RecoveryAction::iter()
            .filter(|action| !matches!(action, RecoveryAction::Unrecognised(_)));
        for (raw, action) in named.enumerate() {
            assert_eq!(RecoveryAction::from_raw(raw as u32), action);
            assert_ne!(action.as_str(), "unknown");
        }
        assert_eq!(RecoveryAction::from_raw(8).as_str(), "unknown");
    }
}
