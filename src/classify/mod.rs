//! Pure functions from one [`Observation`] to the whole verdict per GPU, as data: who owns
//! the memory and in which state, how much no live process owns and why, which process
//! keeps it (with the evidence) and which merely watches, what would free it, and what
//! `check` exits with. The renderers put this into words and series and decide nothing.

mod after_kill;
mod exporter_process;
#[cfg(test)]
pub(crate) mod fixtures;
mod mps;
mod owners;
pub(crate) mod pods;
mod sentence;
pub(crate) mod slurm;
mod suspects;
#[cfg(test)]
mod tests;

pub use after_kill::{
    killed_stuck, Clue, KilledStuck, LeftBehindOwner, Parent, Seen, KILL_STUCK_SECONDS,
};
pub use exporter_process::{exporter_process, ExporterProcess};
pub use owners::{
    judge_owner, Frame, GoneReason, Owner, OwnerState, Standing, Started, StateQualifier, WhyGone,
    WhyUnknown,
};
pub use sentence::{ChargedTo, Departure, Sentence};
use suspects::Within;
pub use suspects::{Evidence, Role, Suspect};

use crate::observe::{
    GpuHealth, GpuReading, GpuState, NvmlProcess, NvmlReading, Observation, ProcessFacts,
    ProcessList,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use strum::{EnumCount, IntoStaticStr, VariantArray};
use suspects::Scene;

// What the verdict carries of the observation, named here so that the renderers need
// nothing from `observe`.
pub use crate::observe::containers::{ContainerName, Engine, EngineError, EngineHealth};
pub use crate::observe::health::CallHealth;
pub use crate::observe::kubernetes::{KubeletSource, SourceError, SourceHealth};
pub use crate::observe::procfs::short_container_id;
pub use crate::observe::{
    CgroupAttribution, GpuError, Identity, Leader, Lineage, MemoryReading, NamespaceInit,
    NarrowAccess, NodeSet, NvmlFailure, NvmlLists, ProcfsView, RecoveryAction, References,
    Relative, RemappedRows, RetiredPages, StuckCall, StuckRead, XidReading,
};
pub use pods::{GpuPod, KubernetesView, PodName};
pub use slurm::{JobState, JobToCancel, LeftBehind, SlurmJob};

/// Tunables of the classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Bytes per listed context that the driver uses without charging any process
    /// (measured: about 9 MiB per context on an H200); below this, used memory that no
    /// process is charged for is noise, not an orphan.
    pub context_overhead_bytes: u64,
    /// Command names of this site's NVML clients (monitoring agents), besides the
    /// built-in ones: a label for bystanders, never a reason to blame or to clear.
    pub agent_comms: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            context_overhead_bytes: 16 * 1024 * 1024,
            agent_comms: Vec::new(),
        }
    }
}

impl Settings {
    /// Whether a command name is a known NVML client's.
    pub fn is_known_agent(&self, comm: &str) -> bool {
        MANAGEMENT_AGENTS.contains(&comm) || self.agent_comms.iter().any(|name| name == comm)
    }
}

/// NVML clients that hold the same device files as a CUDA process (measured on an H200)
/// without a context; names as `comm` shows them (15 bytes). Only a label: the rule that
/// clears them is that they map nothing of the GPU.
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

/// A process's state as `ps` names it; [`ProcessState::owner_state`] is the coarser
/// word the series use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// `R`
    Running,
    /// `S`
    Sleeping,
    /// `I`: an idle kernel thread.
    Idle,
    /// `T`: stopped by a signal.
    Stopped,
    /// `t`: stopped by a tracer.
    TracingStop,
    /// `D`: uninterruptible sleep, typically inside the driver.
    DiskSleep,
    /// `Z`: the main thread exited.
    Zombie,
    /// `X`: being reaped.
    Dead,
}

impl ProcessState {
    /// The state of a stat letter; letters of older kernels count as running.
    pub fn from_letter(letter: char) -> ProcessState {
        match letter {
            'S' => ProcessState::Sleeping,
            'I' => ProcessState::Idle,
            'T' => ProcessState::Stopped,
            't' => ProcessState::TracingStop,
            'D' => ProcessState::DiskSleep,
            'Z' => ProcessState::Zombie,
            'X' | 'x' => ProcessState::Dead,
            _ => ProcessState::Running,
        }
    }

    /// The words `ps` users know.
    pub fn words(self) -> &'static str {
        match self {
            ProcessState::Running => "running",
            ProcessState::Sleeping => "sleeping",
            ProcessState::Idle => "idle",
            ProcessState::Stopped => "stopped",
            ProcessState::TracingStop => "stopped by a tracer",
            ProcessState::DiskSleep => "in uninterruptible sleep",
            ProcessState::Zombie => "zombie",
            ProcessState::Dead => "dead",
        }
    }

    /// The coarse state of the `state` label: running covers running, sleeping and idle.
    pub fn owner_state(self) -> OwnerState {
        match self {
            ProcessState::Running | ProcessState::Sleeping | ProcessState::Idle => {
                OwnerState::Running
            }
            ProcessState::Stopped | ProcessState::TracingStop => OwnerState::Stopped,
            ProcessState::DiskSleep => OwnerState::Uninterruptible,
            ProcessState::Zombie => OwnerState::Zombie,
            ProcessState::Dead => OwnerState::Gone,
        }
    }
}

/// A live process as the verdict names it: always with its start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    /// Its PID here (in the exporter's namespace) when visible here, else the procfs's.
    pub pid: u32,
    /// Its PID in the procfs read, when that shows another namespace than ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub procfs_pid: Option<u32>,
    /// Whether it is visible in our PID namespace, so that `kill` can reach it from here.
    #[serde(skip_serializing_if = "is_true")]
    pub visible_here: bool,
    /// Start time in clock ticks after boot: with the PID, its identity.
    pub start_time_ticks: u64,
    /// When it started, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    /// When it started, as the verdict says it: a date, or the time after boot when the
    /// observation has no boot time (JSON has both figures above).
    #[serde(skip)]
    pub started: Started,
    /// Command name.
    pub comm: String,
    /// Its state, as `ps` names it.
    pub state: ProcessState,
    /// Parent PID (the procfs's).
    pub ppid: u32,
    /// Process group (the procfs's).
    pub pgid: u32,
    /// Session (the procfs's).
    pub sid: u32,
    /// Threads.
    pub threads: u32,
    /// Real user id, when readable.
    pub uid: Option<u32>,
    /// User name, when the host knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kernel function it waits in, when in uninterruptible sleep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Killed while in uninterruptible sleep: since when the exporter has seen the SIGKILL
    /// pending, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kill_pending_since_unix_seconds: Option<u64>,
    /// Where it came from, for an owner: its parent when first seen, and whether that
    /// parent has exited since.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// Its container and pod.
    #[serde(flatten)]
    pub cgroup: CgroupAttribution,
    /// Its pod's namespace and name, when the kubelet's pod log directories name its uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodName>,
    /// Its container's name, image, and Compose project or Podman pod, when its engine
    /// named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerName>,
    /// Its Slurm job and step, its user, and whether Slurm still runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<SlurmJob>,
    /// PID 1 of its PID namespace, when that is nested in ours (a container's own). In
    /// JSON `container_ended: true` follows it once that has exited.
    #[serde(flatten, serialize_with = "namespace_init_json")]
    pub pid_namespace_init: Option<NamespaceInit>,
    /// NVIDIA device files it holds open.
    pub descriptors: References,
    /// NVIDIA device files it maps shared.
    pub mappings: References,
}

fn is_true(value: &bool) -> bool {
    *value
}

/// `pid_namespace_init` when known, and `container_ended: true` when it says so: the
/// keys scripts read, the second derived from the first.
fn namespace_init_json<S: serde::Serializer>(
    init: &Option<NamespaceInit>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(None)?;
    if let Some(init) = init {
        map.serialize_entry("pid_namespace_init", init)?;
    }
    if NamespaceInit::exited(*init) {
        map.serialize_entry("container_ended", &true)?;
    }
    map.end()
}

impl Process {
    /// The verdict's view of a process read from `/proc`.
    pub fn new(facts: &ProcessFacts, frame: &Frame) -> Process {
        let foreign = frame.procfs_view != ProcfsView::Own;
        Process {
            pid: facts.local_pid.unwrap_or(facts.pid),
            procfs_pid: foreign.then_some(facts.pid),
            visible_here: facts.local_pid.is_some(),
            start_time_ticks: facts.start_time_ticks,
            started_unix_seconds: frame.started(facts.start_time_ticks),
            started: frame.start(facts.start_time_ticks),
            comm: facts.comm.clone(),
            state: ProcessState::from_letter(facts.state),
            ppid: facts.ppid,
            pgid: facts.pgid,
            sid: facts.sid,
            threads: facts.threads,
            uid: facts.uid,
            user: facts.user.clone(),
            wchan: facts.wchan.clone(),
            kill_pending_since_unix_seconds: facts.kill_pending_since_unix_seconds,
            lineage: facts.lineage.clone(),
            cgroup: facts.cgroup.clone(),
            pod: None,
            container: facts.cgroup.container_id.as_ref().and_then(|id| {
                frame
                    .containers
                    .and_then(|reading| reading.names.get(id))
                    .cloned()
            }),
            slurm_job: SlurmJob::of(facts, frame.slurm),
            pid_namespace_init: facts.pid_namespace_init,
            descriptors: facts.descriptors.clone(),
            mappings: facts.mappings.clone(),
        }
    }

    /// Its container has ended (PID 1 of its PID namespace exited): it survived the
    /// SIGKILL that ends a container, so it is stuck.
    pub fn container_ended(&self) -> bool {
        NamespaceInit::exited(self.pid_namespace_init)
    }

    /// Killed, and the kill waits: a SIGKILL pending in uninterruptible sleep.
    pub fn killed(&self) -> bool {
        self.state == ProcessState::DiskSleep && self.kill_pending_since_unix_seconds.is_some()
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
    /// A live or unknown owner's usage is unavailable, or an owner cannot be judged: the
    /// remainder may be that owner's.
    OwnersUncertain,
    /// NVML's memory figures contradict each other: the remainder is not a measurement.
    Inconsistent,
    /// The operating system manages the GPU's memory (a coherent GH200/GB200 in NUMA
    /// mode): pages stay allocated after a process exits there, which is normal.
    OsManaged,
}

/// Why memory is held without a live owner: the `reason` label of the orphaned series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum OrphanReason {
    /// Charged to owners that are gone.
    OwnerGone,
    /// Charged to nobody, above the noise floor, and trusted to be orphaned.
    Unattributed,
}

impl OrphanReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Count and bytes of owners per [`OwnerState`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateTally {
    processes: [u64; OwnerState::COUNT],
    bytes: [u64; OwnerState::COUNT],
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

/// What a GPU's verdict amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Nothing is used.
    Idle,
    /// Every used byte has a live owner.
    Owned,
    /// Memory is held without a live owner.
    Orphaned,
    /// Nothing is orphaned, but live owners hold memory for a server that has exited
    /// (seen, or possibly): workers it left behind.
    LeftBehind,
    /// Nothing is orphaned or left behind, but owners were killed and are stuck in
    /// uninterruptible sleep: the kill waits, and their memory with it.
    KilledStuck,
    /// Nothing is proven orphaned, but memory cannot be judged (owners that cannot be
    /// read, a blind exporter, usage NVML cannot report).
    CannotTell,
    /// Nothing else to say, but owners are in their exit path: the driver is freeing
    /// their memory.
    BeingFreed,
}

/// What would give orphaned memory back; the exporter only suggests it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Remedy {
    /// Nothing to do.
    None,
    /// End these culprits (each named with its start time); every one holds a context on
    /// the GPU.
    Kill {
        /// The culprits, in PID order.
        targets: Vec<KillTarget>,
    },
    /// Cancel these Slurm jobs: culprits run in steps that Slurm still runs, and ending
    /// the job ends them. Culprits outside such steps are to be killed beside.
    CancelJobs {
        /// The jobs, by id, each with its culprits.
        jobs: Vec<JobToCancel>,
        /// The other culprits, in PID order.
        targets: Vec<KillTarget>,
    },
    /// The owner is exiting, or a kill waits in the driver for less than
    /// [`KILL_STUCK_SECONDS`]: its memory is being freed, or may be soon.
    Wait,
    /// End the workers a server left behind (each named with its start time): they hold
    /// memory for a server that has exited.
    KillLeftBehind {
        /// The left-behind owners, in PID order.
        targets: Vec<KillTarget>,
    },
    /// Processes were killed and have been stuck in the driver for longer than
    /// [`KILL_STUCK_SECONDS`]: another kill cannot end them, only a GPU reset (which the
    /// driver refuses while they hold the GPU) or a reboot gives the memory back.
    ResetOrReboot {
        /// The stuck processes.
        stuck: Vec<KillTarget>,
    },
    /// Under MPS, no client process holds a dead client's memory, but the MPS server (a
    /// live owner, which holds every client's context) does: only restarting MPS frees
    /// it, which ends every client of the daemon. Never a plain kill of the daemon or the
    /// server, and not a GPU reset.
    RestartMps {
        /// The MPS servers listed on the GPU.
        servers: Vec<u32>,
        /// Their control daemons.
        daemons: Vec<u32>,
        /// The live MPS clients on the GPU, which the restart ends too.
        clients: Vec<u32>,
    },
    /// No process but the GPU's own live owners holds its device file; stopping them may
    /// free it (one may hold the exited owner's context besides its own).
    StopOwners {
        /// The live owners' PIDs.
        pids: Vec<u32>,
    },
    /// No process has a context on the GPU: only a reset gives the memory back. A reset
    /// needs every process that holds the GPU's device files gone first (NVML clients
    /// too), and on a MIG GPU it ends every instance.
    ResetGpu {
        /// Processes that hold the device file without a context (the bystanders): they
        /// must stop before the driver allows the reset.
        blockers: Vec<u32>,
    },
    /// The driver says the node must be rebooted: no reset or kill will do.
    Reboot,
    /// What holds the memory cannot be told; nothing is suggested but how to see more.
    CannotTell {
        /// Why.
        reason: Blindness,
    },
}

/// A culprit to end, by identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KillTarget {
    /// Its PID here.
    pub pid: u32,
    /// Its start time in clock ticks after boot: a PID names it only with this.
    pub start_time_ticks: u64,
    /// When it started, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    /// When it started, as the verdict says it (JSON has both figures above).
    #[serde(skip)]
    pub started: Started,
    /// Command name.
    pub comm: String,
}

impl KillTarget {
    /// A process to end, by identity.
    pub fn of(process: &Process) -> KillTarget {
        KillTarget {
            pid: process.pid,
            start_time_ticks: process.start_time_ticks,
            started_unix_seconds: process.started_unix_seconds,
            started: process.started,
            comm: process.comm.clone(),
        }
    }
}

/// Why the holder of orphaned memory cannot be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Blindness {
    /// Processes hold the device file but their mappings could not be read.
    MappingsUnreadable {
        /// How many.
        processes: u64,
    },
    /// The culprits live in another PID namespace than this process's: `kill` here
    /// cannot reach them.
    CulpritsNotVisible,
    /// The left-behind workers live in another PID namespace than this process's: `kill`
    /// here cannot reach them.
    WorkersNotVisible,
    /// The scan for holders ran out of time before it saw every process.
    ScanCutShort,
    /// A `/proc` read of the scan (or of the look before it) blocked and has not
    /// returned: a process in uninterruptible sleep holding its memory map lock blocks
    /// reads of its maps. The scan saw only part of the processes, or none.
    ScanBlocked {
        /// Whole seconds the read had been blocked.
        seconds: u64,
    },
    /// The descriptors of some processes could not be read.
    ScanDenied {
        /// How many.
        processes: u64,
    },
    /// No scan for holders was made (a snapshot taken without one).
    NoScan,
}

impl Blindness {
    /// How running `check` again would see what this one could not; `None` where no run
    /// from here would (culprits in another PID namespace: only the host reaches them).
    pub fn look_again(self) -> Option<LookAgain> {
        match self {
            Blindness::MappingsUnreadable { .. } | Blindness::ScanDenied { .. } => {
                Some(LookAgain::AsRoot)
            }
            Blindness::ScanCutShort | Blindness::ScanBlocked { .. } | Blindness::NoScan => {
                Some(LookAgain::AsBefore)
            }
            Blindness::CulpritsNotVisible | Blindness::WorkersNotVisible => None,
        }
    }
}

/// How another look would see more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookAgain {
    /// With the privilege this one lacked: root, or the capabilities the reason names.
    AsRoot,
    /// As this one ran: a new scan with a budget of its own.
    AsBefore,
}

/// A fact about a GPU worth a line of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "note", rename_all = "snake_case")]
pub enum Note {
    /// The driver's recovery action for the GPU is something other than none.
    DriverAsks {
        /// What it asks for.
        action: RecoveryAction,
    },
    /// NVML refused a process list (MIG needs privileges for the GPU's aggregate list).
    ProcessListDenied {
        /// NVML's words.
        message: String,
    },
    /// NVML's memory figures contradict each other; they were clamped.
    MemoryInconsistent,
    /// Unattributed memory that is not called orphaned, and why.
    UnattributedNotCounted {
        /// The bytes.
        bytes: u64,
        /// Why they are not counted.
        trust: UnattributedTrust,
    },
    /// A live owner is stopped.
    OwnerStopped {
        /// Its PID.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// A live owner is in uninterruptible sleep.
    OwnerInUninterruptibleSleep {
        /// Its PID.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// A live owner's main thread exited while other threads hold the context.
    OwnerZombieLeader {
        /// Its PID.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// An owner cannot be judged.
    OwnerUnknown {
        /// Its PID.
        pid: u32,
        /// Why.
        detail: WhyUnknown,
    },
    /// An owner's PID names another process now.
    OwnerPidReused {
        /// The owner's PID.
        pid: u32,
        /// The command name first seen under it, when the exporter saw the owner.
        #[serde(skip_serializing_if = "Option::is_none")]
        was: Option<String>,
        /// The process that has the PID now.
        now: Box<Process>,
    },
    /// NVML cannot report an owner's memory.
    OwnerUsageUnavailable {
        /// Its PID.
        pid: u32,
        /// Its command name, when alive.
        #[serde(skip_serializing_if = "Option::is_none")]
        comm: Option<String>,
    },
    /// A live owner outlived its container.
    OwnerContainerEnded {
        /// Its PID.
        pid: u32,
        /// Its command name.
        comm: String,
        /// Its container and pod.
        #[serde(flatten)]
        cgroup: CgroupAttribution,
    },
    /// More owner notes than a person can read were left out.
    MoreOwnerNotes {
        /// How many.
        count: u64,
    },
    /// Culprits were named, but the scan did not see every process: there may be more.
    MoreHoldersPossible {
        /// Why.
        reason: Blindness,
    },
    /// Culprits outlived their container: killing again may not free the memory.
    CulpritsContainerEnded {
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Culprits run in Slurm job steps that have ended, or of which it cannot be told
    /// whether they run: Slurm will not end them, so they are to be killed.
    CulpritsLeftBySlurm {
        /// Each such culprit, with its job.
        culprits: Vec<LeftBehind>,
    },
    /// A live owner runs in a Slurm job step that has ended: Slurm left it behind.
    OwnerLeftBySlurm {
        /// Its PID.
        pid: u32,
        /// Its command name.
        comm: String,
        /// Its job and step.
        job: SlurmJob,
    },
    /// A culprit is in uninterruptible sleep: it dies only when it leaves the driver.
    CulpritInUninterruptibleSleep,
    /// A culprit is stopped: SIGKILL still ends it, SIGTERM waits until it is continued.
    CulpritStopped,
    /// Processes hold the device file whose mappings could not be read.
    UndeterminedHolders {
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Processes hold the device file without a context here (the bystanders other than
    /// the MPS control daemon and server): set apart, never blamed.
    BystandersNotBlamed {
        /// Their PIDs, in the order [`GpuAccount::bystanders`] lists them.
        pids: Vec<u32>,
    },
    /// The MPS control daemon and server hold the device file: set apart, never blamed
    /// for a client's memory (ending either ends MPS for every client).
    MpsNotBlamed {
        /// Their PIDs, in the order [`GpuAccount::bystanders`] lists them.
        pids: Vec<u32>,
    },
}

/// Most notes about owners one GPU carries; `check --json` still lists every owner.
const MAX_OWNER_NOTES: usize = 32;

/// The memory account and verdict of a GPU whose readings succeeded.
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
    /// Gone owners per reason.
    pub gone_by_reason: [u64; GoneReason::COUNT],
    /// Bytes charged to owners that are gone.
    pub orphaned_owner_gone_bytes: u64,
    /// Used bytes no listed process is charged for, above the per-context noise floor.
    pub unattributed_bytes: u64,
    /// Whether `unattributed_bytes` counts as orphaned.
    pub unattributed_trust: UnattributedTrust,
    /// Owners whose usage NVML reports as unavailable.
    pub usage_unavailable_owners: u64,
    /// Processes with a context on this GPU that keep its orphaned memory alive (only
    /// while memory is orphaned), with the evidence.
    pub culprits: Vec<Suspect>,
    /// Processes holding its device file without a context here, and the MPS control
    /// daemon and server (only while memory is orphaned), with why they are not blamed.
    pub bystanders: Vec<Suspect>,
    /// Processes holding its device file whose mappings could not be read.
    pub undetermined: Vec<Suspect>,
    /// Live owners a killed server left behind: seen, or possibly.
    pub left_behind: Vec<LeftBehindOwner>,
    /// NVML's words when it refused a process list of this GPU: owners may be missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes_denied: Option<String>,
    /// What the verdict amounts to.
    pub finding: Finding,
    /// What would give orphaned memory back.
    pub remedy: Remedy,
    /// Facts worth a line each.
    pub notes: Vec<Note>,
}

impl GpuAccount {
    /// Unattributed bytes that count as orphaned (0 unless the remainder can be trusted).
    pub fn orphaned_unattributed_bytes(&self) -> u64 {
        match self.unattributed_trust {
            UnattributedTrust::Counted => self.unattributed_bytes,
            UnattributedTrust::Blind
            | UnattributedTrust::OwnersUncertain
            | UnattributedTrust::Inconsistent
            | UnattributedTrust::OsManaged => 0,
        }
    }

    /// Orphaned bytes for one reason.
    pub fn orphaned_by(&self, reason: OrphanReason) -> u64 {
        match reason {
            OrphanReason::OwnerGone => self.orphaned_owner_gone_bytes,
            OrphanReason::Unattributed => self.orphaned_unattributed_bytes(),
        }
    }

    /// All memory held without a live owner (never more than the GPU's used memory).
    pub fn orphaned_bytes(&self) -> u64 {
        self.orphaned_owner_gone_bytes
            .saturating_add(self.orphaned_unattributed_bytes())
            .min(self.memory.used)
    }

    /// Live owners and culprits of this GPU whose container has ended: they survived the
    /// SIGKILL that ends a container's processes, so they are stuck.
    pub fn exited_container_processes(&self) -> u64 {
        let owners = self
            .owners
            .iter()
            .filter(|owner| owner.container_ended())
            .count();
        let culprits = self
            .culprits
            .iter()
            .filter(|culprit| culprit.process.container_ended())
            .count();
        (owners + culprits) as u64
    }

    /// Owners that are gone.
    pub fn gone_owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners.iter().filter(|owner| owner.gone().is_some())
    }

    /// Owners that are alive.
    pub fn live_owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners.iter().filter(|owner| owner.state().is_live())
    }

    /// The bystanders that are the MPS control daemon or server (`mps`), or the others.
    pub fn bystanders_apart(&self, mps: bool) -> impl Iterator<Item = &Suspect> {
        self.bystanders
            .iter()
            .filter(move |bystander| bystander.is_mps_part() == mps)
    }

    /// Holders of the device file in `role`.
    pub fn holders(&self, role: Role) -> &[Suspect] {
        match role {
            Role::Culprit => &self.culprits,
            Role::Bystander => &self.bystanders,
            Role::Undetermined => &self.undetermined,
        }
    }

    /// Gone owners whose PID names another process now.
    pub fn gone(&self, reason: GoneReason) -> u64 {
        self.gone_by_reason[reason as usize]
    }

    /// Bytes held by owners whose server the exporter saw exit (those only possibly left
    /// behind are not counted: the series says what was seen).
    pub fn left_behind_bytes(&self) -> u64 {
        self.left_behind
            .iter()
            .filter(|owner| owner.seen.witnessed())
            .filter_map(|owner| owner.used_bytes)
            .fold(0, u64::saturating_add)
            .min(self.memory.used)
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
    /// A call has not returned in time (a GPU that fell off the bus, a wedged driver):
    /// nothing is known of its memory, so it is neither orphaned nor fine: cannot tell.
    NotAnswering {
        /// The NVML function it is stuck in.
        call: String,
        /// Seconds it had been stuck when the look was made.
        stuck_seconds: f64,
    },
}

impl GpuOutcome {
    /// The kind of failure, when the readings did not succeed: a GPU that does not
    /// answer is a `timeout`.
    pub fn error_kind(&self) -> Option<GpuError> {
        match self {
            GpuOutcome::Measured(_) => None,
            GpuOutcome::Failed { error, .. } => Some(*error),
            GpuOutcome::NotAnswering { .. } => Some(GpuError::Timeout),
        }
    }

    /// The account when the readings succeeded.
    pub fn account(&self) -> Option<&GpuAccount> {
        match self {
            GpuOutcome::Measured(account) => Some(account),
            GpuOutcome::Failed { .. } | GpuOutcome::NotAnswering { .. } => None,
        }
    }

    /// The call it is stuck in and for how long, when it does not answer.
    pub fn stuck(&self) -> Option<(&str, f64)> {
        match self {
            GpuOutcome::NotAnswering {
                call,
                stuck_seconds,
            } => Some((call, *stuck_seconds)),
            GpuOutcome::Measured(_) | GpuOutcome::Failed { .. } => None,
        }
    }
}

/// The verdict for one GPU.
#[derive(Debug, Clone, PartialEq)]
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
    /// The containers the kubelet assigned it to (`namespace/pod`, `container`), when known.
    pub assigned_to: Vec<AssignedPod>,
    /// The account, or the failure.
    pub outcome: GpuOutcome,
    /// The verdict on each MIG device NVML listed (only while MIG is enabled): a context
    /// lives in one.
    pub instances: Vec<InstanceVerdict>,
    /// Its MIG mode; `None` for a GPU without MIG.
    pub mig: Option<MigMode>,
    /// What the driver says the GPU needs.
    pub health: Health,
}

/// A GPU's MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigMode {
    /// MIG is enabled now.
    pub enabled: bool,
    /// MIG will be enabled after the next GPU reset.
    pub pending: bool,
}

/// What the driver says a GPU needs, as the verdict states it. Each part is `None` where
/// this driver or GPU cannot say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// The recovery action the driver asks for (drivers 565 and later).
    pub recovery_action: Option<RecoveryAction>,
    /// Row remapping (Ampere and later).
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement (GPUs before Ampere).
    pub retired_pages: Option<RetiredPages>,
    /// The operating system manages the GPU's memory (a coherent GH200/GB200 in NUMA
    /// mode): pages stay allocated after a process exits there, which is normal.
    pub memory_os_managed: bool,
    /// Critical Xid errors counted since the exporter started; `None` when nothing
    /// watches them.
    pub xid: Option<XidReading>,
}

impl Health {
    fn of(health: &GpuHealth) -> Health {
        Health {
            recovery_action: health.recovery_action,
            remapped_rows: health.remapped_rows,
            retired_pages: health.retired_pages,
            memory_os_managed: health.numa_node.is_some(),
            xid: health.xid.clone(),
        }
    }
}

/// A container a GPU is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssignedPod {
    /// Its pod.
    pub pod: PodName,
    /// The container's name.
    pub container: String,
}

/// The verdict on one MIG instance (a MIG device): the same account as a GPU's, for its
/// own memory and processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceVerdict {
    /// Its index among the GPU's MIG devices.
    pub index: u32,
    /// `MIG-...`.
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA H200 MIG 1g.18gb`.
    pub name: String,
    /// Its profile, e.g. `1g.18gb`.
    pub profile: String,
    /// The GPU instance id.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance id.
    pub compute_instance_id: Option<u32>,
    /// The account, or the failure.
    #[serde(flatten)]
    pub outcome: GpuOutcome,
}

impl InstanceVerdict {
    /// The account when the instance answered.
    pub fn account(&self) -> Option<&GpuAccount> {
        self.outcome.account()
    }

    /// `GI 2, CI 0, 1g.18gb`, how people name an instance.
    pub fn label(&self) -> String {
        let id = |id: Option<u32>| id.map_or_else(|| "?".to_string(), |id| id.to_string());
        format!(
            "GI {}, CI {}, {}",
            id(self.gpu_instance_id),
            id(self.compute_instance_id),
            if self.profile.is_empty() {
                "MIG"
            } else {
                &self.profile
            }
        )
    }
}

/// Every MIG instance of `gpu` judged as a GPU of its own: its owners by their mappings of
/// the GPU's node, its culprits among the holders of its capability nodes. NVML lists MIG
/// devices only while MIG is enabled.
fn instance_verdicts(gpu: &GpuReading, around: &Surroundings<'_>) -> Vec<InstanceVerdict> {
    let Some(mig) = gpu.mig.as_ref() else {
        return Vec::new();
    };
    mig.devices
        .iter()
        .map(|device| InstanceVerdict {
            index: device.index,
            uuid: device.uuid.clone(),
            name: device.name.clone(),
            profile: device.profile.clone(),
            gpu_instance_id: device.gpu_instance_id,
            compute_instance_id: device.compute_instance_id,
            outcome: match &device.state {
                GpuState::Ok { memory, processes } => {
                    let owners =
                        judge_owners(processes, gpu.minor, around.observation, around.frame);
                    let within = match &device.capabilities {
                        Some(caps) => Within::Instance(
                            caps.gpu_instance
                                .into_iter()
                                .chain(caps.compute_instance)
                                .collect(),
                        ),
                        None => Within::UnknownInstance,
                    };
                    GpuOutcome::Measured(Box::new(account_for_gpu(
                        *memory,
                        owners,
                        GpuPlace {
                            index: gpu.index,
                            minor: gpu.minor,
                            denied: processes.denied().map(str::to_string),
                            within,
                            recovery: gpu.health.recovery_action,
                            os_managed: gpu.health.numa_node.is_some(),
                        },
                        around,
                    )))
                }
                GpuState::Failed { error, message } => GpuOutcome::Failed {
                    error: *error,
                    message: message.clone(),
                },
                GpuState::NotAnswering {
                    call,
                    stuck_seconds,
                } => GpuOutcome::NotAnswering {
                    call: call.clone(),
                    stuck_seconds: *stuck_seconds,
                },
            },
        })
        .collect()
}

impl GpuVerdict {
    /// The account when the GPU answered.
    pub fn account(&self) -> Option<&GpuAccount> {
        self.outcome.account()
    }

    /// Orphaned bytes, 0 for a GPU that did not answer.
    pub fn orphaned_bytes(&self) -> u64 {
        self.account().map_or(0, GpuAccount::orphaned_bytes)
    }

    /// Memory a person waits to see freed after acting: orphaned, left behind, held by
    /// owners killed and stuck, or being freed; 0 for a GPU that did not answer.
    pub fn to_free_bytes(&self) -> u64 {
        self.account().map_or(0, |account| {
            let left_behind = account
                .left_behind
                .iter()
                .filter_map(|owner| owner.used_bytes)
                .fold(0, u64::saturating_add);
            [
                account.orphaned_bytes(),
                left_behind,
                account.tally.bytes(OwnerState::Killed),
                account.tally.bytes(OwnerState::Exiting),
            ]
            .into_iter()
            .fold(0, u64::saturating_add)
            .min(account.memory.used)
        })
    }

    /// Whether the GPU or one of its MIG instances holds memory that `check --wait` waits
    /// for: orphaned, left behind, killed and stuck, or being freed.
    pub fn awaits_freeing(&self) -> bool {
        std::iter::once(self.account())
            .chain(self.instances.iter().map(InstanceVerdict::account))
            .flatten()
            .any(|account| {
                matches!(
                    account.finding,
                    Finding::Orphaned
                        | Finding::LeftBehind
                        | Finding::KilledStuck
                        | Finding::BeingFreed
                )
            })
    }

    /// Whether the GPU or one of its MIG instances holds orphaned memory.
    pub fn has_orphan(&self) -> bool {
        std::iter::once(self.account())
            .chain(self.instances.iter().map(InstanceVerdict::account))
            .flatten()
            .any(|account| account.finding == Finding::Orphaned)
    }

    /// What `check` says of this GPU: the worst of the GPU's own verdict and its MIG
    /// instances'; a GPU that does not answer says so.
    pub fn status(&self) -> CheckStatus {
        if self.outcome.stuck().is_some() {
            return CheckStatus::NotAnswering;
        }
        std::iter::once(self.account())
            .chain(self.instances.iter().map(InstanceVerdict::account))
            .map(|account| match account.map(|account| account.finding) {
                Some(Finding::Orphaned) => CheckStatus::Orphaned,
                Some(Finding::LeftBehind | Finding::KilledStuck) => CheckStatus::LeftBehind,
                Some(Finding::Idle | Finding::Owned) => CheckStatus::Clear,
                Some(Finding::CannotTell | Finding::BeingFreed) | None => CheckStatus::CannotTell,
            })
            .max()
            .unwrap_or(CheckStatus::Clear)
    }
}

/// What `check` reports, in order of precedence: orphaned memory is reported even beside
/// a GPU that cannot be read (one that answered that it is lost, say); but a look that
/// did not complete, because NVML or a GPU did not answer in time, says so above all it
/// found (which it still names): a script must not take a partial look for a whole one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// Every byte has a live owner, or nothing is used.
    Clear,
    /// Some GPU's memory cannot be judged, or is being freed, and none is proven
    /// orphaned.
    CannotTell,
    /// Some GPU's memory is held by workers a killed server left behind, or by owners
    /// killed and stuck in the driver, and none is orphaned.
    LeftBehind,
    /// Some GPU holds memory without a live owner.
    Orphaned,
    /// NVML or a GPU did not answer in time: the look is incomplete.
    NotAnswering,
    /// NVML is missing or failed: nothing can be said.
    NvmlDown,
}

impl Report {
    /// What `check` reports for the GPUs shown. NVML that does not answer is "cannot
    /// tell", as a GPU that does not answer is; NVML that is missing or fails is an
    /// error of the host.
    pub fn check_status(&self, gpus: &[&GpuVerdict]) -> CheckStatus {
        match &self.nvml {
            NvmlStatus::Down {
                reason: NvmlFailure::NotAnswering,
                ..
            } => return CheckStatus::NotAnswering,
            NvmlStatus::Down { .. } => return CheckStatus::NvmlDown,
            NvmlStatus::Up { .. } => {}
        }
        gpus.iter()
            .map(|gpu| gpu.status())
            .max()
            .unwrap_or(CheckStatus::Clear)
    }
}

/// What a file written from one look (a snapshot, a textfile) carries, as its command's
/// exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Everything answered.
    Complete,
    /// NVML is missing or failed: the file says so, and the command reports an error.
    NvmlDown,
    /// NVML, a GPU or a `/proc` read did not answer in time: the file says which.
    NotAnswered,
}

impl Report {
    /// What a file written from this report carries.
    pub fn written(&self) -> Written {
        match self.nvml.failure() {
            Some(NvmlFailure::NotAnswering) => return Written::NotAnswered,
            Some(_) => return Written::NvmlDown,
            None => {}
        }
        let gpu_stuck = self.gpus.iter().any(|gpu| gpu.outcome.stuck().is_some());
        if gpu_stuck || self.procfs_stuck.is_some() {
            Written::NotAnswered
        } else {
            Written::Complete
        }
    }
}

/// Summary of a holder scan for the exporter's own health series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScanSummary {
    /// Stopped at its time budget.
    pub cut_short: bool,
    /// Processes whose descriptors could not be read.
    pub permission_errors: u64,
    /// Seconds it took.
    pub duration_seconds: f64,
    /// Whole seconds a `/proc` read had been blocked, when one kept the scan from
    /// running or cut it short.
    pub blocked_seconds: Option<u64>,
}

impl ScanSummary {
    /// Every process was looked at: no holder can be missing.
    pub fn complete(&self) -> bool {
        !self.cut_short && self.permission_errors == 0
    }
}

/// `check --json`'s `holder_scan`: `complete` beside what it is derived from, for scripts.
impl Serialize for ScanSummary {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ScanJson {
            complete: bool,
            cut_short: bool,
            permission_errors: u64,
            duration_seconds: f64,
            #[serde(skip_serializing_if = "Option::is_none")]
            blocked_seconds: Option<u64>,
        }
        ScanJson {
            complete: self.complete(),
            cut_short: self.cut_short,
            permission_errors: self.permission_errors,
            duration_seconds: self.duration_seconds,
            blocked_seconds: self.blocked_seconds,
        }
        .serialize(serializer)
    }
}

/// Whether NVML answered, and what it said of itself.
#[derive(Debug, Clone, PartialEq)]
pub enum NvmlStatus {
    /// NVML loaded and answered.
    Up {
        /// The kernel driver's version.
        driver_version: String,
    },
    /// NVML could not be loaded or initialised, or does not answer: nothing can be said
    /// of the GPUs.
    Down {
        /// Why, in one line.
        error: String,
        /// The kind of failure.
        reason: NvmlFailure,
        /// The library-level call that has not returned, when NVML does not answer.
        stuck: Option<StuckCall>,
    },
}

impl NvmlStatus {
    /// Whether NVML answered.
    pub fn is_up(&self) -> bool {
        matches!(self, NvmlStatus::Up { .. })
    }

    /// The driver's version, when NVML answered.
    pub fn driver_version(&self) -> Option<&str> {
        match self {
            NvmlStatus::Up { driver_version } => Some(driver_version),
            NvmlStatus::Down { .. } => None,
        }
    }

    /// The kind of failure, when NVML did not answer.
    pub fn failure(&self) -> Option<NvmlFailure> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { reason, .. } => Some(*reason),
        }
    }

    /// The call NVML is stuck in, when it does not answer.
    pub fn stuck(&self) -> Option<&StuckCall> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { stuck, .. } => stuck.as_ref(),
        }
    }

    /// Why NVML did not answer.
    pub fn error(&self) -> Option<&str> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { error, .. } => Some(error),
        }
    }
}

/// The verdict for the whole host.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Whether NVML answered.
    pub nvml: NvmlStatus,
    /// Whether we run in the host PID namespace (`None`: could not tell).
    pub host_pid_namespace: Option<bool>,
    /// Whether the procfs read shows our PID namespace.
    pub procfs_view: ProcfsView,
    /// One verdict per GPU; none while NVML is down.
    pub gpus: Vec<GpuVerdict>,
    /// `/proc` entries that could not be read.
    pub procfs_errors: u64,
    /// The holder scan, when one ran.
    pub holder_scan: Option<ScanSummary>,
    /// The `/proc` reader, when it had not returned at this look's deadline.
    pub procfs_stuck: Option<StuckRead>,

    // Kubernetes.
    /// Each GPU's pods, pod names by uid, and the kubelet sources' health; `None` when the
    /// observation has none (a snapshot of an older version).
    pub kubernetes: Option<KubernetesView>,

    // Container engines.
    /// How each watched container engine's last call went; `None` when none is watched.
    pub container_engines: Option<BTreeMap<Engine, EngineHealth>>,
    /// The exporter's own process, from the observation's reading of it (see
    /// [`exporter_process`]): a server's only.
    pub exporter_process: Option<ExporterProcess>,
}

impl Report {
    /// True when NVML's process lists may be missing processes of other PID namespaces.
    pub fn blind(&self) -> bool {
        self.host_pid_namespace != Some(true)
    }

    /// Whether no holder is missing for want of looking: the scan saw every process, or
    /// none was made, as none is where nothing is orphaned (a replayed snapshot without a
    /// scan says [`Blindness::NoScan`] in the remedy of an orphan instead).
    pub fn holders_all_seen(&self) -> bool {
        self.holder_scan.is_none_or(|scan| scan.complete())
    }

    /// Total orphaned bytes over all GPUs.
    pub fn orphaned_bytes(&self) -> u64 {
        orphaned_bytes_of(self.gpus.iter())
    }
}

/// Total orphaned bytes of `gpus` (those `check --gpu` chose, or all).
pub fn orphaned_bytes_of<'a>(gpus: impl IntoIterator<Item = &'a GpuVerdict>) -> u64 {
    gpus.into_iter()
        .map(GpuVerdict::orphaned_bytes)
        .fold(0, u64::saturating_add)
}

/// Classify a whole observation.
pub fn classify(observation: &Observation, settings: &Settings) -> Report {
    let frame = Frame {
        boot_time_unix_seconds: observation.boot_time_unix_seconds,
        ticks_per_second: observation.clock_ticks_per_second,
        procfs_view: observation.procfs_view,
        slurm: observation.slurm.as_ref(),
        containers: observation.containers.as_ref(),
    };
    let scan = observation.holder_scan.as_ref().map(|scan| ScanSummary {
        cut_short: scan.cut_short,
        permission_errors: scan.permission_errors,
        duration_seconds: scan.duration_seconds,
        // A scan cut short while the reader was stuck was cut short by the blocked read.
        blocked_seconds: observation
            .procfs_stuck
            .as_ref()
            .filter(|_| scan.cut_short)
            .map(|stuck| stuck.stuck_seconds as u64),
    });
    let (nvml, gpus) = match &observation.nvml {
        NvmlReading::Up {
            driver_version,
            gpus,
        } => {
            // Owners first, for every GPU: a holder of one GPU may be another's owner.
            let judged: Vec<Option<Vec<Owner>>> = gpus
                .iter()
                .map(|gpu| match &gpu.state {
                    GpuState::Ok { processes, .. } => {
                        Some(judge_owners(processes, gpu.minor, observation, &frame))
                    }
                    GpuState::Failed { .. } | GpuState::NotAnswering { .. } => None,
                })
                .collect();
            let mut live_owner_gpus: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for (gpu, owners) in gpus.iter().zip(&judged) {
                for owner in owners
                    .iter()
                    .flatten()
                    .filter(|owner| owner.state().is_live())
                {
                    let gpus = live_owner_gpus.entry(owner.pid).or_default();
                    if !gpus.contains(&gpu.index) {
                        gpus.push(gpu.index);
                    }
                }
            }
            let listed: BTreeSet<u32> = observation.nvml.listed_pids().into_keys().collect();
            let verdicts = gpus
                .iter()
                .zip(judged)
                .map(|(gpu, owners)| GpuVerdict {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    name: gpu.name.clone(),
                    pci_bus_id: gpu.pci_bus_id.clone(),
                    minor: gpu.minor,
                    assigned_to: Vec::new(),
                    outcome: match (&gpu.state, owners) {
                        (GpuState::Ok { memory, processes }, Some(owners)) => {
                            GpuOutcome::Measured(Box::new(account_for_gpu(
                                *memory,
                                owners,
                                GpuPlace {
                                    index: gpu.index,
                                    minor: gpu.minor,
                                    denied: processes.denied().map(str::to_string),
                                    within: Within::Gpu,
                                    recovery: gpu.health.recovery_action,
                                    os_managed: gpu.health.numa_node.is_some(),
                                },
                                &Surroundings {
                                    observation,
                                    settings,
                                    frame: &frame,
                                    scan,
                                    live_owner_gpus: &live_owner_gpus,
                                    listed: &listed,
                                },
                            )))
                        }
                        (GpuState::Failed { error, message }, _) => GpuOutcome::Failed {
                            error: *error,
                            message: message.clone(),
                        },
                        (
                            GpuState::NotAnswering {
                                call,
                                stuck_seconds,
                            },
                            _,
                        ) => GpuOutcome::NotAnswering {
                            call: call.clone(),
                            stuck_seconds: *stuck_seconds,
                        },
                        (GpuState::Ok { .. }, None) => {
                            unreachable!("owners are judged for every GPU that answered")
                        }
                    },
                    instances: instance_verdicts(
                        gpu,
                        &Surroundings {
                            observation,
                            settings,
                            frame: &frame,
                            scan,
                            live_owner_gpus: &live_owner_gpus,
                            listed: &listed,
                        },
                    ),
                    mig: gpu.mig.as_ref().map(|mig| MigMode {
                        enabled: mig.enabled,
                        pending: mig.pending,
                    }),
                    health: Health::of(&gpu.health),
                })
                .collect();
            let nvml = NvmlStatus::Up {
                driver_version: driver_version.clone(),
            };
            (nvml, verdicts)
        }
        NvmlReading::Down {
            error,
            reason,
            stuck,
        } => (
            NvmlStatus::Down {
                error: error.clone(),
                reason: *reason,
                stuck: stuck.clone(),
            },
            Vec::new(),
        ),
    };
    let kubernetes = observation
        .kubernetes
        .as_ref()
        .map(|kubernetes| pods::kubernetes_view(kubernetes, &observation.nvml));
    let mut gpus = gpus;
    if let Some(view) = &kubernetes {
        name_pods(&mut gpus, view);
    }
    Report {
        nvml,
        host_pid_namespace: observation.host_pid_namespace,
        procfs_view: observation.procfs_view,
        gpus,
        procfs_errors: observation.procfs_errors,
        holder_scan: scan,
        procfs_stuck: observation.procfs_stuck.clone(),
        kubernetes,
        container_engines: observation
            .containers
            .as_ref()
            .map(|reading| reading.engines.clone()),
        exporter_process: observation.own_process.as_ref().map(exporter_process),
    }
}

/// Name the pod of every process the verdicts mention, and the pods each GPU is assigned to.
fn name_pods(gpus: &mut [GpuVerdict], view: &KubernetesView) {
    let name = |process: &mut Process| {
        process.pod = view.pod_of(process.cgroup.pod_uid.as_deref()).cloned();
    };
    for gpu in gpus {
        gpu.assigned_to = view
            .gpu_pods
            .iter()
            .filter(|assigned| assigned.gpu == gpu.index)
            .map(|assigned| AssignedPod {
                pod: PodName {
                    namespace: assigned.namespace.clone(),
                    name: assigned.pod.clone(),
                },
                container: assigned.container.clone(),
            })
            .collect();
        let accounts = std::iter::once(&mut gpu.outcome)
            .chain(
                gpu.instances
                    .iter_mut()
                    .map(|instance| &mut instance.outcome),
            )
            .filter_map(|outcome| match outcome {
                GpuOutcome::Measured(account) => Some(account),
                GpuOutcome::Failed { .. } | GpuOutcome::NotAnswering { .. } => None,
            });
        for account in accounts {
            for owner in &mut account.owners {
                match &mut owner.standing {
                    Standing::Live(process) | Standing::Gone(WhyGone::Reused { by: process }) => {
                        name(process)
                    }
                    Standing::Exiting(process) => name(process),
                    Standing::Gone(WhyGone::Exited) | Standing::Unknown(_) => {}
                }
            }
            for suspect in account
                .culprits
                .iter_mut()
                .chain(&mut account.bystanders)
                .chain(&mut account.undetermined)
            {
                name(&mut suspect.process);
            }
            for note in &mut account.notes {
                if let Note::OwnerPidReused { now, .. } = note {
                    name(now);
                }
            }
        }
    }
}

/// Which GPU an account is for, and what its process lists could not say.
#[derive(Clone)]
struct GpuPlace {
    index: u32,
    minor: Option<u32>,
    /// NVML's words when it refused a process list: owners may be missing.
    denied: Option<String>,
    /// The whole GPU, or one MIG instance of it.
    within: Within,
    /// The driver's recovery action for the GPU.
    recovery: Option<RecoveryAction>,
    /// The operating system manages the GPU's memory.
    os_managed: bool,
}

/// What every GPU's account is judged against.
struct Surroundings<'a> {
    observation: &'a Observation,
    settings: &'a Settings,
    frame: &'a Frame<'a>,
    scan: Option<ScanSummary>,
    live_owner_gpus: &'a BTreeMap<u32, Vec<u32>>,
    /// Every PID NVML lists on some GPU or MIG device.
    listed: &'a BTreeSet<u32>,
}

fn judge_owners(
    processes: &ProcessList,
    minor: Option<u32>,
    observation: &Observation,
    frame: &Frame,
) -> Vec<Owner> {
    // A snapshot may list a PID twice; the live reading never does.
    NvmlProcess::distinct(processes.entries().iter().copied())
        .iter()
        .map(|process| judge_owner(process, observation.owners.get(&process.pid), minor, frame))
        .collect()
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
    mut owners: Vec<Owner>,
    place: GpuPlace,
    around: &Surroundings<'_>,
) -> GpuAccount {
    let (memory, memory_inconsistent) = clamp_memory(reading);
    let capacity = capacity(&memory);
    let mut clamped_owner = false;
    for owner in &mut owners {
        if owner.used_bytes.is_some_and(|bytes| bytes > capacity) {
            clamped_owner = true;
            owner.used_bytes = Some(capacity);
        }
    }

    let mut tally = StateTally::default();
    let mut gone_by_reason = [0; GoneReason::COUNT];
    let mut orphaned_owner_gone_bytes = 0u64;
    let mut charged_bytes = 0u64;
    let mut usage_unavailable_owners = 0u64;
    // A refused list may hide the owners of what is left: it cannot be called orphaned.
    let mut owners_uncertain = place.denied.is_some();
    for owner in &owners {
        let state = owner.state();
        tally.add(state, owner.used_bytes);
        if let Some(why) = owner.gone() {
            gone_by_reason[why.reason() as usize] += 1;
        }
        // An unknown owner may be alive: memory beside it cannot be called orphaned.
        owners_uncertain |= state == OwnerState::Unknown;
        match owner.used_bytes {
            Some(bytes) => {
                charged_bytes = charged_bytes.saturating_add(bytes);
                if state == OwnerState::Gone {
                    orphaned_owner_gone_bytes = orphaned_owner_gone_bytes.saturating_add(bytes);
                }
            }
            None => {
                usage_unavailable_owners += 1;
                owners_uncertain |= state != OwnerState::Gone;
            }
        }
    }
    tally.cap_bytes(capacity);
    // Orphaned memory is allocated memory: it cannot exceed what NVML counts as used.
    let orphaned_owner_gone_bytes = orphaned_owner_gone_bytes.min(memory.used);
    // Processes charged more than is allocated (NVML's per-process and device figures
    // disagree): the remainder is not a measurement either.
    let memory_inconsistent = memory_inconsistent || clamped_owner || charged_bytes > memory.used;

    let noise_floor = around
        .settings
        .context_overhead_bytes
        .saturating_mul(owners.len() as u64);
    let unattributed_bytes = memory
        .used
        .saturating_sub(charged_bytes)
        .saturating_sub(noise_floor);
    let unattributed_trust = if memory_inconsistent {
        UnattributedTrust::Inconsistent
    } else if place.os_managed {
        UnattributedTrust::OsManaged
    } else if around.observation.host_pid_namespace != Some(true) {
        UnattributedTrust::Blind
    } else if owners_uncertain {
        UnattributedTrust::OwnersUncertain
    } else {
        UnattributedTrust::Counted
    };

    let mut account = GpuAccount {
        memory,
        memory_inconsistent,
        tally,
        gone_by_reason,
        orphaned_owner_gone_bytes,
        unattributed_bytes,
        unattributed_trust,
        usage_unavailable_owners,
        culprits: Vec::new(),
        bystanders: Vec::new(),
        undetermined: Vec::new(),
        left_behind: Vec::new(),
        processes_denied: place.denied.clone(),
        finding: Finding::Idle,
        remedy: Remedy::None,
        notes: Vec::new(),
        owners,
    };
    let orphaned = account.orphaned_bytes() > 0;
    // Holders are looked for only where memory is orphaned: elsewhere nothing is blamed,
    // and the three outputs agree on it.
    if let (true, Some(minor), Some(scan)) = (
        orphaned,
        place.minor,
        around.observation.holder_scan.as_ref(),
    ) {
        let mps = mps::mps_parts(&scan.holders, &account.owners, around.listed);
        let scene = Scene {
            minor,
            index: place.index,
            within: &place.within,
            owners: &account.owners,
            live_owner_gpus: around.live_owner_gpus,
            mps: &mps,
        };
        for suspect in suspects::suspects(&scan.holders, &scene, around.settings, around.frame) {
            match suspect.role {
                Role::Culprit => account.culprits.push(suspect),
                Role::Bystander => account.bystanders.push(suspect),
                Role::Undetermined => account.undetermined.push(suspect),
            }
        }
    }
    let taken_at = around.observation.taken_at_unix_seconds;
    account.left_behind = account
        .owners
        .iter()
        .filter_map(|owner| {
            let seen = after_kill::left_behind(owner, around.frame, taken_at)?;
            Some(LeftBehindOwner {
                process: owner.process()?.clone(),
                used_bytes: owner.used_bytes,
                seen,
            })
        })
        .collect();
    account.finding = finding(&account);
    account.remedy = remedy(&account, around.scan, place.recovery, taken_at);
    account.notes = notes(&account, around.scan);
    if let Some(action) = place
        .recovery
        .filter(|action| *action != RecoveryAction::NoneNeeded)
    {
        account.notes.insert(0, Note::DriverAsks { action });
    }
    account
}

fn finding(account: &GpuAccount) -> Finding {
    if account.orphaned_bytes() > 0 {
        Finding::Orphaned
    } else if !account.left_behind.is_empty() {
        Finding::LeftBehind
    } else if account.tally.processes(OwnerState::Killed) > 0 {
        Finding::KilledStuck
    } else if account.tally.processes(OwnerState::Unknown) > 0
        || (account.unattributed_bytes > 0
            && account.unattributed_trust != UnattributedTrust::Counted)
        || (account.processes_denied.is_some() && account.memory.used > 0)
    {
        Finding::CannotTell
    } else if account.tally.processes(OwnerState::Exiting) > 0 {
        Finding::BeingFreed
    } else if account.memory.used == 0 && account.owners.is_empty() {
        Finding::Idle
    } else {
        Finding::Owned
    }
}

/// What gives orphaned memory back, in order: end the culprits; say "cannot tell" when
/// a holder may hide behind what could not be read; wait for an exiting owner; restart
/// MPS when its server alone holds a dead client's memory; stop the live owners that
/// alone hold the device; else only a reset frees it.
fn remedy(
    account: &GpuAccount,
    scan: Option<ScanSummary>,
    recovery: Option<RecoveryAction>,
    taken_at: Option<u64>,
) -> Remedy {
    match account.finding {
        Finding::Orphaned => {}
        Finding::LeftBehind => {
            let mut targets: Vec<KillTarget> = account
                .left_behind
                .iter()
                .map(|owner| KillTarget::of(&owner.process))
                .collect();
            targets.sort_by_key(|target| target.pid);
            targets.dedup_by_key(|target| target.pid);
            if account
                .left_behind
                .iter()
                .any(|owner| !owner.process.visible_here)
            {
                return Remedy::CannotTell {
                    reason: Blindness::WorkersNotVisible,
                };
            }
            return Remedy::KillLeftBehind { targets };
        }
        Finding::KilledStuck => {
            let killed: Vec<&Process> = account
                .live_owners()
                .filter_map(Owner::process)
                .filter(|process| process.killed())
                .collect();
            return stuck_remedy(&killed, taken_at);
        }
        Finding::BeingFreed => return Remedy::Wait,
        Finding::Idle | Finding::Owned | Finding::CannotTell => return Remedy::None,
    }
    if !account.culprits.is_empty() {
        // Culprits that were killed and are stuck in the driver take no second kill.
        let culprits: Vec<&Process> = account
            .culprits
            .iter()
            .map(|culprit| &culprit.process)
            .collect();
        if culprits.iter().all(|process| process.killed()) {
            return stuck_remedy(&culprits, taken_at);
        }
        if account
            .culprits
            .iter()
            .any(|culprit| !culprit.process.visible_here)
        {
            return Remedy::CannotTell {
                reason: Blindness::CulpritsNotVisible,
            };
        }
        let culprits: Vec<&Process> = account
            .culprits
            .iter()
            .map(|culprit| &culprit.process)
            .collect();
        let (jobs, targets) = slurm::jobs_to_cancel(&culprits);
        if jobs.is_empty() {
            return Remedy::Kill { targets };
        }
        return Remedy::CancelJobs { jobs, targets };
    }
    if !account.undetermined.is_empty() {
        return Remedy::CannotTell {
            reason: Blindness::MappingsUnreadable {
                processes: account.undetermined.len() as u64,
            },
        };
    }
    if let Some(reason) = scan_blindness(scan) {
        return Remedy::CannotTell { reason };
    }
    if let Some(restart) = mps_restart(account) {
        return restart;
    }
    let live: Vec<u32> = account.live_owners().map(|owner| owner.pid).collect();
    if !live.is_empty() {
        return Remedy::StopOwners { pids: live };
    }
    if recovery.is_some_and(RecoveryAction::needs_reboot) {
        return Remedy::Reboot;
    }
    Remedy::ResetGpu {
        blockers: account
            .bystanders
            .iter()
            .map(|bystander| bystander.process.pid)
            .collect(),
    }
}

/// What frees the memory of processes killed and stuck in the driver: waiting, until
/// the kill has waited [`KILL_STUCK_SECONDS`]; then a GPU reset or a reboot.
fn stuck_remedy(stuck: &[&Process], taken_at: Option<u64>) -> Remedy {
    let past_hope = stuck.iter().all(|process| {
        after_kill::killed_stuck(process, taken_at).is_some_and(|stuck| stuck.past_hope)
    });
    if !past_hope {
        return Remedy::Wait;
    }
    let mut targets: Vec<KillTarget> = stuck
        .iter()
        .map(|process| KillTarget::of(process))
        .collect();
    targets.sort_by_key(|target| target.pid);
    Remedy::ResetOrReboot { stuck: targets }
}

/// The MPS restart, when the memory is a dead MPS client's (NVML lists it on the MPS
/// list), no client process holds it (no culprit was found by a complete scan), and the
/// GPU's MPS server is alive: the server holds every client's context.
fn mps_restart(account: &GpuAccount) -> Option<Remedy> {
    let mut servers = Vec::new();
    let mut daemons = Vec::new();
    for bystander in &account.bystanders {
        for evidence in &bystander.evidence {
            if let Evidence::MpsServer { daemon } = evidence {
                servers.push(bystander.process.pid);
                daemons.push(*daemon);
            }
        }
    }
    let dead_client = account.gone_owners().any(|owner| owner.lists.mps);
    if servers.is_empty() || !dead_client {
        return None;
    }
    servers.sort_unstable();
    servers.dedup();
    daemons.sort_unstable();
    daemons.dedup();
    let clients = account
        .live_owners()
        .filter(|owner| owner.lists.mps)
        .map(|owner| owner.pid)
        .collect();
    Some(Remedy::RestartMps {
        servers,
        daemons,
        clients,
    })
}

/// What a holder scan could not see, if anything.
fn scan_blindness(scan: Option<ScanSummary>) -> Option<Blindness> {
    match scan {
        None => Some(Blindness::NoScan),
        Some(ScanSummary {
            blocked_seconds: Some(seconds),
            ..
        }) => Some(Blindness::ScanBlocked { seconds }),
        Some(scan) if scan.cut_short => Some(Blindness::ScanCutShort),
        Some(scan) if scan.permission_errors > 0 => Some(Blindness::ScanDenied {
            processes: scan.permission_errors,
        }),
        Some(_) => None,
    }
}

fn notes(account: &GpuAccount, scan: Option<ScanSummary>) -> Vec<Note> {
    let mut notes = Vec::new();
    if let Some(message) = &account.processes_denied {
        notes.push(Note::ProcessListDenied {
            message: message.clone(),
        });
    }
    if account.memory_inconsistent {
        notes.push(Note::MemoryInconsistent);
    }
    if account.unattributed_bytes > 0
        && matches!(
            account.unattributed_trust,
            UnattributedTrust::Blind
                | UnattributedTrust::OwnersUncertain
                | UnattributedTrust::OsManaged
        )
    {
        notes.push(Note::UnattributedNotCounted {
            bytes: account.unattributed_bytes,
            trust: account.unattributed_trust,
        });
    }
    let mut owner_notes = Vec::new();
    for owner in &account.owners {
        owner_notes.extend(owner_note(owner));
        if owner.used_bytes.is_none() {
            owner_notes.push(Note::OwnerUsageUnavailable {
                pid: owner.pid,
                comm: owner.comm().map(str::to_string),
            });
        }
        if owner.container_ended() {
            if let Some(process) = owner.process() {
                owner_notes.push(Note::OwnerContainerEnded {
                    pid: owner.pid,
                    comm: process.comm.clone(),
                    cgroup: process.cgroup.clone(),
                });
            }
        }
        let left_by_slurm = owner.process().and_then(|process| {
            let job = process.slurm_job.as_ref()?;
            matches!(job.state, JobState::StepEnded | JobState::Ended).then(|| {
                Note::OwnerLeftBySlurm {
                    pid: owner.pid,
                    comm: process.comm.clone(),
                    job: job.clone(),
                }
            })
        });
        owner_notes.extend(left_by_slurm);
    }
    let left_out = owner_notes.len().saturating_sub(MAX_OWNER_NOTES);
    notes.extend(owner_notes.into_iter().take(MAX_OWNER_NOTES));
    if left_out > 0 {
        notes.push(Note::MoreOwnerNotes {
            count: left_out as u64,
        });
    }
    if !account.culprits.is_empty() {
        if let Some(reason) = scan_blindness(scan) {
            notes.push(Note::MoreHoldersPossible { reason });
        }
        let ended: Vec<u32> = account
            .culprits
            .iter()
            .filter(|culprit| culprit.process.container_ended())
            .map(|culprit| culprit.process.pid)
            .collect();
        if !ended.is_empty() {
            notes.push(Note::CulpritsContainerEnded { pids: ended });
        }
        let left = slurm::left_behind(account.culprits.iter().map(|culprit| &culprit.process));
        if !left.is_empty() {
            notes.push(Note::CulpritsLeftBySlurm { culprits: left });
        }
        let states: Vec<ProcessState> = account
            .culprits
            .iter()
            .map(|culprit| culprit.process.state)
            .collect();
        if states.contains(&ProcessState::DiskSleep) {
            notes.push(Note::CulpritInUninterruptibleSleep);
        }
        if states
            .iter()
            .any(|state| matches!(state, ProcessState::Stopped | ProcessState::TracingStop))
        {
            notes.push(Note::CulpritStopped);
        }
        if !account.undetermined.is_empty() {
            notes.push(Note::UndeterminedHolders {
                pids: account
                    .undetermined
                    .iter()
                    .map(|suspect| suspect.process.pid)
                    .collect(),
            });
        }
    }
    let apart = |mps: bool| -> Vec<u32> {
        account
            .bystanders_apart(mps)
            .map(|bystander| bystander.process.pid)
            .collect()
    };
    let (others, mps) = (apart(false), apart(true));
    if !others.is_empty() {
        notes.push(Note::BystandersNotBlamed { pids: others });
    }
    if !mps.is_empty() {
        notes.push(Note::MpsNotBlamed { pids: mps });
    }
    notes
}

fn owner_note(owner: &Owner) -> Option<Note> {
    let pid = owner.pid;
    match &owner.standing {
        Standing::Live(process) => {
            let comm = || process.comm.clone();
            match process.state.owner_state() {
                OwnerState::Stopped => Some(Note::OwnerStopped { pid, comm: comm() }),
                OwnerState::Uninterruptible => {
                    Some(Note::OwnerInUninterruptibleSleep { pid, comm: comm() })
                }
                OwnerState::Zombie => Some(Note::OwnerZombieLeader { pid, comm: comm() }),
                OwnerState::Running
                | OwnerState::Killed
                | OwnerState::Exiting
                | OwnerState::Gone
                | OwnerState::Unknown => None,
            }
        }
        Standing::Unknown(why) => Some(Note::OwnerUnknown {
            pid,
            detail: why.clone(),
        }),
        Standing::Gone(WhyGone::Reused { by }) => Some(Note::OwnerPidReused {
            pid,
            // Only a process seen before the one there now says who the owner was.
            was: owner
                .first_seen
                .as_ref()
                .filter(|first| first.start_time_ticks != by.start_time_ticks)
                .map(|first| first.comm.clone()),
            now: by.clone(),
        }),
        Standing::Exiting(_) | Standing::Gone(WhyGone::Exited) => None,
    }
}
