//! The memory account of one GPU (or MIG instance) as it is filled: what each owner is
//! charged, what no live process owns and whether that can be trusted, who keeps it, and
//! which owners a killed server left behind.

use super::{capacity, GpuAccount, NotCounted, StateTally, UnattributedTrust};
use crate::classify::holders::scan::ScanSummary;
use crate::classify::holders::{self, mps, HolderSearch, Role, Within};
use crate::classify::owners::after_kill::{self, LeftBehindOwner};
use crate::classify::owners::{GoneReason, Owner, OwnerState};
use crate::classify::processes::ProcessLens;
use crate::classify::settings::Settings;
use crate::observe::{MemoryReading, Observation, RecoveryAction};
use std::collections::{BTreeMap, BTreeSet};
use strum::EnumCount;

/// Which GPU an account covers (the whole GPU or one MIG instance of it), and what its
/// process lists and the driver said of it.
#[derive(Clone)]
pub(crate) struct AccountScope {
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

/// What every GPU's account is judged against: built once per classification, after the
/// owners of every GPU are judged (a holder of one GPU may be another's owner).
pub(crate) struct HostContext<'a> {
    pub observation: &'a Observation,
    pub settings: &'a Settings,
    pub lens: &'a ProcessLens<'a>,
    pub scan: Option<ScanSummary>,
    /// NVML index of every GPU each PID (ours) is a live owner of.
    pub live_owner_gpus: BTreeMap<u32, Vec<u32>>,
    /// Every PID NVML lists on some GPU or MIG device.
    pub listed: BTreeSet<u32>,
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

pub(crate) fn account_for_gpu(
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
        UnattributedTrust::NotCounted(NotCounted::OsManaged)
    } else if host.observation.host_pid_namespace != Some(true) {
        UnattributedTrust::NotCounted(NotCounted::Blind)
    } else if owners_uncertain {
        UnattributedTrust::NotCounted(NotCounted::OwnersUncertain)
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
        for suspect in holders::suspects(&scan.holders, &search, host.settings, host.lens) {
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
    account
}
