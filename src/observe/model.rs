//! What one look at the host saw: plain data, serialisable, so a snapshot taken on one
//! machine replays to the same verdict on another.

pub use super::cgroup::CgroupAttribution;
pub use super::kubernetes::KubernetesReading;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Everything the classifier needs from NVML and `/proc`, taken at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What NVML answered.
    pub nvml: NvmlReading,
    /// Whether we run in the initial PID namespace; `None` when `/proc/self/ns/pid` is unreadable.
    pub host_pid_namespace: Option<bool>,
    /// The `/proc` facts of every PID that NVML lists as an owner on some GPU.
    pub processes: BTreeMap<u32, ProcessLookup>,
    /// The scan of `/proc/*/fd` for device-file holders, when one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_scan: Option<HolderScan>,
    /// `/proc` entries that existed but could not be read while observing.
    pub procfs_errors: u64,

    // Kubernetes (the kubelet's pod-resources API and pod log directories).
    /// What the kubelet said: the containers each GPU is assigned to, and the names of
    /// the pods owners and holders run in. `None` in snapshots of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesReading>,
}

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
    /// NVML could not be loaded or initialised.
    Down {
        /// Why, in one line.
        error: String,
    },
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
}

/// The readings of a GPU, or the error that kept us from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuState {
    /// All calls answered.
    Ok {
        /// Memory figures in bytes.
        memory: MemoryReading,
        /// Union of the compute, graphics and MPS process lists.
        processes: Vec<NvmlProcess>,
    },
    /// A call failed; the GPU's figures are unknown.
    Failed {
        /// The kind of failure.
        error: GpuError,
        /// NVML's own words.
        message: String,
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

/// Why a GPU's readings are missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuError {
    /// The GPU fell off the bus.
    GpuLost,
    /// The GPU needs a reset before it answers again.
    ResetRequired,
    /// The driver does not support a call we need on this GPU.
    NotSupported,
    /// Any other NVML error.
    Unknown,
}

impl GpuError {
    /// Every kind, in the order metrics list them.
    pub const ALL: [GpuError; 4] = [
        GpuError::GpuLost,
        GpuError::ResetRequired,
        GpuError::NotSupported,
        GpuError::Unknown,
    ];

    /// The label value used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuError::GpuLost => "gpu_lost",
            GpuError::ResetRequired => "reset_required",
            GpuError::NotSupported => "not_supported",
            GpuError::Unknown => "unknown",
        }
    }
}

/// What `/proc` says about one PID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ProcessLookup {
    /// No such process in our PID namespace.
    Missing,
    /// The process exists.
    Present(ProcessFacts),
    /// The entry exists but could not be read (permissions, a race); not evidence of absence.
    Unreadable {
        /// The error, in one line.
        error: String,
    },
}

/// The facts about a live PID that the classifier uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessFacts {
    /// Command name (`/proc/PID/comm`).
    pub comm: String,
    /// The one-letter state of the main thread (`R`, `S`, `D`, `T`, `Z`, ...).
    pub state: char,
    /// Parent PID.
    pub ppid: u32,
    /// Start time in clock ticks after boot; tells a reused PID from the original.
    pub start_time_ticks: u64,
    /// Real user id, when readable.
    pub uid: Option<u32>,
    /// Whether the process (any of its threads) holds a `/dev/nvidia*` file.
    pub device_files: DeviceFiles,
    /// The container and pod its cgroup names (absent in snapshots of older versions).
    #[serde(flatten)]
    pub cgroup: CgroupAttribution,
    /// PID 1 of its PID namespace, when that is nested in ours (a container's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace_init: Option<NamespaceInit>,
}

/// PID 1 of a nested PID namespace, as seen from ours. A container with its own PID
/// namespace (the default of Docker, containerd, CRI-O and Kubernetes) lives exactly as
/// long as that process: when it exits, the kernel SIGKILLs every other process in the
/// namespace, so one that is still there could not die (it is stuck, typically in the
/// driver). The kernel keeps the exited PID 1 in its exit path, with every thread marked
/// exiting (`PF_EXITING`), until the last of them is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum NamespaceInit {
    /// PID 1 of the namespace is alive: the container runs.
    Running {
        /// Its PID in our namespace.
        pid: u32,
    },
    /// Every thread of PID 1 is exiting: the container has ended.
    Exited {
        /// Its PID in our namespace.
        pid: u32,
    },
    /// PID 1 could not be found or read (permissions, the scan's time budget).
    Unknown,
}

impl NamespaceInit {
    /// Whether this says the container has ended.
    pub fn exited(init: Option<NamespaceInit>) -> bool {
        matches!(init, Some(NamespaceInit::Exited { .. }))
    }
}

/// Whether a process holds an NVIDIA device file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceFiles {
    /// At least one open descriptor points at `/dev/nvidia*`.
    Held,
    /// Its descriptor lists were read and none does.
    NotHeld,
    /// Its descriptor lists could not be read (needs root, or CAP_DAC_READ_SEARCH to
    /// list them and CAP_SYS_PTRACE to read where they point).
    Unreadable,
}

/// The result of scanning every process's descriptors for NVIDIA device files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderScan {
    /// Every process (other than the exporter) holding an NVIDIA device file.
    pub holders: Vec<Holder>,
    /// Processes whose descriptors we were not allowed to read.
    pub permission_errors: u64,
    /// Whether the scan stopped at its time budget before seeing every process.
    pub cut_short: bool,
    /// How long the scan took.
    pub duration_seconds: f64,
}

impl HolderScan {
    /// True when every process was looked at: no holder can be missing from the list.
    pub fn complete(&self) -> bool {
        !self.cut_short && self.permission_errors == 0
    }
}

/// A process holding NVIDIA device files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Command name.
    pub comm: String,
    /// One-letter state of the main thread.
    pub state: char,
    /// Start time in clock ticks after boot.
    pub start_time_ticks: u64,
    /// Real user id, when readable.
    pub uid: Option<u32>,
    /// User name for `uid`, when the host knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kernel function it waits in, read only when in state `D`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Minor numbers of the per-GPU nodes (`/dev/nvidiaN`) it holds.
    pub gpu_minors: Vec<u32>,
    /// Process group: a child keeps its dead parent's group, so it ties a holder to an owner.
    pub pgid: u32,
    /// Session, which a child keeps likewise.
    pub sid: u32,
    /// The container and pod its cgroup names (absent in snapshots of older versions).
    #[serde(flatten)]
    pub cgroup: CgroupAttribution,
    /// PID 1 of its PID namespace, when that is nested in ours (a container's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace_init: Option<NamespaceInit>,
}

/// An observation saved to a file, with what a bug report needs to know about where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version of this file; bumped on incompatible changes.
    pub format: u32,
    /// Version of the exporter that wrote it.
    pub exporter_version: String,
    /// Host name of the machine observed.
    pub hostname: String,
    /// When it was taken, in seconds since the Unix epoch.
    pub taken_at_unix_seconds: u64,
    /// What was seen.
    pub observation: Observation,
}

impl Snapshot {
    /// The format this build reads and writes.
    pub const FORMAT: u32 = 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn snapshots_without_container_facts_still_read() {
        // A process and a holder as format 1 wrote them before cgroups were read.
        let lookup: ProcessLookup = serde_json::from_value(json!({
            "status": "present", "comm": "python3", "state": "S", "ppid": 1,
            "start_time_ticks": 1000, "uid": 0, "device_files": "held"
        }))
        .unwrap();
        let ProcessLookup::Present(facts) = lookup else {
            panic!("{lookup:?}")
        };
        assert_eq!(facts.cgroup, CgroupAttribution::default());
        assert_eq!(facts.pid_namespace_init, None);
        let holder: Holder = serde_json::from_value(json!({
            "pid": 564, "ppid": 1, "comm": "python3", "state": "S",
            "start_time_ticks": 2000, "uid": 0, "gpu_minors": [2], "pgid": 543, "sid": 543
        }))
        .unwrap();
        assert_eq!(holder.cgroup, CgroupAttribution::default());
    }

    #[test]
    fn container_facts_round_trip_and_stay_out_when_absent() {
        let mut holder: Holder = serde_json::from_value(json!({
            "pid": 564, "ppid": 1, "comm": "python3", "state": "D",
            "start_time_ticks": 2000, "uid": 0, "gpu_minors": [2], "pgid": 543, "sid": 543
        }))
        .unwrap();
        let plain = serde_json::to_value(&holder).unwrap();
        for key in ["cgroup", "container_id", "pod_uid", "pid_namespace_init"] {
            assert!(plain.get(key).is_none(), "{key} in {plain}");
        }
        holder.cgroup = CgroupAttribution {
            cgroup: Some("/kubepods/besteffort/pod1d9e/3f2a".into()),
            container_id: Some("3f2a".repeat(16)),
            pod_uid: Some("1d9e2c4a-0000-4000-8000-000000000000".into()),
        };
        holder.pid_namespace_init = Some(NamespaceInit::Exited { pid: 480 });
        let text = serde_json::to_value(&holder).unwrap();
        assert_eq!(text["container_id"], "3f2a".repeat(16));
        assert_eq!(
            text["pid_namespace_init"],
            json!({"state": "exited", "pid": 480})
        );
        assert_eq!(serde_json::from_value::<Holder>(text).unwrap(), holder);
    }
}
