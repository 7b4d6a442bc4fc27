//! Which sentence a GPU's verdict is, with the facts it names: decided here, so that the
//! words `check` prints and the data of `check --json` cannot disagree. The renderers
//! put the sentence into words (plurals, lists) and choose none of it.

use super::owners::{OwnerState, WhyGone};
use super::verdict::{capacity, Finding, GpuAccount, LeftBehindBytes, UnattributedTrust};
use strum::VariantArray;

/// Which sentence a GPU's verdict is, with the facts it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sentence {
    /// Nothing is used.
    Idle,
    /// Memory is used, but no live process owns any: it is within the driver's overhead.
    WithinOverhead {
        /// NVML's used memory.
        used_bytes: u64,
    },
    /// Live owners hold every byte.
    Owned {
        /// What they are charged ([`GpuAccount::live_owned_bytes`]).
        bytes: u64,
        /// How many they are.
        processes: u64,
    },
    /// Nothing can be called orphaned, and why.
    CannotTell {
        /// Owners that cannot be judged.
        unjudged_owners: Vec<u32>,
        /// Memory charged to no visible process, and why it is not called orphaned; `None`
        /// when there is none.
        unattributed: Option<(u64, UnattributedTrust)>,
    },
    /// Live owners hold memory for a server that has exited: [`GpuAccount::left_behind`]
    /// names them; [`GpuAccount::remedy`] says what frees it.
    LeftBehind {
        /// What they are charged, by certainty ([`GpuAccount::left_behind_bytes`]).
        bytes: LeftBehindBytes,
        /// How many the exporter saw left behind.
        witnessed_processes: u64,
        /// How many are only possibly left behind.
        possibly_processes: u64,
    },
    /// Owners were killed and wait in uninterruptible sleep; [`GpuAccount::remedy`] says
    /// whether to wait or to reset.
    KilledStuck {
        /// What they are charged.
        bytes: u64,
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Owners are in their exit path and the driver is freeing their memory.
    BeingFreed {
        /// What they are charged.
        bytes: u64,
        /// Their PIDs.
        pids: Vec<u32>,
    },
    /// Memory is held without a live owner; [`GpuAccount::remedy`] says what frees it.
    Orphaned {
        /// How much ([`GpuAccount::orphaned_bytes`]).
        bytes: u64,
        /// Whom it is charged to.
        charged_to: ChargedTo,
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

impl GpuAccount {
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

    /// Which sentence the verdict is, with the facts it names.
    pub fn sentence(&self) -> Sentence {
        match self.finding {
            Finding::Idle => Sentence::Idle,
            Finding::Owned => {
                let processes = self.live_owners().count() as u64;
                if processes == 0 {
                    // Used memory under the noise floor with no owner: "0 B owned by 0
                    // processes" would hide the memory.
                    Sentence::WithinOverhead {
                        used_bytes: self.memory.used,
                    }
                } else {
                    Sentence::Owned {
                        bytes: self.live_owned_bytes(),
                        processes,
                    }
                }
            }
            Finding::CannotTell => Sentence::CannotTell {
                unjudged_owners: self
                    .owners
                    .iter()
                    .filter(|owner| owner.state() == OwnerState::Unknown)
                    .map(|owner| owner.pid)
                    .collect(),
                unattributed: (self.unattributed_bytes > 0)
                    .then_some((self.unattributed_bytes, self.unattributed_trust)),
            },
            Finding::LeftBehind => {
                let witnessed_processes = self
                    .left_behind
                    .iter()
                    .filter(|owner| owner.seen.witnessed())
                    .count() as u64;
                Sentence::LeftBehind {
                    bytes: self.left_behind_bytes(),
                    witnessed_processes,
                    possibly_processes: self.left_behind.len() as u64 - witnessed_processes,
                }
            }
            Finding::KilledStuck => Sentence::KilledStuck {
                bytes: self.tally.bytes(OwnerState::Killed),
                pids: self.pids_in(OwnerState::Killed),
            },
            Finding::BeingFreed => Sentence::BeingFreed {
                bytes: self.tally.bytes(OwnerState::Exiting),
                pids: self.pids_in(OwnerState::Exiting),
            },
            Finding::Orphaned => Sentence::Orphaned {
                bytes: self.orphaned_bytes(),
                charged_to: self.charged_to(),
            },
        }
    }

    /// The PIDs of the owners in `state`.
    fn pids_in(&self, state: OwnerState) -> Vec<u32> {
        self.owners
            .iter()
            .filter(|owner| owner.state() == state)
            .map(|owner| owner.pid)
            .collect()
    }

    /// Whom the memory held without a live owner is charged to.
    fn charged_to(&self) -> ChargedTo {
        let gone: Vec<(u32, &WhyGone)> = self
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
}
