//! The verdict on one GPU (or MIG instance) as data: its memory account, what it amounts
//! to, the remedy and the notes. The types only: `account.rs` fills the account,
//! `remedy.rs` and `notes.rs` decide from it.

use super::after_kill::{LeftBehindOwner, Unwatched};
use super::owners::{GoneReason, Owner, OwnerState, WhyUnknown};
use super::process::{KillTarget, Process};
use super::slurm::{LeftBySlurm, SlurmEnded, SlurmJob};
use super::suspects::{Role, Suspect};
use crate::observe::{CgroupAttribution, MemoryReading, RecoveryAction};
use serde::Serialize;
use strum::{EnumCount, IntoStaticStr, VariantArray};

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
    pub(super) fn add(&mut self, state: OwnerState, bytes: Option<u64>) {
        self.processes[state as usize] += 1;
        self.bytes[state as usize] = self.bytes[state as usize].saturating_add(bytes.unwrap_or(0));
    }

    /// No state holds more than the GPU has: NVML's per-process figures can repeat or
    /// exceed the memory (a driver bug, a garbage reading).
    pub(super) fn cap_bytes(&mut self, capacity: u64) {
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
    /// The remedy as a person acts on it: how the verdict says it, and the commands.
    #[serde(skip)]
    pub suggestion: Suggestion,
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

    /// The memory of the left-behind owners, by how each is known to be left behind: the
    /// one rule that the series, the sentence and JSON state.
    pub fn left_behind_bytes(&self) -> LeftBehindBytes {
        let sum = |witnessed: bool| {
            self.left_behind
                .iter()
                .filter(|owner| owner.seen.witnessed() == witnessed)
                .filter_map(|owner| owner.used_bytes)
                .fold(0, u64::saturating_add)
        };
        let witnessed = sum(true).min(self.memory.used);
        LeftBehindBytes {
            witnessed,
            possibly: sum(false).min(self.memory.used - witnessed),
        }
    }
}

/// The memory NVML charges a GPU's left-behind owners, never more than is used, counted
/// apart by certainty. Witnessed bytes are those of owners whose server the exporter saw
/// exit: what `vram_left_behind_bytes` counts and the alert pages on. Possibly
/// left-behind bytes are those of owners whose scope alone says so (a look that never saw
/// the server): `vram_possibly_left_behind_bytes`, never paged on. The sentence leads
/// with the witnessed bytes when there are any, and names the possible ones beside them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LeftBehindBytes {
    /// Held by owners whose server was seen to exit.
    pub witnessed: u64,
    /// Held by owners only possibly left behind.
    pub possibly: u64,
}

impl LeftBehindBytes {
    /// Both together: what a person waits to see freed.
    pub fn total(self) -> u64 {
        self.witnessed.saturating_add(self.possibly)
    }
}

/// Memory a GPU can hand to contexts: the total less the driver's reservation.
pub(super) fn capacity(memory: &MemoryReading) -> u64 {
    memory.total.saturating_sub(memory.reserved)
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
    /// [`KILL_STUCK_SECONDS`](super::KILL_STUCK_SECONDS): its memory is being freed, or may be soon.
    Wait,
    /// End the workers a server left behind (each named with its start time): they hold
    /// memory for a server that has exited.
    KillLeftBehind {
        /// The left-behind owners, in PID order.
        targets: Vec<KillTarget>,
    },
    /// Processes were killed and have been stuck in the driver for longer than
    /// [`KILL_STUCK_SECONDS`](super::KILL_STUCK_SECONDS): another kill cannot end them, only a GPU reset (which the
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

/// A Slurm job to cancel, and the culprits that run in its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobToCancel {
    /// The job id.
    pub job_id: u64,
    /// Its user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The culprits in its running steps, each named with its start time.
    pub culprits: Vec<KillTarget>,
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
        trust: NotCounted,
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
        /// What of the job has ended.
        #[serde(skip)]
        ended: SlurmEnded,
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
    /// A live owner placed as a killed server's worker is, with no clue of being one, seen
    /// by a look that went by no witness state: it could not have seen a server killed.
    OwnerUnwatched {
        /// The owner.
        #[serde(flatten)]
        owner: Unwatched,
    },
}

/// A culprit whose Slurm step has ended or may have: Slurm will not end it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftBehind {
    /// Its PID.
    pub pid: u32,
    /// Its job and step, and whether the job runs.
    pub job: SlurmJob,
    /// Why Slurm will not end it.
    #[serde(skip)]
    pub why: LeftBySlurm,
}

/// Unattributed memory that is not called orphaned, by why not (the `trust` of the note;
/// the cases where the remainder is counted, or is no measurement, have notes of their
/// own or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotCounted {
    /// Not in the host PID namespace: NVML hides foreign processes.
    Blind,
    /// An owner's usage or state cannot be told: the remainder may be that owner's.
    OwnersUncertain,
    /// The operating system manages the GPU's memory.
    OsManaged,
}

impl NotCounted {
    /// Why `trust` leaves unattributed memory uncounted, where a note says so.
    pub(super) fn of(trust: UnattributedTrust) -> Option<NotCounted> {
        match trust {
            UnattributedTrust::Blind => Some(NotCounted::Blind),
            UnattributedTrust::OwnersUncertain => Some(NotCounted::OwnersUncertain),
            UnattributedTrust::OsManaged => Some(NotCounted::OsManaged),
            UnattributedTrust::Counted | UnattributedTrust::Inconsistent => None,
        }
    }
}

/// The remedy as a person acts on it: which way the verdict says it (the case, with the
/// facts it names) and the commands to run, as data. Decided in `remedy.rs`; the
/// renderers put each case into fixed words and print the commands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Suggestion {
    /// Which way the verdict says the remedy.
    #[serde(skip)]
    pub advice: Advice,
    /// The commands, in the order to run them; empty when none would help.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<Command>,
    /// The look that tells whether they worked, when one follows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub then: Option<Command>,
    /// Seconds the suggested look waits for the memory to be freed, when it waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
}

impl Suggestion {
    /// Whether there is anything to run.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty() && self.then.is_none()
    }
}

/// Which way the verdict says its remedy: one case per way, each with the facts it
/// names. [`Remedy`] is the same decision as scripts read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Advice {
    /// Nothing to do, or to suggest.
    #[default]
    None,
    /// End the culprits.
    Kill {
        /// The culprits, in PID order.
        targets: Vec<KillTarget>,
    },
    /// Cancel the Slurm jobs whose steps hold the memory, and kill the other culprits.
    CancelJobs {
        /// The jobs, each with its culprits.
        jobs: Vec<JobToCancel>,
        /// The other culprits.
        targets: Vec<KillTarget>,
    },
    /// End the workers a server left behind.
    KillLeftBehind {
        /// The workers, in PID order.
        targets: Vec<KillTarget>,
    },
    /// The culprits were killed and their kill waits in the driver: wait, and look again.
    WaitForKilledCulprits,
    /// Owners were killed and their kill waits in the driver: wait, and look again.
    WaitForKilledOwners,
    /// Owners are exiting and the driver is freeing their memory: look again shortly.
    WaitWhileFreed,
    /// The culprits were killed and have waited in the driver past hope.
    ResetOrRebootForCulprits {
        /// The stuck culprits.
        stuck: Vec<KillTarget>,
    },
    /// Owners were killed and have waited in the driver past hope.
    ResetOrRebootForOwners {
        /// The stuck owners.
        stuck: Vec<KillTarget>,
    },
    /// Only restarting MPS frees a dead client's memory that its server holds.
    RestartMps {
        /// The MPS servers.
        servers: Vec<u32>,
        /// Their control daemons.
        daemons: Vec<u32>,
        /// The live clients the restart ends too.
        clients: Vec<u32>,
    },
    /// Stopping the live owners may free it.
    StopOwners {
        /// The live owners.
        pids: Vec<u32>,
    },
    /// No process holds the device file: only a GPU reset frees it.
    ResetUnheld,
    /// Only NVML clients hold the device file: a GPU reset, once they are stopped.
    ResetOnceClientsStop {
        /// The NVML clients.
        blockers: Vec<u32>,
    },
    /// The driver asks for a reboot.
    Reboot,
    /// The left-behind workers cannot be reached from here: no kill is suggested.
    WorkersUnreachable {
        /// Why.
        reason: Blindness,
    },
    /// Which process holds the memory cannot be told.
    CannotTell {
        /// Why.
        reason: Blindness,
    },
}

/// A command the exporter suggests and never runs, as a script would run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Command {
    /// The program.
    pub program: &'static str,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it reads on standard input, when it reads a command there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<&'static str>,
}

impl Command {
    fn new(program: &'static str, args: impl IntoIterator<Item = String>) -> Command {
        Command {
            program,
            args: args.into_iter().collect(),
            stdin: None,
        }
    }

    /// `kill PID...`
    pub(super) fn kill(pids: impl IntoIterator<Item = u32>) -> Command {
        Command::new("kill", pids.into_iter().map(|pid| pid.to_string()))
    }

    /// `scancel JOB...`
    pub(super) fn scancel(jobs: impl IntoIterator<Item = u64>) -> Command {
        Command::new("scancel", jobs.into_iter().map(|job| job.to_string()))
    }

    /// `vram-exporter check --gpu INDEX [--wait SECONDSs]`, as root where `as_root`.
    pub(super) fn look(gpu: u32, wait_seconds: Option<u64>, as_root: bool) -> Command {
        let mut args = vec!["check".to_string(), "--gpu".to_string(), gpu.to_string()];
        if let Some(seconds) = wait_seconds {
            args.extend(["--wait".to_string(), format!("{seconds}s")]);
        }
        if as_root {
            Command::new(
                "sudo",
                std::iter::once("vram-exporter".to_string()).chain(args),
            )
        } else {
            Command::new("vram-exporter", args)
        }
    }

    /// `nvidia-smi --gpu-reset -i INDEX`
    pub(super) fn reset_gpu(gpu: u32) -> Command {
        Command::new(
            "nvidia-smi",
            ["--gpu-reset".to_string(), "-i".to_string(), gpu.to_string()],
        )
    }

    /// `echo quit | nvidia-cuda-mps-control`: ends the MPS control daemon and its servers.
    pub(super) fn quit_mps() -> Command {
        Command {
            stdin: Some("quit"),
            ..Command::new("nvidia-cuda-mps-control", [])
        }
    }

    /// `nvidia-cuda-mps-control -d`: starts the MPS control daemon.
    pub(super) fn start_mps() -> Command {
        Command::new("nvidia-cuda-mps-control", ["-d".to_string()])
    }

    /// `systemctl reboot`
    pub(super) fn reboot() -> Command {
        Command::new("systemctl", ["reboot".to_string()])
    }
}
