//! The facts about a GPU worth a line of their own, decided from a finished account: the
//! driver's requests, owners in odd states, culprits' circumstances, who is set apart.

use super::after_kill;
use super::owners::{Owner, OwnerState, Standing, WhyGone};
use super::process::{Process, ProcessState};
use super::remedy::scan_blindness;
use super::report::ScanSummary;
use super::slurm::LeftBySlurm;
use super::verdict::{GpuAccount, LeftBehind, NotCounted, Note};
use crate::observe::RecoveryAction;

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
    if let (true, Some(trust)) = (
        account.unattributed_bytes > 0,
        NotCounted::of(account.unattributed_trust),
    ) {
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
fn left_by_slurm<'a>(culprits: impl IntoIterator<Item = &'a Process>) -> Vec<LeftBehind> {
    culprits
        .into_iter()
        .filter_map(|process| {
            let job = process.slurm_job.as_ref()?;
            Some(LeftBehind {
                pid: process.pid,
                job: job.clone(),
                why: job.left_by_slurm()?,
            })
        })
        .collect()
}
