//! What would give the memory back, decided from a finished account: the action, with
//! the processes, jobs or daemons it concerns.

use super::after_kill::{self};
use super::{
    slurm, Evidence, Finding, GpuAccount, JobToCancel, Owner, Process, RecoveryAction, ScanSummary,
    Started,
};
use serde::Serialize;

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

/// A culprit to end, by identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KillTarget {
    /// Its PID here.
    pub pid: u32,
    /// Its start time in clock ticks after boot: a PID names it only with this.
    pub start_time_ticks: u64,
    /// When it started, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    /// When it started, as the verdict says it (JSON has both figures above).
    #[serde(skip)]
    pub started: Started,
    /// Command name.
    pub comm: String,
}

impl KillTarget {
    /// A process to end, by identity.
    pub fn of(process: &Process) -> KillTarget {
        KillTarget {
            pid: process.pid,
            start_time_ticks: process.start_time_ticks,
            started_unix_seconds: process.started_unix_seconds,
            started: process.started,
            comm: process.comm.clone(),
        }
    }
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
        let (jobs, targets) = slurm::jobs_to_cancel(&culprits);
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
