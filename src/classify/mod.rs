//! Pure functions from one [`Observation`] to a verdict per GPU: who owns the memory, in
//! which state, and how much of it no live process owns. Nothing here touches the system.

use crate::observe::{
    DeviceFiles, GpuError, GpuHealth, GpuState, Holder, MemoryReading, MigReading, NamespaceInit,
    NvmlProcess, NvmlReading, Observation, ProcessList, ProcessLookup,
};
use serde::Serialize;
use std::collections::BTreeSet;

#[cfg(test)]
mod tests;

/// Tunables of the classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Bytes per listed context that the driver uses without charging any process
    /// (measured: about 9 MiB per context on an H200); below this, used memory that no
    /// process is charged for is noise, not an orphan.
    pub context_overhead_bytes: u64,
    /// Command names of this site's NVML clients (monitoring agents), besides the
    /// built-in ones, that hold device files without owning memory.
    pub ignored_holder_comms: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            context_overhead_bytes: 16 * 1024 * 1024,
            ignored_holder_comms: Vec::new(),
        }
    }
}

impl Settings {
    /// Whether a holder with this command name is an NVML client, never a culprit.
    pub fn is_ignored_holder(&self, comm: &str) -> bool {
        is_management_agent(comm) || self.ignored_holder_comms.iter().any(|name| name == comm)
    }
}

/// Where an owner of GPU memory stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerState {
    /// Alive and schedulable (`R`, `S`, `I`).
    Running,
    /// Stopped by a signal or a tracer (`T`, `t`).
    Stopped,
    /// In uninterruptible sleep (`D`), typically inside the driver.
    Uninterruptible,
    /// Main thread is a zombie while other threads still hold the device.
    Zombie,
    /// No live process: the PID is gone or now belongs to a process without the device.
    Gone,
    /// Exists but `/proc` would not tell us enough to decide.
    Unknown,
}

impl OwnerState {
    /// Every state, in the order metrics list them.
    pub const ALL: [OwnerState; 6] = [
        OwnerState::Running,
        OwnerState::Stopped,
        OwnerState::Uninterruptible,
        OwnerState::Zombie,
        OwnerState::Gone,
        OwnerState::Unknown,
    ];

    /// The label value used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerState::Running => "running",
            OwnerState::Stopped => "stopped",
            OwnerState::Uninterruptible => "uninterruptible",
            OwnerState::Zombie => "zombie",
            OwnerState::Gone => "gone",
            OwnerState::Unknown => "unknown",
        }
    }

    /// The state of a live process from its `/proc/PID/stat` letter.
    pub fn from_proc_letter(letter: char) -> OwnerState {
        match letter {
            'T' | 't' => OwnerState::Stopped,
            'D' => OwnerState::Uninterruptible,
            'Z' => OwnerState::Zombie,
            'X' | 'x' => OwnerState::Gone,
            _ => OwnerState::Running,
        }
    }
}

/// Why unattributed memory is or is not called orphaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnattributedTrust {
    /// We see every process and every live owner's usage: the remainder is orphaned.
    Counted,
    /// Not in the host PID namespace: NVML hides foreign processes, so the remainder proves nothing.
    Blind,
    /// A live owner's usage is unavailable: the remainder may be that owner's memory.
    UsageUnavailable,
    /// NVML's memory figures contradict each other: the remainder is not a measurement.
    Inconsistent,
}

/// One process NVML charges memory to, with its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Process id as NVML reports it.
    pub pid: u32,
    /// Command name, when the process exists.
    pub comm: Option<String>,
    /// Parent PID, when the process exists.
    pub ppid: Option<u32>,
    /// The verdict.
    pub state: OwnerState,
    /// Bytes NVML charges it (never more than the GPU has), `None` when NVML cannot say.
    pub used_bytes: Option<u64>,
    /// Its container, when it is alive and its cgroup names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Its Kubernetes pod, when it is alive and its cgroup names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// It is alive although its container has ended (PID 1 of its PID namespace exited).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub container_exited: bool,
}

/// Count and bytes of owners per [`OwnerState`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateTally {
    processes: [u64; OwnerState::ALL.len()],
    bytes: [u64; OwnerState::ALL.len()],
}

impl StateTally {
    fn add(&mut self, state: OwnerState, bytes: Option<u64>) {
        self.processes[state as usize] += 1;
        self.bytes[state as usize] = self.bytes[state as usize].saturating_add(bytes.unwrap_or(0));
    }

    /// No state holds more than the GPU has: NVML's per-process figures can repeat or
    /// exceed the memory (a driver bug, a garbage reading).
    fn cap_bytes(&mut self, capacity: u64) {
        for bytes in &mut self.bytes {
            *bytes = (*bytes).min(capacity);
        }
    }

    /// Owners in this state.
    pub fn processes(&self, state: OwnerState) -> u64 {
        self.processes[state as usize]
    }

    /// Bytes charged to owners in this state (owners with unavailable usage add nothing).
    pub fn bytes(&self, state: OwnerState) -> u64 {
        self.bytes[state as usize]
    }
}

/// The memory account of a GPU whose readings succeeded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuAccount {
    /// NVML's memory figures, each clamped to what the total leaves (see `memory_inconsistent`).
    pub memory: MemoryReading,
    /// NVML's figures contradict each other (reserved, used or free beyond what the total
    /// leaves, a process charged more than the GPU has, processes charged more than is
    /// used): they are clamped, and unattributed memory is not called orphaned.
    pub memory_inconsistent: bool,
    /// Every listed owner with its verdict, by PID.
    pub owners: Vec<Owner>,
    /// Owners and their bytes per state.
    pub tally: StateTally,
    /// Bytes charged to owners that are gone.
    pub orphaned_owner_gone_bytes: u64,
    /// Used bytes no listed process is charged for, above the per-context noise floor.
    pub unattributed_bytes: u64,
    /// Whether `unattributed_bytes` counts as orphaned.
    pub unattributed_trust: UnattributedTrust,
    /// Owners whose usage NVML reports as unavailable.
    pub usage_unavailable_owners: u64,
    /// Live processes holding this GPU's device node that NVML does not list as owners:
    /// what keeps orphaned memory alive (an NVML client holds the same files, so agents
    /// known by name are set apart in `other_holders`).
    pub unlisted_holders: Vec<Holder>,
    /// Unlisted holders that are NVML clients known by name (monitoring agents, this
    /// exporter); named to people, never called culprits.
    pub other_holders: Vec<Holder>,
    /// NVML's words when it refused a process list of this GPU: owners may be missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes_denied: Option<String>,
}

impl GpuAccount {
    /// Unattributed bytes that count as orphaned (0 unless the remainder can be trusted).
    pub fn orphaned_unattributed_bytes(&self) -> u64 {
        match self.unattributed_trust {
            UnattributedTrust::Counted => self.unattributed_bytes,
            UnattributedTrust::Blind
            | UnattributedTrust::UsageUnavailable
            | UnattributedTrust::Inconsistent => 0,
        }
    }

    /// All memory held without a live owner (never more than the GPU's used memory).
    pub fn orphaned_bytes(&self) -> u64 {
        self.orphaned_owner_gone_bytes
            .saturating_add(self.orphaned_unattributed_bytes())
            .min(self.memory.used)
    }

    /// Live owners and unlisted holders of this GPU whose container has ended: they
    /// survived the SIGKILL that ends a container's processes, so they are stuck.
    pub fn exited_container_processes(&self) -> u64 {
        let owners = self
            .owners
            .iter()
            .filter(|owner| owner.state != OwnerState::Gone && owner.container_exited)
            .count();
        let holders = self
            .unlisted_holders
            .iter()
            .filter(|holder| NamespaceInit::exited(holder.pid_namespace_init))
            .count();
        (owners + holders) as u64
    }

    /// Owners that are gone.
    pub fn gone_owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners
            .iter()
            .filter(|owner| owner.state == OwnerState::Gone)
    }
}

/// A GPU's account, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuOutcome {
    /// The readings succeeded.
    Measured(Box<GpuAccount>),
    /// A call failed: the GPU's figures are unknown, not zero.
    Failed {
        /// The kind of failure.
        error: GpuError,
        /// NVML's own words.
        message: String,
    },
}

/// The verdict for one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuVerdict {
    /// NVML's device index.
    pub index: u32,
    /// Stable identity; empty when NVML could not say.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Minor number of its device node.
    pub minor: Option<u32>,
    /// The account, or the failure.
    pub outcome: GpuOutcome,
    /// MIG mode and devices as observed, passed through for the renderers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigReading>,
    /// What the driver says the GPU needs, passed through for the renderers.
    #[serde(skip_serializing_if = "GpuHealth::is_empty")]
    pub health: GpuHealth,
}

impl GpuVerdict {
    /// The account when the GPU answered.
    pub fn account(&self) -> Option<&GpuAccount> {
        match &self.outcome {
            GpuOutcome::Measured(account) => Some(account),
            GpuOutcome::Failed { .. } => None,
        }
    }

    /// Orphaned bytes, 0 for a GPU that did not answer.
    pub fn orphaned_bytes(&self) -> u64 {
        self.account().map_or(0, GpuAccount::orphaned_bytes)
    }
}

/// Summary of a holder scan for the exporter's own health series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScanSummary {
    /// Every process was looked at.
    pub complete: bool,
    /// Stopped at its time budget.
    pub cut_short: bool,
    /// Processes whose descriptors could not be read.
    pub permission_errors: u64,
    /// Seconds it took.
    pub duration_seconds: f64,
}

/// The verdict for the whole host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Whether NVML answered.
    pub nvml_up: bool,
    /// Why NVML did not answer.
    pub nvml_error: Option<String>,
    /// The driver's version, when NVML answered.
    pub driver_version: Option<String>,
    /// Whether we run in the host PID namespace (`None`: could not tell).
    pub host_pid_namespace: Option<bool>,
    /// One verdict per GPU.
    pub gpus: Vec<GpuVerdict>,
    /// `/proc` entries that could not be read.
    pub procfs_errors: u64,
    /// The holder scan, when one ran.
    pub holder_scan: Option<ScanSummary>,
}

impl Report {
    /// True when NVML's process lists may be missing processes of other PID namespaces.
    pub fn blind(&self) -> bool {
        self.host_pid_namespace != Some(true)
    }

    /// Total orphaned bytes over all GPUs.
    pub fn orphaned_bytes(&self) -> u64 {
        self.gpus
            .iter()
            .map(GpuVerdict::orphaned_bytes)
            .fold(0, u64::saturating_add)
    }
}

/// NVML clients that hold the same device files as a CUDA process (measured on an H200:
/// an NVML client holds /dev/nvidia0, nvidiactl, nvidia-uvm and the capability nodes)
/// without owning memory; never call them culprits. Names as `comm` shows them (15 bytes).
const MANAGEMENT_AGENTS: &[&str] = &[
    "vram-exporter",
    "nvidia-persiste",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvidia-smi",
    "nvidia-powerd",
    "nvidia-fabricma",
    "nvidia_gpu_expo",
    "nvtop",
];

/// Whether a command name belongs to a driver management daemon rather than a workload.
pub fn is_management_agent(comm: &str) -> bool {
    MANAGEMENT_AGENTS.contains(&comm)
}

/// Classify a whole observation.
pub fn classify(observation: &Observation, settings: &Settings) -> Report {
    let blind = observation.host_pid_namespace != Some(true);
    let (nvml_up, nvml_error, driver_version, gpus) = match &observation.nvml {
        NvmlReading::Up {
            driver_version,
            gpus,
        } => {
            let verdicts = gpus
                .iter()
                .map(|gpu| GpuVerdict {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    name: gpu.name.clone(),
                    pci_bus_id: gpu.pci_bus_id.clone(),
                    minor: gpu.minor,
                    outcome: match &gpu.state {
                        GpuState::Ok { memory, processes } => {
                            GpuOutcome::Measured(Box::new(account_for_gpu(
                                *memory,
                                processes,
                                gpu.minor,
                                observation,
                                blind,
                                settings,
                            )))
                        }
                        GpuState::Failed { error, message } => GpuOutcome::Failed {
                            error: *error,
                            message: message.clone(),
                        },
                    },
                    mig: gpu.mig.clone(),
                    health: gpu.health.clone(),
                })
                .collect();
            (true, None, Some(driver_version.clone()), verdicts)
        }
        NvmlReading::Down { error } => (false, Some(error.clone()), None, Vec::new()),
    };
    Report {
        nvml_up,
        nvml_error,
        driver_version,
        host_pid_namespace: observation.host_pid_namespace,
        gpus,
        procfs_errors: observation.procfs_errors,
        holder_scan: observation.holder_scan.as_ref().map(|scan| ScanSummary {
            complete: scan.complete(),
            cut_short: scan.cut_short,
            permission_errors: scan.permission_errors,
            duration_seconds: scan.duration_seconds,
        }),
    }
}

/// The verdict on one listed process.
pub fn judge_owner(process: &NvmlProcess, lookup: Option<&ProcessLookup>) -> Owner {
    let mut owner = Owner {
        pid: process.pid,
        comm: None,
        ppid: None,
        state: OwnerState::Gone,
        used_bytes: process.used_bytes,
        container_id: None,
        pod_uid: None,
        container_exited: false,
    };
    match lookup {
        None | Some(ProcessLookup::Missing) => {}
        Some(ProcessLookup::Unreadable { .. }) => owner.state = OwnerState::Unknown,
        Some(ProcessLookup::Present(facts)) => {
            owner.comm = Some(facts.comm.clone());
            owner.ppid = Some(facts.ppid);
            match facts.device_files {
                // A process that holds no device file cannot keep a context alive: the
                // PID was reused, and the memory belongs to nobody. Its container is the
                // new process's, not the owner's.
                DeviceFiles::NotHeld => {}
                DeviceFiles::Held | DeviceFiles::Unreadable => {
                    owner.state = OwnerState::from_proc_letter(facts.state);
                    owner.container_id = facts.cgroup.container_id.clone();
                    owner.pod_uid = facts.cgroup.pod_uid.clone();
                    owner.container_exited = NamespaceInit::exited(facts.pid_namespace_init);
                }
            }
        }
    }
    owner
}

/// Memory a GPU can hand to contexts: the total less the driver's reservation.
fn capacity(memory: &MemoryReading) -> u64 {
    memory.total.saturating_sub(memory.reserved)
}

/// NVML's memory figures with each part clamped to what the total leaves, and whether
/// any had to be: `reserved + used + free` cannot exceed `total` on a real GPU.
fn clamp_memory(reading: MemoryReading) -> (MemoryReading, bool) {
    let reserved = reading.reserved.min(reading.total);
    let used = reading.used.min(reading.total - reserved);
    let free = reading.free.min(reading.total - reserved - used);
    let clamped = MemoryReading {
        total: reading.total,
        reserved,
        used,
        free,
    };
    (clamped, clamped != reading)
}

fn account_for_gpu(
    reading: MemoryReading,
    processes: &ProcessList,
    minor: Option<u32>,
    observation: &Observation,
    blind: bool,
    settings: &Settings,
) -> GpuAccount {
    let (memory, memory_inconsistent) = clamp_memory(reading);
    let capacity = capacity(&memory);
    // A snapshot may list a PID twice; the live reading never does.
    let mut clamped_owner = false;
    let owners: Vec<Owner> = NvmlProcess::distinct(processes.entries().iter().copied())
        .iter()
        .map(|process| {
            let mut owner = judge_owner(process, observation.processes.get(&process.pid));
            if owner.used_bytes.is_some_and(|bytes| bytes > capacity) {
                clamped_owner = true;
                owner.used_bytes = Some(capacity);
            }
            owner
        })
        .collect();

    let mut tally = StateTally::default();
    let mut orphaned_owner_gone_bytes = 0u64;
    let mut charged_bytes = 0u64;
    let mut usage_unavailable_owners = 0u64;
    let mut live_owner_usage_unavailable = false;
    for owner in &owners {
        tally.add(owner.state, owner.used_bytes);
        match owner.used_bytes {
            Some(bytes) => {
                charged_bytes = charged_bytes.saturating_add(bytes);
                if owner.state == OwnerState::Gone {
                    orphaned_owner_gone_bytes = orphaned_owner_gone_bytes.saturating_add(bytes);
                }
            }
            None => {
                usage_unavailable_owners += 1;
                live_owner_usage_unavailable |= owner.state != OwnerState::Gone;
            }
        }
    }

    tally.cap_bytes(capacity);
    // Orphaned memory is allocated memory: it cannot exceed what NVML counts as used.
    let orphaned_owner_gone_bytes = orphaned_owner_gone_bytes.min(memory.used);
    // Processes charged more than is allocated (NVML's per-process and device figures
    // disagree): the remainder is not a measurement either.
    let memory_inconsistent = memory_inconsistent || clamped_owner || charged_bytes > memory.used;

    let (unlisted_holders, other_holders) = unlisted_holders(minor, &owners, observation, settings);
    let noise_floor = settings
        .context_overhead_bytes
        .saturating_mul(owners.len() as u64);
    let unattributed_bytes = memory
        .used
        .saturating_sub(charged_bytes)
        .saturating_sub(noise_floor);
    let unattributed_trust = if memory_inconsistent {
        UnattributedTrust::Inconsistent
    } else if blind {
        UnattributedTrust::Blind
    } else if live_owner_usage_unavailable || processes.denied().is_some() {
        // A refused list may hide the owners of the remainder: it cannot be told orphaned.
        UnattributedTrust::UsageUnavailable
    } else {
        UnattributedTrust::Counted
    };

    GpuAccount {
        memory,
        memory_inconsistent,
        tally,
        orphaned_owner_gone_bytes,
        unattributed_bytes,
        unattributed_trust,
        usage_unavailable_owners,
        unlisted_holders,
        other_holders,
        owners,
        processes_denied: processes.denied().map(str::to_string),
    }
}

/// Holders of this GPU's node that NVML does not list, split into possible culprits and
/// the NVML clients (monitoring agents) that hold device files without owning memory.
fn unlisted_holders(
    minor: Option<u32>,
    owners: &[Owner],
    observation: &Observation,
    settings: &Settings,
) -> (Vec<Holder>, Vec<Holder>) {
    let (Some(minor), Some(scan)) = (minor, &observation.holder_scan) else {
        return (Vec::new(), Vec::new());
    };
    let live_owner_pids: BTreeSet<u32> = owners
        .iter()
        .filter(|owner| owner.state != OwnerState::Gone)
        .map(|owner| owner.pid)
        .collect();
    scan.holders
        .iter()
        .filter(|holder| holder.gpu_minors.contains(&minor))
        .filter(|holder| !live_owner_pids.contains(&holder.pid))
        .cloned()
        .partition(|holder| !settings.is_ignored_holder(&holder.comm))
}

/// How a holder is tied to an owner that is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "relation", content = "pid")]
pub enum Kinship {
    /// Its parent is the gone owner (not yet reaped).
    ChildOf(u32),
    /// It is in the process group the gone owner led.
    ProcessGroupOf(u32),
    /// It is in the session the gone owner led.
    SessionOf(u32),
}

/// The closest tie between `holder` and one of the `gone` owners' PIDs, if any: the
/// evidence that it inherited their device files rather than merely watching the GPU.
pub fn kinship(holder: &Holder, gone: &[u32]) -> Option<Kinship> {
    gone.iter()
        .find_map(|&pid| (holder.ppid == pid).then_some(Kinship::ChildOf(pid)))
        .or_else(|| {
            gone.iter()
                .find_map(|&pid| (holder.pgid == pid).then_some(Kinship::ProcessGroupOf(pid)))
        })
        .or_else(|| {
            gone.iter()
                .find_map(|&pid| (holder.sid == pid).then_some(Kinship::SessionOf(pid)))
        })
}
