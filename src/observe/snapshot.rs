//! What one look at the host saw, as one value: the [`Observation`] that classification
//! reads (with what the witness state held as the look went by it, [`WitnessReading`]),
//! and the [`Snapshot`] file that carries one to another machine, where it replays to the
//! same verdict.

use super::containers::ContainersReading;
use super::kubernetes::KubernetesReading;
use super::nvml::NvmlReading;
use super::procfs::{
    HolderScan, Identity, OwnProcessReading, ProcessLookup, ProcfsView, WitnessedProcess,
};
use super::slurm::SlurmReading;
use super::witness::NoState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Everything the classifier needs from NVML and `/proc`, taken at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What NVML answered.
    pub nvml: NvmlReading,
    /// Whether we run in the initial PID namespace; `None` when `/proc/self/ns/pid` is unreadable.
    pub host_pid_namespace: Option<bool>,
    /// Whether the procfs we read shows our own PID namespace, in which NVML's PIDs live.
    #[serde(default)]
    pub procfs_view: ProcfsView,
    /// When the host booted, in seconds since the Unix epoch: start times become dates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_time_unix_seconds: Option<u64>,
    /// The kernel's clock ticks per second (`USER_HZ`), the unit of start times.
    #[serde(default = "default_clock_ticks")]
    pub clock_ticks_per_second: u64,
    /// When the look was made, in seconds since the Unix epoch: how long a worker has
    /// lived without its server, or a kill has been pending, is counted to it. `None` in
    /// snapshots of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at_unix_seconds: Option<u64>,
    /// The same moment in milliseconds, for waits shorter than a second (an owner being
    /// freed). `None` in snapshots of older versions, which read it from the seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at_unix_millis: Option<u64>,
    /// What `/proc` says about every PID that NVML lists as an owner on some GPU, by
    /// NVML's PID (ours: the driver translates PIDs into the caller's PID namespace).
    pub owners: BTreeMap<u32, OwnerLookup>,
    /// The scan of every process for NVIDIA device files, when one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_scan: Option<HolderScan>,
    /// `/proc` entries that existed but could not be read while observing.
    pub procfs_errors: u64,
    /// A `/proc` read that had not returned by its deadline (a process in uninterruptible
    /// sleep holding its memory map lock blocks reads of its maps): what the reader was
    /// doing, and for how long. The owners it kept from being read are unknown; a holder
    /// scan it kept from running, or cut short, is incomplete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub procfs_stuck: Option<StuckRead>,

    // Kubernetes (the kubelet's pod-resources API and pod log directories).
    /// What the kubelet said: the containers each GPU is assigned to, and the names of
    /// the pods owners and holders run in. `None` in snapshots of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesReading>,

    // Slurm.
    /// Which Slurm job steps still run, looked for when an owner or holder runs in a
    /// Slurm job's cgroup; `None` when none does (or in snapshots of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmReading>,

    // Container engines.
    /// The engines' health and the names of the containers owners and holders run in;
    /// `None` when no engine is watched (or in snapshots of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<ContainersReading>,

    // The witness state.
    /// What a served exporter witnessed before this look, as the look went by it (a
    /// one-shot command's only: `check --json` says which facts came from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness: Option<Arc<WitnessReading>>,

    // The exporter itself.
    /// The exporter's own process (`/proc/self`), which a server reads for its
    /// `process_*` series; `None` for a one-shot command. Never in a snapshot: it
    /// describes the process that took it, not the host.
    #[serde(skip)]
    pub own_process: Option<OwnProcessReading>,
}

impl Observation {
    /// When the look was made, in milliseconds since the Unix epoch, when known.
    pub fn taken_at_unix_millis(&self) -> Option<u64> {
        self.taken_at_unix_millis
            .or_else(|| Some(self.taken_at_unix_seconds? * 1000))
    }
}

/// The `/proc` reader thread, not returned at a look's deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckRead {
    /// What it is doing: reading NVML's owners, or scanning for holders (this look's, or
    /// an earlier one's that has not returned).
    pub call: String,
    /// Seconds it had been at it when the observation was made.
    pub stuck_seconds: f64,
}

/// `USER_HZ`: 100 on every architecture Linux runs GPUs on.
fn default_clock_ticks() -> u64 {
    100
}

/// One NVML-listed PID: the process first seen under it, and what is there now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerLookup {
    /// The process the exporter first saw under this PID while NVML listed it; `None`
    /// when it has seen none (the PID was already gone).
    pub first_seen: Option<Identity>,
    /// What `/proc` holds under this PID now.
    pub now: ProcessLookup,
}

/// The witness state as a look went by it: which file, and what it held, or why nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WitnessReading {
    /// The state file.
    pub path: PathBuf,
    /// When it was written, in seconds since the Unix epoch, when it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_unix_seconds: Option<u64>,
    /// Why there is no state to go by, when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_state: Option<NoState>,
    /// What it holds: nothing when there is no state.
    #[serde(skip)]
    pub witnessed: Arc<Witnessed>,
}

/// What a served exporter witnessed, as its state file keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Witnessed {
    /// NVML's owners, by the procfs's PID and start time, with what was seen of each.
    #[serde(default)]
    pub processes: Vec<WitnessedProcess>,
    /// The process first seen under each PID NVML lists (NVML's PIDs).
    #[serde(default)]
    pub owners_first_seen: Vec<FirstSeen>,
}

/// The process first seen under a PID that NVML lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstSeen {
    /// NVML's PID.
    pub pid: u32,
    /// The process first seen under it.
    pub identity: Identity,
}

impl Witnessed {
    /// What was witnessed of process `pid` of the procfs, if it is the same process.
    pub fn process(&self, pid: u32, start_time_ticks: u64) -> Option<&WitnessedProcess> {
        self.processes
            .binary_search_by_key(&pid, |process| process.pid)
            .ok()
            .map(|at| &self.processes[at])
            .filter(|process| process.start_time_ticks == start_time_ticks)
    }
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
    pub const FORMAT: u32 = 2;
}

/// Why a snapshot could not be replayed.
#[derive(Debug, Error)]
pub enum ObserveError {
    /// The replay file could not be read.
    #[error("cannot read snapshot {path}")]
    ReadSnapshot {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The replay file is not a snapshot.
    #[error("{path} is not a vram-exporter snapshot")]
    ParseSnapshot {
        /// The file.
        path: PathBuf,
        /// What the JSON reader found.
        source: serde_json::Error,
    },
    /// The replay file is from an incompatible version.
    #[error(
        "{path} has snapshot format {format}; this build reads format {}",
        Snapshot::FORMAT
    )]
    SnapshotFormat {
        /// The file.
        path: PathBuf,
        /// The format it declares.
        format: u32,
    },
    /// The replay file lists two GPUs under one index or one UUID, which no host has (a
    /// hand-edited file): replayed, it would serve the same series twice.
    #[error("{path} lists two GPUs with {what}; a GPU's index and UUID are its own")]
    DuplicateGpu {
        /// The file.
        path: PathBuf,
        /// What the two share: `index 0`, `UUID GPU-...`.
        what: String,
    },
}

/// Reads a snapshot written by `vram-exporter snapshot`.
pub fn read_snapshot(path: &Path) -> Result<Observation, ObserveError> {
    let text = std::fs::read_to_string(path).map_err(|source| ObserveError::ReadSnapshot {
        path: path.to_path_buf(),
        source,
    })?;
    let snapshot: Snapshot =
        serde_json::from_str(&text).map_err(|source| ObserveError::ParseSnapshot {
            path: path.to_path_buf(),
            source,
        })?;
    if snapshot.format != Snapshot::FORMAT {
        return Err(ObserveError::SnapshotFormat {
            path: path.to_path_buf(),
            format: snapshot.format,
        });
    }
    if let Some(what) = shared_identity(&snapshot.observation.nvml) {
        return Err(ObserveError::DuplicateGpu {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(snapshot.observation)
}

/// The first index or UUID that two GPUs of `nvml` share, in words.
fn shared_identity(nvml: &NvmlReading) -> Option<String> {
    let NvmlReading::Up { gpus, .. } = nvml else {
        return None;
    };
    let mut indices = BTreeSet::new();
    let mut uuids = BTreeSet::new();
    gpus.iter().find_map(|gpu| {
        if !indices.insert(gpu.index) {
            Some(format!("index {}", gpu.index))
        } else if !uuids.insert(gpu.uuid.as_str()) {
            Some(format!("UUID {}", gpu.uuid))
        } else {
            None
        }
    })
}
