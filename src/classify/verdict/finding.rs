//! What a GPU's account amounts to, with the facts its sentence names: decided here in one
//! place, so that the finding scripts read (`finding` in `check --json`, keyed by
//! [`FindingKind`]), the sentence `check` prints and the status it exits with cannot
//! disagree. The renderers put the facts into words (plurals, lists) and choose none.

use crate::classify::account::{GpuAccount, LeftBehindBytes, UnattributedTrust};
use crate::classify::owners::{OwnerState, WhyGone};
use serde::Serialize;
use strum::EnumDiscriminants;

/// What a GPU's verdict amounts to, with the facts its sentence names. Its kind
/// ([`FindingKind`], `finding` in JSON) is the word scripts and statuses go by.
#[derive(Debug, Clone, PartialEq, Eq, EnumDiscriminants)]
#[strum_discriminants(name(FindingKind), derive(Serialize, Hash))]
#[strum_discriminants(serde(rename_all = "snake_case"))]
#[strum_discriminants(doc = "What a GPU's verdict amounts to, as a word: `finding` in JSON.")]
pub enum Finding {
    /// Nothing is used.
    Idle,
    /// Every used byte has a live owner.
    Owned(Owned),
    /// Nothing is proven orphaned, but memory cannot be judged (owners that cannot be
    /// read, a blind exporter, usage NVML cannot report).
    CannotTell {
        /// Owners that cannot be judged.
        unjudged_owners: Vec<u32>,
        /// Memory charged to no visible process, and why it is not called orphaned; `None`
        /// when there is none.
        unattributed: Option<(u64, UnattributedTrust)>,
    },
    /// Nothing is orphaned, but live owners hold memory for a server that has exited
    /// (seen, or possibly): [`GpuAccount::left_behind`] names them.
    LeftBehind {
        /// What they are charged, by certainty ([`GpuAccount::left_behind_bytes`]).
        bytes: LeftBehindBytes,
        /// How many the exporter saw left behind.
        witnessed_processes: u64,
        /// How many are only possibly left behind.
        possibly_processes: u64,
    },
    /// Nothing is orphaned or left behind, but owners were killed and are stuck in
    /// uninterruptible sleep: the kill waits, and their memory with it.
    KilledStuck {
        /// What they are charged.
        bytes: u64,
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Nothing else to say, but owners are in their exit path: the driver is freeing
    /// their memory.
    BeingFreed {
        /// What they are charged.
        bytes: u64,
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Memory is held without a live owner.
    Orphaned {
        /// How much ([`GpuAccount::orphaned_bytes`]).
        bytes: u64,
        /// Whom it is charged to.
        charged_to: ChargedTo,
    },
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
    /// Some GPU's memory is still held by live owners that should have let go of it:
    /// workers a killed server left behind, or owners killed and stuck in the driver;
    /// none is orphaned. `left_behind` in JSON, as exit status 4 has always been called.
    #[serde(rename = "left_behind")]
    StillHeld,
    /// Some GPU holds memory without a live owner.
    Orphaned,
    /// NVML or a GPU did not answer in time: the look is incomplete.
    NotAnswering,
    /// NVML is missing or failed: nothing can be said.
    NvmlDown,
}

/// How the memory of an owned GPU is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// Live owners hold every byte.
    ByLiveOwners {
        /// What they are charged ([`GpuAccount::live_owned_bytes`]).
        bytes: u64,
        /// How many they are.
        processes: u64,
    },
    /// Memory is used, but no live process owns any: it is within the driver's overhead
    /// ("0 B owned by 0 processes" would hide the memory).
    WithinOverhead {
        /// NVML's used memory.
        used_bytes: u64,
    },
}

/// Whom orphaned memory is charged to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargedTo {
    /// No process: NVML charges the memory to nobody.
    Nobody,
    /// Owners that are gone.
    GoneOwners {
        /// Their PIDs.
        pids: Vec<u32>,
        /// How the sentence says they went.
        departure: Departure,
    },
}

/// How the sentence says gone owners went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Every one exited.
    Exited,
    /// The one owner's PID names another process now, or several owners did not all
    /// simply exit.
    Gone,
}

impl Finding {
    /// The word of this finding.
    pub fn kind(&self) -> FindingKind {
        self.into()
    }
}

impl FindingKind {
    /// What `check` reports of an account with this finding.
    pub fn status(self) -> CheckStatus {
        match self {
            FindingKind::Orphaned => CheckStatus::Orphaned,
            FindingKind::LeftBehind | FindingKind::KilledStuck => CheckStatus::StillHeld,
            FindingKind::Idle | FindingKind::Owned => CheckStatus::Clear,
            FindingKind::CannotTell | FindingKind::BeingFreed => CheckStatus::CannotTell,
        }
    }

    /// Whether `check --wait` waits for memory of an account with this finding:
    /// orphaned, left behind, killed and stuck, or being freed.
    pub fn awaits_freeing(self) -> bool {
        matches!(
            self,
            FindingKind::Orphaned
                | FindingKind::LeftBehind
                | FindingKind::KilledStuck
                | FindingKind::BeingFreed
        )
    }
}

/// What the account amounts to, in order: orphaned memory above all; then workers a
/// killed server left behind; owners killed and stuck; memory that cannot be judged;
/// owners being freed; else idle or owned.
pub(super) fn decide(account: &GpuAccount) -> Finding {
    let orphaned = account.orphaned_bytes();
    if orphaned > 0 {
        return Finding::Orphaned {
            bytes: orphaned,
            charged_to: charged_to(account),
        };
    }
    if !account.left_behind.is_empty() {
        let (witnessed_processes, possibly_processes) = account.left_behind_processes();
        return Finding::LeftBehind {
            bytes: account.left_behind_bytes(),
            witnessed_processes,
            possibly_processes,
        };
    }
    if account.tally.processes(OwnerState::Killed) > 0 {
        return Finding::KilledStuck {
            bytes: account.tally.bytes(OwnerState::Killed),
            pids: account.pids_in(OwnerState::Killed),
        };
    }
    let unattributed_uncounted =
        account.unattributed_bytes > 0 && account.unattributed_trust != UnattributedTrust::Counted;
    if account.tally.processes(OwnerState::Unknown) > 0
        || unattributed_uncounted
        || (account.processes_denied.is_some() && account.memory.used > 0)
    {
        return Finding::CannotTell {
            unjudged_owners: account.pids_in(OwnerState::Unknown),
            unattributed: (account.unattributed_bytes > 0)
                .then_some((account.unattributed_bytes, account.unattributed_trust)),
        };
    }
    if account.tally.processes(OwnerState::Exiting) > 0 {
        return Finding::BeingFreed {
            bytes: account.tally.bytes(OwnerState::Exiting),
            pids: account.pids_in(OwnerState::Exiting),
        };
    }
    if account.memory.used == 0 && account.owners.is_empty() {
        return Finding::Idle;
    }
    let processes = account.live_owners().count() as u64;
    Finding::Owned(if processes == 0 {
        Owned::WithinOverhead {
            used_bytes: account.memory.used,
        }
    } else {
        Owned::ByLiveOwners {
            bytes: account.live_owned_bytes(),
            processes,
        }
    })
}

/// Whom the memory held without a live owner is charged to.
fn charged_to(account: &GpuAccount) -> ChargedTo {
    let gone: Vec<(u32, &WhyGone)> = account
        .owners
        .iter()
        .filter_map(|owner| Some((owner.pid, owner.gone()?)))
        .collect();
    let departure = match gone.as_slice() {
        [] => return ChargedTo::Nobody,
        [(_, WhyGone::Exited)] => Departure::Exited,
        [(_, WhyGone::Reused { .. })] => Departure::Gone,
        several if several.iter().all(|(_, why)| **why == WhyGone::Exited) => Departure::Exited,
        _ => Departure::Gone,
    };
    ChargedTo::GoneOwners {
        pids: gone.iter().map(|(pid, _)| *pid).collect(),
        departure,
    }
}
