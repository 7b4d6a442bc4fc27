//! The memory account of one GPU (or MIG instance) as data: NVML's figures, every owner
//! with its verdict, what no live process owns and whether that can be trusted, who holds
//! the device file, and the workers a killed server left behind. Each figure has one
//! method here, which every output reads. `build.rs` fills the account; the verdict
//! (`super::verdict`) is decided from the finished account.

mod build;

pub(super) use build::{account_for_gpu, AccountScope, HostContext};

use super::holders::{Role, Suspect};
use super::owners::after_kill::LeftBehindOwner;
use super::owners::{GoneReason, Owner, OwnerState};
use crate::observe::MemoryReading;
use serde::Serialize;
use strum::{EnumCount, IntoStaticStr, VariantArray};

/// Why unattributed memory is or is not called orphaned (`unattributed_trust` in JSON:
/// `counted`, `inconsistent`, or the word of [`NotCounted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnattributedTrust {
    /// We see every process and every live owner's usage: the remainder is orphaned.
    Counted,
    /// NVML's memory figures contradict each other: the remainder is not a measurement
    /// (a note of its own says so).
    Inconsistent,
    /// The remainder is a measurement, but not of orphaned memory, and why.
    #[serde(untagged)]
    NotCounted(NotCounted),
}

/// Why unattributed memory that is a measurement is not called orphaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotCounted {
    /// Not in the host PID namespace: NVML hides foreign processes, so the remainder
    /// proves nothing.
    Blind,
    /// A live or unknown owner's usage is unavailable, or an owner cannot be judged: the
    /// remainder may be that owner's.
    OwnersUncertain,
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

/// The memory account of a GPU whose readings succeeded: the figures and the processes
/// they rest on. The verdict built from it is [`super::Verdict`].
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
}

impl GpuAccount {
    /// Unattributed bytes that count as orphaned (0 unless the remainder can be trusted).
    pub fn orphaned_unattributed_bytes(&self) -> u64 {
        match self.unattributed_trust {
            UnattributedTrust::Counted => self.unattributed_bytes,
            UnattributedTrust::Inconsistent | UnattributedTrust::NotCounted(_) => 0,
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

    /// The PIDs of the owners in `state`.
    pub fn pids_in(&self, state: OwnerState) -> Vec<u32> {
        self.owners
            .iter()
            .filter(|owner| owner.state() == state)
            .map(|owner| owner.pid)
            .collect()
    }

    /// Bytes charged to live owners: `vram_owned_bytes` of the live states summed, never
    /// more than the GPU can hand out. The one figure every output gives.
    pub fn live_owned_bytes(&self) -> u64 {
        OwnerState::VARIANTS
            .iter()
            .filter(|state| state.is_live())
            .map(|state| self.tally.bytes(*state))
            .fold(0, u64::saturating_add)
            .min(capacity(&self.memory))
    }

    /// How many left-behind owners are witnessed (their server seen to exit), and how
    /// many only possibly left behind.
    pub fn left_behind_processes(&self) -> (u64, u64) {
        let witnessed = self
            .left_behind
            .iter()
            .filter(|owner| owner.seen.witnessed())
            .count() as u64;
        (witnessed, self.left_behind.len() as u64 - witnessed)
    }

    /// Memory a person waits to see freed after acting: orphaned, left behind, held by
    /// owners killed and stuck, or being freed.
    pub fn to_free_bytes(&self) -> u64 {
        [
            self.orphaned_bytes(),
            self.left_behind_bytes().total(),
            self.tally.bytes(OwnerState::Killed),
            self.tally.bytes(OwnerState::Exiting),
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
        .min(self.memory.used)
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
pub(crate) fn capacity(memory: &MemoryReading) -> u64 {
    memory.total.saturating_sub(memory.reserved)
}
