//! What would give the memory back, decided from a finished account: the action, with
//! the processes, jobs or daemons it concerns.

use super::after_kill;
use super::owners::Owner;
use super::process::{KillTarget, Process};
use super::report::ScanSummary;
use super::slurm::JobState;
use super::suspects::Evidence;
use super::verdict::{
    Advice, Blindness, Command, Finding, GpuAccount, JobToCancel, LookAgain, Remedy, Suggestion,
};
use crate::observe::RecoveryAction;

/// What gives orphaned memory back, in order: end the culprits; say "cannot tell" when
/// a holder may hide behind what could not be read; wait for an exiting owner; restart
/// MPS when its server alone holds a dead client's memory; stop the live owners that
/// alone hold the device; else only a reset frees it.
pub(super) fn decide(
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

/// Seconds the look after a kill or an MPS restart waits for the memory to be freed.
const AFTER_ACTING_WAIT_SECONDS: u64 = 30;
/// Seconds the look waits for a kill that waits in the driver, or after stopping owners.
const STUCK_WAIT_SECONDS: u64 = 60;
/// Seconds the look waits for memory the driver is freeing (see
/// [`super::FREEING_MEASURED`]).
const FREEING_WAIT_SECONDS: u64 = 5;

/// The remedy as a person acts on it on GPU `gpu` (a MIG instance's GPU for its own
/// account): which way the verdict says it, the commands, and the look that tells
/// whether they worked, with how long it waits.
pub(super) fn suggest(account: &GpuAccount, gpu: u32) -> Suggestion {
    let look = |seconds: u64| Command::look(gpu, Some(seconds), false);
    let pids = |targets: &[KillTarget]| targets.iter().map(|target| target.pid).collect::<Vec<_>>();
    // Culprits are named only where memory is orphaned; a kill that waits is theirs then,
    // else the owners'.
    let culprits_named = !account.culprits.is_empty();
    let (advice, commands, then, wait) = match &account.remedy {
        Remedy::None => (Advice::None, vec![], None, None),
        Remedy::Kill { targets } => (
            Advice::Kill {
                targets: targets.clone(),
            },
            vec![Command::kill(pids(targets))],
            Some(look(AFTER_ACTING_WAIT_SECONDS)),
            Some(AFTER_ACTING_WAIT_SECONDS),
        ),
        Remedy::CancelJobs { jobs, targets } => {
            let mut commands = vec![Command::scancel(jobs.iter().map(|job| job.job_id))];
            if !targets.is_empty() {
                commands.push(Command::kill(pids(targets)));
            }
            (
                Advice::CancelJobs {
                    jobs: jobs.clone(),
                    targets: targets.clone(),
                },
                commands,
                Some(look(AFTER_ACTING_WAIT_SECONDS)),
                Some(AFTER_ACTING_WAIT_SECONDS),
            )
        }
        Remedy::Wait => {
            let (advice, seconds) = if account.finding == Finding::BeingFreed {
                (Advice::WaitWhileFreed, FREEING_WAIT_SECONDS)
            } else if culprits_named {
                (Advice::WaitForKilledCulprits, STUCK_WAIT_SECONDS)
            } else {
                (Advice::WaitForKilledOwners, STUCK_WAIT_SECONDS)
            };
            (advice, vec![look(seconds)], None, Some(seconds))
        }
        Remedy::KillLeftBehind { targets } => (
            Advice::KillLeftBehind {
                targets: targets.clone(),
            },
            vec![Command::kill(pids(targets))],
            Some(look(AFTER_ACTING_WAIT_SECONDS)),
            Some(AFTER_ACTING_WAIT_SECONDS),
        ),
        Remedy::ResetOrReboot { stuck } => {
            let stuck = stuck.clone();
            let advice = if culprits_named {
                Advice::ResetOrRebootForCulprits { stuck }
            } else {
                Advice::ResetOrRebootForOwners { stuck }
            };
            (advice, vec![Command::reset_gpu(gpu)], None, None)
        }
        Remedy::RestartMps {
            servers,
            daemons,
            clients,
        } => (
            Advice::RestartMps {
                servers: servers.clone(),
                daemons: daemons.clone(),
                clients: clients.clone(),
            },
            vec![Command::quit_mps(), Command::start_mps()],
            Some(look(AFTER_ACTING_WAIT_SECONDS)),
            Some(AFTER_ACTING_WAIT_SECONDS),
        ),
        Remedy::StopOwners { pids } => (
            Advice::StopOwners { pids: pids.clone() },
            vec![],
            Some(look(STUCK_WAIT_SECONDS)),
            Some(STUCK_WAIT_SECONDS),
        ),
        Remedy::ResetGpu { blockers } if blockers.is_empty() => (
            Advice::ResetUnheld,
            vec![Command::reset_gpu(gpu)],
            None,
            None,
        ),
        Remedy::ResetGpu { blockers } => (
            Advice::ResetOnceClientsStop {
                blockers: blockers.clone(),
            },
            vec![Command::reset_gpu(gpu)],
            None,
            None,
        ),
        Remedy::Reboot => (Advice::Reboot, vec![Command::reboot()], None, None),
        Remedy::CannotTell {
            reason: reason @ Blindness::WorkersNotVisible,
        } => (
            Advice::WorkersUnreachable { reason: *reason },
            vec![],
            None,
            None,
        ),
        Remedy::CannotTell { reason } => (
            Advice::CannotTell { reason: *reason },
            reason
                .look_again()
                .map(|how| Command::look(gpu, None, how == LookAgain::AsRoot))
                .into_iter()
                .collect(),
            None,
            None,
        ),
    };
    Suggestion {
        advice,
        commands,
        then,
        wait_seconds: wait,
    }
}

/// What frees the memory of processes killed and stuck in the driver: waiting, until
/// the kill has waited [`KILL_STUCK_SECONDS`](super::KILL_STUCK_SECONDS); then a GPU reset or a reboot.
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
pub(super) fn scan_blindness(scan: Option<ScanSummary>) -> Option<Blindness> {
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
