//! What would give the memory back, decided from a finished account and its finding: the
//! action, with the processes, jobs or daemons it concerns, and which way the verdict
//! says it. One type for scripts (`remedy` in `check --json`, keyed by `action`) and for
//! the words: a case the words tell apart is a case here. `super::commands` turns it
//! into the commands a person runs.

use super::finding::FindingKind;
use crate::classify::account::GpuAccount;
use crate::classify::holders::scan::{scan_blindness, Blindness, ScanSummary};
use crate::classify::holders::Evidence;
use crate::classify::owners::after_kill;
use crate::classify::owners::Owner;
use crate::classify::processes::slurm::JobState;
use crate::classify::processes::{KillTarget, Process};
use crate::observe::RecoveryAction;
use serde::Serialize;

/// What would give the memory back; the exporter only suggests it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Remedy {
    /// Nothing to do, or to suggest.
    #[default]
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
    /// [`KILL_STUCK_SECONDS`](after_kill::KILL_STUCK_SECONDS): its memory is being freed,
    /// or may be soon.
    Wait {
        /// What the wait is for.
        #[serde(skip)]
        on: WaitOn,
    },
    /// End the workers a server left behind (each named with its start time): they hold
    /// memory for a server that has exited.
    KillLeftBehind {
        /// The left-behind owners, in PID order.
        targets: Vec<KillTarget>,
    },
    /// Processes were killed and have been stuck in the driver for longer than
    /// [`KILL_STUCK_SECONDS`](after_kill::KILL_STUCK_SECONDS): another kill cannot end
    /// them, only a GPU reset (which the driver refuses while they hold the GPU) or a
    /// reboot gives the memory back.
    ResetOrReboot {
        /// The stuck processes.
        stuck: Vec<KillTarget>,
        /// Whether they are the culprits or the owners.
        #[serde(skip)]
        whose: Whose,
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
    /// too), and on a MIG GPU it ends every instance. With no blockers, no process holds
    /// the device file at all.
    ResetGpu {
        /// Processes that hold the device file without a context (the bystanders): they
        /// must stop before the driver allows the reset.
        blockers: Vec<u32>,
    },
    /// The driver says the node must be rebooted: no reset or kill will do.
    Reboot,
    /// What holds the memory cannot be told, or the workers to end cannot be reached
    /// from here ([`Blindness::WorkersNotVisible`]); nothing is suggested but how to see
    /// more.
    CannotTell {
        /// Why.
        reason: Blindness,
    },
}

/// What a wait is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WaitOn {
    /// A kill that waits in the driver, of the culprits or of the owners.
    Kill(Whose),
    /// Owners in their exit path: the driver is freeing their memory.
    #[default]
    Free,
}

/// Whose kill waits: the culprits' (memory is orphaned) or the owners'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Whose {
    /// The culprits that keep orphaned memory.
    Culprits,
    /// The GPU's own owners.
    #[default]
    Owners,
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

/// What gives the memory back, in order: end the culprits; say "cannot tell" when
/// a holder may hide behind what could not be read; wait for an exiting owner; restart
/// MPS when its server alone holds a dead client's memory; stop the live owners that
/// alone hold the device; else only a reset frees it.
pub(super) fn decide(
    account: &GpuAccount,
    finding: FindingKind,
    scan: Option<ScanSummary>,
    recovery: Option<RecoveryAction>,
    taken_at: Option<u64>,
) -> Remedy {
    match finding {
        FindingKind::Orphaned => {}
        FindingKind::LeftBehind => {
            if account
                .left_behind
                .iter()
                .any(|owner| !owner.process.visible_here)
            {
                return Remedy::CannotTell {
                    reason: Blindness::WorkersNotVisible,
                };
            }
            let mut targets: Vec<KillTarget> = account
                .left_behind
                .iter()
                .map(|owner| KillTarget::of(&owner.process))
                .collect();
            targets.sort_by_key(|target| target.pid);
            targets.dedup_by_key(|target| target.pid);
            return Remedy::KillLeftBehind { targets };
        }
        FindingKind::KilledStuck => {
            let killed: Vec<&Process> = account
                .live_owners()
                .filter_map(Owner::process)
                .filter(|process| process.killed())
                .collect();
            return stuck_remedy(&killed, Whose::Owners, taken_at);
        }
        FindingKind::BeingFreed => return Remedy::Wait { on: WaitOn::Free },
        FindingKind::Idle | FindingKind::Owned | FindingKind::CannotTell => return Remedy::None,
    }
    if !account.culprits.is_empty() {
        let culprits: Vec<&Process> = account
            .culprits
            .iter()
            .map(|culprit| &culprit.process)
            .collect();
        // Culprits that were killed and are stuck in the driver take no second kill.
        if culprits.iter().all(|process| process.killed()) {
            return stuck_remedy(&culprits, Whose::Culprits, taken_at);
        }
        if culprits.iter().any(|process| !process.visible_here) {
            return Remedy::CannotTell {
                reason: Blindness::CulpritsNotVisible,
            };
        }
        let (jobs, targets) = jobs_to_cancel(&culprits);
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
/// the kill has waited [`KILL_STUCK_SECONDS`](after_kill::KILL_STUCK_SECONDS); then a GPU
/// reset or a reboot.
fn stuck_remedy(stuck: &[&Process], whose: Whose, taken_at: Option<u64>) -> Remedy {
    let past_hope = stuck.iter().all(|process| {
        after_kill::killed_stuck(process, taken_at).is_some_and(|stuck| stuck.past_hope)
    });
    if !past_hope {
        return Remedy::Wait {
            on: WaitOn::Kill(whose),
        };
    }
    let mut targets: Vec<KillTarget> = stuck
        .iter()
        .map(|process| KillTarget::of(process))
        .collect();
    targets.sort_by_key(|target| target.pid);
    Remedy::ResetOrReboot {
        stuck: targets,
        whose,
    }
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

/// Culprits whose own step Slurm still runs, grouped by job; the others are left to kill.
fn jobs_to_cancel(culprits: &[&Process]) -> (Vec<JobToCancel>, Vec<KillTarget>) {
    let mut jobs: Vec<JobToCancel> = Vec::new();
    let mut others = Vec::new();
    for process in culprits {
        let target = KillTarget::of(process);
        match &process.slurm_job {
            Some(job) if job.state == JobState::Running => {
                match jobs.iter_mut().find(|known| known.job_id == job.job_id) {
                    Some(known) => known.culprits.push(target),
                    None => jobs.push(JobToCancel {
                        job_id: job.job_id,
                        user: job.user.clone(),
                        culprits: vec![target],
                    }),
                }
            }
            _ => others.push(target),
        }
    }
    jobs.sort_by_key(|job| job.job_id);
    (jobs, others)
}
