//! The facts about a GPU worth a line of their own, decided from a finished account: the
//! driver's requests, owners in odd states, culprits' circumstances, who is set apart.

use crate::classify::account::NotCounted;
use crate::classify::account::{GpuAccount, UnattributedTrust};
use crate::classify::holders::scan::{scan_blindness, Blindness, ScanSummary};
use crate::classify::owners::after_kill::{self, Unwatched};
use crate::classify::owners::{Owner, OwnerState, Standing, WhyGone, WhyUnknown};
use crate::classify::processes::slurm::{LeftBySlurm, SlurmEnded, SlurmJob};
use crate::classify::processes::{Process, ProcessState};
use crate::observe::{CgroupAttribution, RecoveryAction};
use serde::Serialize;

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
        culprits: Vec<CulpritLeftBySlurm>,
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
pub struct CulpritLeftBySlurm {
    /// Its PID.
    pub pid: u32,
    /// Its job and step, and whether the job runs.
    pub job: SlurmJob,
    /// Why Slurm will not end it.
    #[serde(skip)]
    pub why: LeftBySlurm,
}

/// Most notes about owners one GPU carries; `check --json` still lists every owner.
const MAX_OWNER_NOTES: usize = 32;

pub(super) fn decide(
    account: &GpuAccount,
    scan: Option<ScanSummary>,
    recovery: Option<RecoveryAction>,
    unwatched: bool,
) -> Vec<Note> {
    let mut notes = Vec::new();
    if let Some(action) = recovery.filter(|action| *action != RecoveryAction::NoneNeeded) {
        notes.push(Note::DriverAsks { action });
    }
    if let Some(message) = &account.processes_denied {
        notes.push(Note::ProcessListDenied {
            message: message.clone(),
        });
    }
    if account.memory_inconsistent {
        notes.push(Note::MemoryInconsistent);
    }
    if let (true, UnattributedTrust::NotCounted(trust)) =
        (account.unattributed_bytes > 0, account.unattributed_trust)
    {
        notes.push(Note::UnattributedNotCounted {
            bytes: account.unattributed_bytes,
            trust,
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
            match job.left_by_slurm()? {
                LeftBySlurm::Ended(ended) => Some(Note::OwnerLeftBySlurm {
                    pid: owner.pid,
                    comm: process.comm.clone(),
                    job: job.clone(),
                    ended,
                }),
                // An owner's step that may still run is Slurm's to end: no note.
                LeftBySlurm::Unknown => None,
            }
        });
        owner_notes.extend(left_by_slurm);
        // A look without a witness state says what only watching could have told.
        let left_behind = account
            .left_behind
            .iter()
            .any(|left| left.process.pid == owner.pid);
        if unwatched && !left_behind {
            owner_notes
                .extend(after_kill::unwatched(owner).map(|owner| Note::OwnerUnwatched { owner }));
        }
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
        let left = left_by_slurm(account.culprits.iter().map(|culprit| &culprit.process));
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

/// The culprits whose Slurm step has ended, or of which it cannot be told.
fn left_by_slurm<'a>(culprits: impl IntoIterator<Item = &'a Process>) -> Vec<CulpritLeftBySlurm> {
    culprits
        .into_iter()
        .filter_map(|process| {
            let job = process.slurm_job.as_ref()?;
            Some(CulpritLeftBySlurm {
                pid: process.pid,
                job: job.clone(),
                why: job.left_by_slurm()?,
            })
        })
        .collect()
}
