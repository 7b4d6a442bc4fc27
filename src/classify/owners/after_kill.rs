//! After a kill: which live owners a killed server left behind, and which owners were
//! killed but are stuck in the driver. The other two branches of the story are decided
//! elsewhere: an owner in its exit path is `exiting` ([`super`]), and memory no
//! process holds is orphaned.
//!
//! A worker whose server was killed lives on, adopted by PID 1 or a subreaper, and holds
//! its memory for nobody. The exporter knows it for sure when it saw the parent alive
//! (by PID and start time) and then gone; `check` and a restarted exporter know it from
//! the witness state such an exporter keeps. A look that never saw the parent has only
//! the process's scope to go by, and says "possibly" where that scope is one no service
//! meant to run alone has: a worker spawned by Python's `multiprocessing` (by its
//! command line, or by its pipes to a parent that is gone), or a member of a shell job,
//! whose group's leader has exited and whose parent adopted it; never a task of a Slurm
//! step that runs.

use super::Owner;
use crate::classify::processes::slurm::JobState;
use crate::classify::processes::{Process, ProcessLens, Started};
use crate::observe::Leader;
use serde::Serialize;

/// How long a kill may wait in uninterruptible sleep before it is called stuck: past it,
/// another kill does nothing, and only a GPU reset or a reboot gives the memory back. A
/// call into the driver that outlasts this has hung (the H200's kills completed in under
/// 0.2 s).
pub const KILL_STUCK_SECONDS: u64 = 60;

/// A live owner that its server left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftBehindOwner {
    /// The owner.
    pub process: Process,
    /// Bytes NVML charges it on this GPU, when it can say.
    pub used_bytes: Option<u64>,
    /// How it is known to be left behind.
    pub seen: Seen,
}

/// How a left-behind owner is known to be one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "certainty", rename_all = "snake_case")]
pub enum Seen {
    /// The exporter saw its parent alive and then gone.
    ParentExited {
        /// The parent, as first seen.
        parent: Parent,
        /// When its exit was seen, in seconds since the Unix epoch.
        exit_seen_unix_seconds: u64,
        /// How long the owner has lived without it, when the look's time is known.
        #[serde(skip_serializing_if = "Option::is_none")]
        alone_seconds: Option<u64>,
    },
    /// The exporter never saw the parent: the owner's scope says it was probably a
    /// worker of a process that has exited.
    Possibly {
        /// The process group whose leader (the process that started the job, or the
        /// server) has exited; its PID is the group's id.
        group_leader: u32,
        /// The process that adopted it.
        adopted_by: u32,
        /// Its command name, when read.
        #[serde(skip_serializing_if = "Option::is_none")]
        adopted_by_comm: Option<String>,
        /// What else its scope says.
        clue: Clue,
    },
}

/// A left-behind owner's parent as first seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parent {
    /// Its PID.
    pub pid: u32,
    /// Its command name, when read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// When it started, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    /// When it started, as the verdict says it.
    #[serde(skip)]
    pub started: Option<Started>,
}

/// What an owner's scope says of a parent the exporter never saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Clue {
    /// Its command line is a Python `multiprocessing` child's: never meant to run
    /// without the process that spawned it.
    SpawnedWorker,
    /// Its pipes to the process that started it lead nowhere: it holds one it reads and
    /// one it writes, beyond its standard streams, whose other ends no process outside
    /// its group holds, as a `multiprocessing` worker's do once its server is gone (also
    /// one whose title `setproctitle` rewrote, or forked with its server's command line).
    PipesToParentClosed,
    /// It is in a job of a shell (a process group other than its session) whose leader
    /// has exited.
    JobLeaderGone,
}

impl Seen {
    /// Whether the exporter saw the parent exit (the figure the series count).
    pub fn witnessed(&self) -> bool {
        matches!(self, Seen::ParentExited { .. })
    }

    /// The parent seen to exit, and when its exit was seen, for a witnessed owner.
    pub fn parent_exit(&self) -> Option<(&Parent, u64)> {
        match self {
            Seen::ParentExited {
                parent,
                exit_seen_unix_seconds,
                ..
            } => Some((parent, *exit_seen_unix_seconds)),
            Seen::Possibly { .. } => None,
        }
    }
}

/// Whether a live owner was left behind by the process that started it, and how that is
/// known; `None` for every process not proven or likely left behind. Never one whose
/// container or Slurm job ended (those have verdicts of their own), nor one that leads
/// its own process group (a service, a daemon, a container's main process).
pub fn left_behind(owner: &Owner, lens: &ProcessLens, taken_at: Option<u64>) -> Option<Seen> {
    let process = owner.process()?;
    let lineage = process.lineage.as_ref()?;
    // A process that leads its own process group (or session) detached itself from
    // whoever started it: a service, a daemon, a container's main process, meant to run
    // alone whatever became of its launcher. A server's worker stays in its group.
    let ended = process
        .slurm_job
        .as_ref()
        .is_some_and(|job| matches!(job.state, JobState::StepEnded | JobState::Ended));
    if process.pgid == process.pid || process.container_ended() || ended {
        return None;
    }
    if let Some(exit_seen) = lineage.parent_exit_seen_unix_seconds {
        return Some(Seen::ParentExited {
            parent: Parent {
                pid: lineage.parent.pid,
                comm: lineage.parent.comm.clone(),
                started_unix_seconds: lineage
                    .parent
                    .start_time_ticks
                    .and_then(|ticks| lens.started(ticks)),
                started: lineage
                    .parent
                    .start_time_ticks
                    .map(|ticks| lens.start(ticks)),
            },
            exit_seen_unix_seconds: exit_seen,
            alone_seconds: taken_at.map(|now| now.saturating_sub(exit_seen)),
        });
    }
    // Seen only after its parent was gone: a member of a group whose leader has exited,
    // adopted by a parent outside that group (an adopter is an ancestor of the dead
    // leader, never in its group). A double-forked daemon's group is its session; a
    // service leads its own.
    let adopted = lineage.group_leader == Leader::Gone
        && lineage
            .parent
            .pgid
            .is_some_and(|parent_group| parent_group != process.pgid);
    if !adopted {
        return None;
    }
    // A task of a Slurm job step that runs is the job's, whatever became of its launcher.
    if process
        .slurm_job
        .as_ref()
        .is_some_and(|job| job.state == JobState::Running)
    {
        return None;
    }
    let clue = if lineage.spawned_worker {
        Clue::SpawnedWorker
    } else if lineage.pipes_to_parent_closed {
        Clue::PipesToParentClosed
    } else if process.pgid != process.sid {
        Clue::JobLeaderGone
    } else {
        return None;
    };
    Some(Seen::Possibly {
        group_leader: process.pgid,
        adopted_by: lineage.parent.pid,
        adopted_by_comm: lineage.parent.comm.clone(),
        clue,
    })
    .filter(|_| process.ppid == lineage.parent.pid)
}

/// A live owner placed as a killed server's worker is (its group's leader has exited, and
/// a process outside the group adopted it) that shows no clue of being one: whether a
/// server was killed under it, only an exporter that watched could tell. Never one that
/// leads its group, whose container or Slurm job ended, or that runs in a Slurm job.
pub fn unwatched(owner: &Owner) -> Option<Unwatched> {
    let process = owner.process()?;
    let lineage = process.lineage.as_ref()?;
    let adopted = lineage.group_leader == Leader::Gone
        && lineage.parent_exit_seen_unix_seconds.is_none()
        && process.ppid == lineage.parent.pid
        && lineage
            .parent
            .pgid
            .is_some_and(|parent_group| parent_group != process.pgid);
    (adopted
        && process.pgid != process.pid
        && !process.container_ended()
        && process.slurm_job.is_none())
    .then(|| Unwatched {
        pid: owner.pid,
        comm: process.comm.clone(),
        group_leader: process.pgid,
        adopted_by: lineage.parent.pid,
    })
}

/// An owner that only a watching exporter could have told left behind or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unwatched {
    /// Its PID.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its process group's leader, which has exited.
    pub group_leader: u32,
    /// The process that adopted it.
    pub adopted_by: u32,
}

/// How a killed owner or culprit stands: its kill waits in the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KilledStuck {
    /// Since when the kill has been seen pending, in seconds since the Unix epoch.
    pub since_unix_seconds: u64,
    /// How long, when the look's time is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
    /// Past [`KILL_STUCK_SECONDS`]: another kill cannot end it.
    pub past_hope: bool,
}

/// A killed process's wait, when it is killed and waits.
pub fn killed_stuck(process: &Process, taken_at: Option<u64>) -> Option<KilledStuck> {
    if !process.killed() {
        return None;
    }
    let since = process.kill_pending_since_unix_seconds?;
    let seconds = taken_at.map(|now| now.saturating_sub(since));
    Some(KilledStuck {
        since_unix_seconds: since,
        seconds,
        past_hope: seconds.is_some_and(|seconds| seconds >= KILL_STUCK_SECONDS),
    })
}
