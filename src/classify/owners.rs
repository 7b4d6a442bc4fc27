//! Who owns a GPU's memory: the verdict on each process NVML charges, by identity (PID
//! and start time) and by evidence of a context (shared mappings of the GPU's device file).

use super::{Process, ProcessState};
use crate::observe::{
    Identity, NamespaceInit, NvmlProcess, OwnerLookup, ProcessFacts, ProcessLookup, ProcfsView,
};
use serde::Serialize;

/// Where an owner of GPU memory stands; the `state` label of the owner series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerState {
    /// Alive and schedulable: running, sleeping or idle (`R`, `S`, `I`).
    Running,
    /// Stopped by a signal or a tracer (`T`, `t`).
    Stopped,
    /// In uninterruptible sleep (`D`), typically inside the driver.
    Uninterruptible,
    /// Main thread is a zombie while other threads still hold the context.
    Zombie,
    /// No live process holds the context: it exited, or the PID now names another process.
    Gone,
    /// Exists but `/proc` would not tell enough to decide.
    Unknown,
}

impl OwnerState {
    /// Every state, in the order metrics list them.
    pub const ALL: [OwnerState; 6] = [
        OwnerState::Running,
        OwnerState::Stopped,
        OwnerState::Uninterruptible,
        OwnerState::Zombie,
        OwnerState::Gone,
        OwnerState::Unknown,
    ];

    /// The label value used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerState::Running => "running",
            OwnerState::Stopped => "stopped",
            OwnerState::Uninterruptible => "uninterruptible",
            OwnerState::Zombie => "zombie",
            OwnerState::Gone => "gone",
            OwnerState::Unknown => "unknown",
        }
    }

    /// Whether an owner in this state keeps its memory (neither gone nor unknown).
    pub fn is_live(self) -> bool {
        !matches!(self, OwnerState::Gone | OwnerState::Unknown)
    }
}

/// Why an owner is gone or unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum OwnerDetail {
    /// Gone: no process has the PID.
    Exited,
    /// Gone: the process is a zombie with no threads or mappings left; its memory is being
    /// freed (0.13-0.18 s after a SIGKILL, measured on an H200).
    Exiting,
    /// Gone: the PID names another process now, which has no context on this GPU (or has
    /// a start time other than the owner's).
    Reused {
        /// The process that has the PID now.
        by: Box<Process>,
    },
    /// Unknown: its `/proc` entry exists but cannot be read.
    Unreadable {
        /// The error, in one line.
        error: String,
    },
    /// Unknown: the procfs read shows another PID namespace, without this PID of ours.
    NotVisible,
    /// Unknown: its mappings cannot be read, so whether it holds a context here cannot be
    /// told (root, or CAP_SYS_PTRACE, is needed for another user's).
    ContextUnreadable,
    /// Unknown: NVML did not say which device node the GPU is, so no mapping can prove a
    /// context on it.
    NoDeviceNode,
}

impl OwnerDetail {
    /// The `reason` label of a gone owner, `None` for the details of unknown owners.
    pub fn gone_reason(&self) -> Option<GoneReason> {
        match self {
            OwnerDetail::Exited | OwnerDetail::Exiting => Some(GoneReason::Exited),
            OwnerDetail::Reused { .. } => Some(GoneReason::Reused),
            OwnerDetail::Unreadable { .. }
            | OwnerDetail::NotVisible
            | OwnerDetail::ContextUnreadable
            | OwnerDetail::NoDeviceNode => None,
        }
    }
}

/// Why an owner is gone, as an alert tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GoneReason {
    /// The process exited.
    Exited,
    /// Its PID names another process now: without the start time, a scan by PID would
    /// have called the owner live.
    Reused,
}

impl GoneReason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [GoneReason; 2] = [GoneReason::Exited, GoneReason::Reused];

    /// The label value used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            GoneReason::Exited => "exited",
            GoneReason::Reused => "reused",
        }
    }
}

/// One process NVML charges memory to, with its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Process id as NVML reports it (ours: the driver translates PIDs into our namespace).
    pub pid: u32,
    /// The verdict.
    pub state: OwnerState,
    /// Why it is gone or unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<OwnerDetail>,
    /// Bytes NVML charges it (never more than the GPU has), `None` when NVML cannot say.
    pub used_bytes: Option<u64>,
    /// The live process that owns the memory, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<Box<Process>>,
    /// The process the exporter first saw under this PID, when it saw one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<Identity>,
    /// It is alive although its container has ended (PID 1 of its PID namespace exited).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub container_exited: bool,
}

impl Owner {
    /// Its command name, when it is alive.
    pub fn comm(&self) -> Option<&str> {
        self.process.as_ref().map(|process| process.comm.as_str())
    }
}

/// The verdict on one listed process on the GPU whose node has minor number `minor`.
///
/// The rules, in order:
/// - no process under the PID: gone (exited);
/// - a zombie with no live thread and nothing mapped: gone (exiting, memory being freed);
/// - a process that maps this GPU's node holds a context here: live, in its state;
/// - a process whose start time differs from the owner first seen under the PID, or
///   which maps nothing of this GPU: gone (reused), whatever it is;
/// - mappings that cannot be read, a procfs that cannot show the PID, a GPU without a
///   known node: unknown, never gone.
///
/// An MPS client's context lives in the MPS server, so for a PID listed only as one the
/// start time alone decides.
pub fn judge_owner(
    process: &NvmlProcess,
    lookup: Option<&OwnerLookup>,
    minor: Option<u32>,
    frame: &Frame,
) -> Owner {
    let mut owner = Owner {
        pid: process.pid,
        state: OwnerState::Gone,
        detail: Some(OwnerDetail::Exited),
        used_bytes: process.used_bytes,
        process: None,
        first_seen: None,
        container_exited: false,
    };
    let Some(lookup) = lookup else {
        return owner;
    };
    owner.first_seen = lookup.first_seen.clone();
    let facts = match &lookup.now {
        ProcessLookup::Missing => return owner,
        ProcessLookup::Unreadable { error } => {
            return unknown(
                owner,
                OwnerDetail::Unreadable {
                    error: error.clone(),
                },
            )
        }
        ProcessLookup::NotVisible => return unknown(owner, OwnerDetail::NotVisible),
        ProcessLookup::Present(facts) => facts,
    };
    if matches!(facts.state, 'X' | 'x') || exiting(facts) {
        owner.detail = Some(if facts.state == 'Z' {
            OwnerDetail::Exiting
        } else {
            OwnerDetail::Exited
        });
        return owner;
    }
    let same_process = lookup
        .first_seen
        .as_ref()
        .is_none_or(|first| first.start_time_ticks == facts.start_time_ticks);
    let context = match (minor, process.mps_only) {
        (_, true) => Context::Unprovable,
        (None, false) => Context::Unknown(OwnerDetail::NoDeviceNode),
        (Some(minor), false) => match facts.mappings.nodes() {
            Some(nodes) if nodes.gpus.contains(&minor) => Context::Here,
            Some(_) => Context::Absent,
            None => Context::Unknown(OwnerDetail::ContextUnreadable),
        },
    };
    match (context, same_process) {
        // A process with a context here owns what NVML charges to its PID, even one that
        // is not the process first seen under it (the first exited and freed its memory,
        // and a new CUDA process got the number before a scrape saw the gap).
        (Context::Here, _) | (Context::Unprovable, true) => {
            owner.state = ProcessState::from_letter(facts.state).owner_state();
            owner.detail = None;
            owner.container_exited = NamespaceInit::exited(facts.pid_namespace_init);
            owner.process = Some(Box::new(Process::new(facts, frame)));
        }
        (Context::Absent | Context::Unprovable, _) | (Context::Unknown(_), false) => {
            owner.detail = Some(OwnerDetail::Reused {
                by: Box::new(Process::new(facts, frame)),
            });
        }
        (Context::Unknown(detail), true) => return unknown(owner, detail),
    }
    owner
}

/// What the mappings of the process under an owner's PID say about a context on the GPU.
enum Context {
    /// It maps the GPU's node.
    Here,
    /// Its mappings were read and name nothing of the GPU.
    Absent,
    /// Mappings cannot prove it either way (an MPS client's context is the server's).
    Unprovable,
    /// Cannot be told, for this reason.
    Unknown(OwnerDetail),
}

fn unknown(mut owner: Owner, detail: OwnerDetail) -> Owner {
    owner.state = OwnerState::Unknown;
    owner.detail = Some(detail);
    owner
}

/// A process that has finished exiting but for its reaping: a zombie main thread with no
/// other thread and an address space already gone.
fn exiting(facts: &ProcessFacts) -> bool {
    facts.state == 'Z'
        && facts.threads <= 1
        && facts.mappings.nodes().is_some_and(|nodes| nodes.is_empty())
}

/// How the observation's raw numbers read where the verdict is given: start times in
/// clock ticks after boot become dates, the procfs's PIDs become ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// When the host booted, in seconds since the Unix epoch.
    pub boot_time_unix_seconds: Option<u64>,
    /// Clock ticks per second of start times.
    pub ticks_per_second: u64,
    /// Whether the procfs read shows our PID namespace.
    pub procfs_view: ProcfsView,
}

impl Frame {
    /// When a process that started `ticks` after boot started, in seconds since the epoch.
    pub fn started(&self, ticks: u64) -> Option<u64> {
        let boot = self.boot_time_unix_seconds?;
        Some(boot + ticks / self.ticks_per_second.max(1))
    }
}
