//! The memory account of one GPU (or MIG instance): what each owner is charged, what no
//! live process owns and whether that can be trusted, who keeps it, and what it all
//! amounts to. The remedy and the notes are decided from the finished account
//! (`remedy.rs`, `notes.rs`).

use super::after_kill::{self, LeftBehindOwner};
use super::mps;
use super::suspects::{self, HolderSearch, Within};
use super::{
    notes, remedy, GoneReason, HostContext, MemoryReading, Note, Owner, OwnerState, RecoveryAction,
    Remedy, Role, Suspect,
};
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

/// Which GPU an account covers (the whole GPU or one MIG instance of it), and what its
/// process lists and the driver said of it.
#[derive(Clone)]
pub(super) struct AccountScope {
    pub index: u32,
    pub minor: Option<u32>,
    /// NVML's words when it refused a process list: owners may be missing.
    pub denied: Option<String>,
    /// The whole GPU, or one MIG instance of it.
    pub within: Within,
    /// The driver's recovery action for the GPU.
    pub recovery: Option<RecoveryAction>,
    /// The operating system manages the GPU's memory.
    pub os_managed: bool,
}

/// Memory a GPU can hand to contexts: the total less the driver's reservation.
pub(super) fn capacity(memory: &MemoryReading) -> u64 {
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

pub(super) fn account_for_gpu(
    reading: MemoryReading,
    mut owners: Vec<Owner>,
    scope: AccountScope,
    host: &HostContext<'_>,
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
    let mut owners_uncertain = scope.denied.is_some();
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

    let noise_floor = host
        .settings
        .context_overhead_bytes
        .saturating_mul(owners.len() as u64);
    let unattributed_bytes = memory
        .used
        .saturating_sub(charged_bytes)
        .saturating_sub(noise_floor);
    let unattributed_trust = if memory_inconsistent {
        UnattributedTrust::Inconsistent
    } else if scope.os_managed {
        UnattributedTrust::OsManaged
    } else if host.observation.host_pid_namespace != Some(true) {
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
        processes_denied: scope.denied.clone(),
        finding: Finding::Idle,
        remedy: Remedy::None,
        notes: Vec::new(),
        owners,
    };
    let orphaned = account.orphaned_bytes() > 0;
    // Holders are looked for only where memory is orphaned: elsewhere nothing is blamed,
    // and the three outputs agree on it.
    if let (true, Some(minor), Some(scan)) =
        (orphaned, scope.minor, host.observation.holder_scan.as_ref())
    {
        let mps = mps::mps_parts(&scan.holders, &account.owners, &host.listed);
        let search = HolderSearch {
            minor,
            index: scope.index,
            within: &scope.within,
            owners: &account.owners,
            live_owner_gpus: &host.live_owner_gpus,
            mps: &mps,
        };
        for suspect in suspects::suspects(&scan.holders, &search, host.settings, host.lens) {
            match suspect.role {
                Role::Culprit => account.culprits.push(suspect),
                Role::Bystander => account.bystanders.push(suspect),
                Role::Undetermined => account.undetermined.push(suspect),
            }
        }
    }
    let taken_at = host.observation.taken_at_unix_seconds;
    account.left_behind = account
        .owners
        .iter()
        .filter_map(|owner| {
            let seen = after_kill::left_behind(owner, host.lens, taken_at)?;
            Some(LeftBehindOwner {
                process: owner.process()?.clone(),
                used_bytes: owner.used_bytes,
                seen,
            })
        })
        .collect();
    account.finding = finding(&account);
    account.remedy = remedy::decide(&account, host.scan, scope.recovery, taken_at);
    account.notes = notes::decide(&account, host.scan);
    if let Some(action) = scope
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
