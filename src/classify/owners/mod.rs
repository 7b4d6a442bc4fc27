//! Who owns a GPU's memory: the verdict on each process NVML charges, by identity (PID
//! and start time) and by evidence of a context (read-write shared mappings of the GPU's
//! device file).

pub mod after_kill;

use crate::classify::processes::{Process, ProcessLens, ProcessState};
use crate::observe::{Identity, NvmlLists, NvmlProcess, OwnerLookup, ProcessFacts, ProcessLookup};
use serde::{Serialize, Serializer};
use strum::{EnumCount, IntoStaticStr, VariantArray};

/// How long the driver took to free a killed owner's memory where it was measured: on an
/// H100 and an H200, 2 GiB to 70 GiB each freed within this (the project's GPU facts).
/// The one figure every verdict and document quotes.
pub const FREEING_MEASURED: &str = "0.12-0.20 s after a SIGKILL on an H100 or H200";

/// The longest an owner is called "being freed" after every thread of it was seen to
/// have exited while NVML still charges its memory: ten times the slowest free measured
/// (0.20 s, for 70 GiB), so that no free in progress is called orphaned, and far inside
/// the two minutes the orphan alert holds for. Past it the memory is kept by whoever
/// keeps the owner's device file (a child it forked), and the owner is gone: a parent
/// that has not reaped it holds nothing of the GPU.
pub const ENDING_AT_MOST_MILLIS: u64 = 2_000;

/// Where an owner of GPU memory stands, as a word: the `state` label of the owner series
/// and of `check --json`. [`Standing`] holds what each word rests on.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    IntoStaticStr,
    VariantArray,
    EnumCount,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum OwnerState {
    /// Alive and schedulable: running, sleeping or idle (`R`, `S`, `I`).
    Running,
    /// Stopped by a signal or a tracer (`T`, `t`).
    Stopped,
    /// In uninterruptible sleep (`D`), typically inside the driver.
    Uninterruptible,
    /// Main thread is a zombie while other threads still hold the context.
    Zombie,
    /// Killed (SIGKILL pending) but in uninterruptible sleep, typically inside the driver:
    /// the kill waits until the call returns, and its memory with it.
    Killed,
    /// In its exit path: the kernel is closing its files and the driver is freeing its
    /// memory (see [`FREEING_MEASURED`]), for at most
    /// [`ENDING_AT_MOST_MILLIS`] once every thread has exited.
    Exiting,
    /// No live process holds the context: it exited, or the PID now names another process.
    Gone,
    /// Exists but `/proc` would not tell enough to decide.
    Unknown,
}

impl OwnerState {
    /// The label value used in metrics and JSON (the serde name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether an owner in this state keeps its memory (neither exiting, gone nor unknown).
    pub fn is_live(self) -> bool {
        !matches!(
            self,
            OwnerState::Exiting | OwnerState::Gone | OwnerState::Unknown
        )
    }
}

/// The verdict on an owner with what it rests on: a live owner is its process, a gone
/// one says how it went, an unknown one why it cannot be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A live process holds its context here; its state is the process's.
    Live(Box<Process>),
    /// The process is in its exit path (a SIGKILL delivered, or an exit): the driver is
    /// freeing its memory. Neither live nor orphaned.
    Exiting(Box<Process>),
    /// No live process holds its context any more.
    Gone(WhyGone),
    /// It cannot be judged: never counted as gone.
    Unknown(WhyUnknown),
}

/// How an owner went; `detail` of a gone owner in `check --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WhyGone {
    /// No process has the PID.
    Exited,
    /// The PID names another process now, which has no context on this GPU (or has a
    /// start time other than the owner's).
    Reused {
        /// The process that has the PID now.
        by: Box<Process>,
    },
}

impl WhyGone {
    /// The `reason` label of the gone owner series.
    pub fn reason(&self) -> GoneReason {
        match self {
            WhyGone::Exited => GoneReason::Exited,
            WhyGone::Reused { .. } => GoneReason::Reused,
        }
    }
}

/// Why an owner cannot be judged; `detail` of an unknown owner in `check --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WhyUnknown {
    /// Its `/proc` entry exists but cannot be read.
    Unreadable {
        /// The error, in one line.
        error: String,
    },
    /// The procfs read shows another PID namespace, without this PID of ours.
    NotVisible,
    /// Its mappings cannot be read, so whether it holds a context here cannot be told
    /// (root, or CAP_SYS_PTRACE, is needed for another user's).
    ContextUnreadable,
    /// NVML did not say which device node the GPU is, so no mapping can prove a context
    /// on it.
    NoDeviceNode,
}

/// Why an owner is gone, as an alert tells it: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, VariantArray, EnumCount)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum GoneReason {
    /// The process exited.
    Exited,
    /// Its PID names another process now: without the start time, a scan by PID would
    /// have called the owner live.
    Reused,
}

impl GoneReason {
    /// The label value used in metrics (the serde name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What the owner table says after an owner's state word, in parentheses: `running
/// (sleeping)`, `gone (reused)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateQualifier {
    /// The process's own state, where its word is not the state's (sleeping, idle, ...).
    Process(ProcessState),
    /// The PID names another process now.
    Reused,
}

/// One process NVML charges memory to, with its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Process id as NVML reports it (ours: the driver translates PIDs into our namespace).
    pub pid: u32,
    /// The verdict, with what it rests on.
    pub standing: Standing,
    /// Bytes NVML charges it (never more than the GPU has), `None` when NVML cannot say.
    pub used_bytes: Option<u64>,
    /// The process the exporter first saw under this PID, when it saw one.
    pub first_seen: Option<Identity>,
    /// Which of NVML's lists of the GPU name it (none known in snapshots of older
    /// versions): under MPS a client is on the compute and MPS lists, the server on the
    /// compute list alone. Not in `check --json`'s owners, whose keys scripts read as they
    /// were; the MPS server's evidence says its lists.
    pub lists: NvmlLists,
}

impl Owner {
    /// The verdict as a word: a live owner's is its process's, or `killed` while a kill
    /// waits in uninterruptible sleep.
    pub fn state(&self) -> OwnerState {
        match &self.standing {
            Standing::Live(process) if process.killed() => OwnerState::Killed,
            Standing::Live(process) => process.state.owner_state(),
            Standing::Exiting(_) => OwnerState::Exiting,
            Standing::Gone(_) => OwnerState::Gone,
            Standing::Unknown(_) => OwnerState::Unknown,
        }
    }

    /// The live process that owns the memory, when there is one.
    pub fn process(&self) -> Option<&Process> {
        match &self.standing {
            Standing::Live(process) => Some(process),
            Standing::Exiting(_) | Standing::Gone(_) | Standing::Unknown(_) => None,
        }
    }

    /// The process freeing its memory, when the owner is exiting.
    pub fn exiting(&self) -> Option<&Process> {
        match &self.standing {
            Standing::Exiting(process) => Some(process),
            Standing::Live(_) | Standing::Gone(_) | Standing::Unknown(_) => None,
        }
    }

    /// How it went, when it is gone.
    pub fn gone(&self) -> Option<&WhyGone> {
        match &self.standing {
            Standing::Gone(why) => Some(why),
            Standing::Live(_) | Standing::Exiting(_) | Standing::Unknown(_) => None,
        }
    }

    /// Its command name, when it is alive.
    pub fn comm(&self) -> Option<&str> {
        self.process().map(|process| process.comm.as_str())
    }

    /// It is alive although its container has ended (PID 1 of its PID namespace exited).
    pub fn container_ended(&self) -> bool {
        self.process().is_some_and(Process::container_ended)
    }

    /// What the owner table adds to its state word: ps's word where it says more (the
    /// `running` label covers sleeping and idle), or how a gone owner went where that is
    /// not plain exiting.
    pub fn state_qualifier(&self) -> Option<StateQualifier> {
        match &self.standing {
            Standing::Live(process) => match process.state {
                // The label is ps's own word.
                ProcessState::Running | ProcessState::Stopped | ProcessState::Zombie => None,
                ProcessState::Sleeping
                | ProcessState::Idle
                | ProcessState::TracingStop
                | ProcessState::DiskSleep
                | ProcessState::Dead => Some(StateQualifier::Process(process.state)),
            },
            Standing::Gone(WhyGone::Reused { .. }) => Some(StateQualifier::Reused),
            Standing::Exiting(_) | Standing::Gone(WhyGone::Exited) | Standing::Unknown(_) => None,
        }
    }
}

/// An owner in `check --json`: its standing as a `state` word with a `detail` beside it,
/// and `container_exited` said of a live owner, as scripts have read them.
impl Serialize for Owner {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The detail of a gone or unknown owner, tagged by `reason` either way.
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Detail<'a> {
            Gone(&'a WhyGone),
            Unknown(&'a WhyUnknown),
        }

        #[derive(Serialize)]
        struct OwnerJson<'a> {
            pid: u32,
            state: OwnerState,
            #[serde(skip_serializing_if = "Option::is_none")]
            detail: Option<Detail<'a>>,
            used_bytes: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            process: Option<&'a Process>,
            #[serde(skip_serializing_if = "Option::is_none")]
            first_seen: Option<&'a Identity>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            container_exited: bool,
        }

        OwnerJson {
            pid: self.pid,
            state: self.state(),
            detail: match &self.standing {
                Standing::Live(_) | Standing::Exiting(_) => None,
                Standing::Gone(why) => Some(Detail::Gone(why)),
                Standing::Unknown(why) => Some(Detail::Unknown(why)),
            },
            used_bytes: self.used_bytes,
            process: self.process().or(self.exiting()),
            first_seen: self.first_seen.as_ref(),
            container_exited: self.container_ended(),
        }
        .serialize(serializer)
    }
}

/// The verdict on one listed process on the GPU whose node has minor number `minor`.
///
/// The rules, in order:
/// - no process under the PID: gone (exited);
/// - the process first seen under the PID, in its exit path (its main thread exiting and
///   not yet a zombie, or a zombie with no live thread and nothing mapped): exiting, its
///   memory being freed; but gone once it has been a zombie with no live thread for
///   longer than a free takes ([`ENDING_AT_MOST_MILLIS`]): whoever inherited its device
///   file keeps the memory, not it;
/// - a process that maps this GPU's node read-write holds a context here: live, in its
///   state (one that maps it only write-only or read-only initialised the driver without
///   a context, as the MPS control daemon does);
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
    lens: &ProcessLens,
) -> Owner {
    let first_seen = lookup.and_then(|lookup| lookup.first_seen.clone());
    Owner {
        pid: process.pid,
        standing: standing(process, lookup, minor, lens),
        used_bytes: process.used_bytes,
        first_seen,
        lists: process.lists,
    }
}

fn standing(
    process: &NvmlProcess,
    lookup: Option<&OwnerLookup>,
    minor: Option<u32>,
    lens: &ProcessLens,
) -> Standing {
    let Some(lookup) = lookup else {
        return Standing::Gone(WhyGone::Exited);
    };
    let facts = match &lookup.now {
        ProcessLookup::Missing => return Standing::Gone(WhyGone::Exited),
        ProcessLookup::Unreadable { error } => {
            return Standing::Unknown(WhyUnknown::Unreadable {
                error: error.clone(),
            })
        }
        ProcessLookup::NotVisible => return Standing::Unknown(WhyUnknown::NotVisible),
        ProcessLookup::Present(facts) => facts,
    };
    if matches!(facts.state, 'X' | 'x') {
        return Standing::Gone(WhyGone::Exited);
    }
    let same_process = lookup
        .first_seen
        .as_ref()
        .is_none_or(|first| first.start_time_ticks == facts.start_time_ticks);
    if facts.ending() {
        return if same_process && !ended_too_long_ago(facts, lens) {
            Standing::Exiting(Box::new(Process::new(facts, lens)))
        } else {
            Standing::Gone(WhyGone::Exited)
        };
    }
    let context = match (minor, process.mps_only) {
        (_, true) => Context::Unprovable,
        (None, false) => Context::Unknown(WhyUnknown::NoDeviceNode),
        (Some(minor), false) => match facts.mappings.nodes() {
            Some(nodes) if nodes.maps_gpu_read_write(minor) => Context::Here,
            Some(_) => Context::Absent,
            None => Context::Unknown(WhyUnknown::ContextUnreadable),
        },
    };
    match (context, same_process) {
        // A process with a context here owns what NVML charges to its PID, even one that
        // is not the process first seen under it (the first exited and freed its memory,
        // and a new CUDA process got the number before a scrape saw the gap).
        (Context::Here, _) | (Context::Unprovable, true) => {
            Standing::Live(Box::new(Process::new(facts, lens)))
        }
        (Context::Absent | Context::Unprovable, _) | (Context::Unknown(_), false) => {
            Standing::Gone(WhyGone::Reused {
                by: Box::new(Process::new(facts, lens)),
            })
        }
        (Context::Unknown(why), true) => Standing::Unknown(why),
    }
}

/// What the mappings of the process under an owner's PID say about a context on the GPU.
enum Context {
    /// It maps the GPU's node read-write.
    Here,
    /// Its mappings were read and show no read-write mapping of the GPU's node.
    Absent,
    /// Mappings cannot prove it either way (an MPS client's context is the server's).
    Unprovable,
    /// Cannot be told, for this reason.
    Unknown(WhyUnknown),
}

/// Whether an ending owner is past being freed: every thread of it has exited (a zombie
/// its parent has not reaped) more than [`ENDING_AT_MOST_MILLIS`] ago, while NVML still
/// charges its memory. The driver frees a context with the last reference to its device
/// file, so what keeps the memory now is a process that inherited that file, and the
/// owner itself is gone. An owner whose threads are still in their exit path is being
/// freed for as long as they are.
fn ended_too_long_ago(facts: &ProcessFacts, lens: &ProcessLens) -> bool {
    facts.finished()
        && lens
            .millis_since(facts.ending_since_unix_millis)
            .is_some_and(|millis| millis > ENDING_AT_MOST_MILLIS)
}

impl ProcessState {
    /// The coarse state of the `state` label: running covers running, sleeping and idle.
    pub fn owner_state(self) -> OwnerState {
        match self {
            ProcessState::Running | ProcessState::Sleeping | ProcessState::Idle => {
                OwnerState::Running
            }
            ProcessState::Stopped | ProcessState::TracingStop => OwnerState::Stopped,
            ProcessState::DiskSleep => OwnerState::Uninterruptible,
            ProcessState::Zombie => OwnerState::Zombie,
            ProcessState::Dead => OwnerState::Gone,
        }
    }
}
