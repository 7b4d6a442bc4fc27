//! A process as the verdict names it: its state in `ps`'s words and everything read of
//! it, with its start time so that a PID is never taken for another process; the lens
//! through which its raw numbers read (dates, PIDs, containers, jobs); and a process to
//! end, by identity.

pub mod pods;
pub mod slurm;

use crate::observe::containers::ContainerName;
use crate::observe::containers::ContainersReading;
use crate::observe::kubernetes::PodName;
use crate::observe::{
    CgroupAttribution, Lineage, NamespaceInit, ProcessFacts, ProcfsView, References, SlurmReading,
    Witnessed,
};
use pods::KubernetesView;
use serde::Serialize;
use slurm::SlurmJob;

/// A process's state as `ps` names it; [`ProcessState::owner_state`] is the coarser
/// word the series use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// `R`
    Running,
    /// `S`
    Sleeping,
    /// `I`: an idle kernel thread.
    Idle,
    /// `T`: stopped by a signal.
    Stopped,
    /// `t`: stopped by a tracer.
    TracingStop,
    /// `D`: uninterruptible sleep, typically inside the driver.
    DiskSleep,
    /// `Z`: the main thread exited.
    Zombie,
    /// `X`: being reaped.
    Dead,
}

impl ProcessState {
    /// The state of a stat letter; letters of older kernels count as running.
    pub fn from_letter(letter: char) -> ProcessState {
        match letter {
            'S' => ProcessState::Sleeping,
            'I' => ProcessState::Idle,
            'T' => ProcessState::Stopped,
            't' => ProcessState::TracingStop,
            'D' => ProcessState::DiskSleep,
            'Z' => ProcessState::Zombie,
            'X' | 'x' => ProcessState::Dead,
            _ => ProcessState::Running,
        }
    }

    /// The words `ps` users know.
    pub fn words(self) -> &'static str {
        match self {
            ProcessState::Running => "running",
            ProcessState::Sleeping => "sleeping",
            ProcessState::Idle => "idle",
            ProcessState::Stopped => "stopped",
            ProcessState::TracingStop => "stopped by a tracer",
            ProcessState::DiskSleep => "in uninterruptible sleep",
            ProcessState::Zombie => "zombie",
            ProcessState::Dead => "dead",
        }
    }
}

/// A live process as the verdict names it: always with its start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    /// Its PID here (in the exporter's namespace) when visible here, else the procfs's.
    pub pid: u32,
    /// Its PID in the procfs read, when that shows another namespace than ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub procfs_pid: Option<u32>,
    /// Whether it is visible in our PID namespace, so that `kill` can reach it from here.
    #[serde(skip_serializing_if = "is_true")]
    pub visible_here: bool,
    /// Start time in clock ticks after boot: with the PID, its identity.
    pub start_time_ticks: u64,
    /// When it started, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    /// When it started, as the verdict says it: a date, or the time after boot when the
    /// observation has no boot time (JSON has both figures above).
    #[serde(skip)]
    pub started: Started,
    /// Command name.
    pub comm: String,
    /// Its state, as `ps` names it.
    pub state: ProcessState,
    /// Parent PID (the procfs's).
    pub ppid: u32,
    /// Process group (the procfs's).
    pub pgid: u32,
    /// Session (the procfs's).
    pub sid: u32,
    /// Threads.
    pub threads: u32,
    /// Real user id, when readable.
    pub uid: Option<u32>,
    /// User name, when the host knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kernel function it waits in, when in uninterruptible sleep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Killed while in uninterruptible sleep: since when the exporter has seen the SIGKILL
    /// pending, in seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kill_pending_since_unix_seconds: Option<u64>,
    /// Where it came from, for an owner: its parent when first seen, and whether that
    /// parent has exited since.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// Its container and pod.
    #[serde(flatten)]
    pub cgroup: CgroupAttribution,
    /// Its pod's namespace and name, when the kubelet's pod log directories name its uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodName>,
    /// Its container's name, image, and Compose project or Podman pod, when its engine
    /// named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerName>,
    /// Its Slurm job and step, its user, and whether Slurm still runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<SlurmJob>,
    /// PID 1 of its PID namespace, when that is nested in ours (a container's own). In
    /// JSON `container_ended: true` follows it once that has exited.
    #[serde(flatten, serialize_with = "namespace_init_json")]
    pub pid_namespace_init: Option<NamespaceInit>,
    /// NVIDIA device files it holds open.
    pub descriptors: References,
    /// NVIDIA device files it maps shared.
    pub mappings: References,
    /// Which of its facts this look took from what a served exporter witnessed (the
    /// witness state) rather than saw itself.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_witness: Vec<WitnessedFact>,
}

/// A fact of a process that only watching it could have seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WitnessedFact {
    /// Its parent, as first seen while it lived.
    Parent,
    /// When its parent was seen to exit.
    ParentExit,
    /// Since when a kill has waited on it.
    KillPendingSince,
    /// Since when it has been ending.
    EndingSince,
}

/// Which of `facts` are those `witness` holds of the same process: taken from it, since
/// a look that saw them itself would have seen them later.
fn from_witness(facts: &ProcessFacts, witness: Option<&Witnessed>) -> Vec<WitnessedFact> {
    let Some(witnessed) = witness.and_then(|w| w.process(facts.pid, facts.start_time_ticks)) else {
        return Vec::new();
    };
    let lineage = (facts.lineage.as_ref(), witnessed.lineage.as_ref());
    [
        (
            WitnessedFact::Parent,
            matches!(lineage, (Some(now), Some(then)) if now.parent == then.parent),
        ),
        (
            WitnessedFact::ParentExit,
            matches!(lineage, (Some(now), Some(then))
                if now.parent_exit_seen_unix_seconds.is_some()
                    && now.parent_exit_seen_unix_seconds == then.parent_exit_seen_unix_seconds),
        ),
        (
            WitnessedFact::KillPendingSince,
            facts.kill_pending_since_unix_seconds.is_some()
                && facts.kill_pending_since_unix_seconds
                    == witnessed.kill_pending_since_unix_seconds,
        ),
        (
            WitnessedFact::EndingSince,
            facts.ending_since_unix_millis.is_some()
                && facts.ending_since_unix_millis == witnessed.ending_since_unix_millis,
        ),
    ]
    .into_iter()
    .filter_map(|(fact, taken)| taken.then_some(fact))
    .collect()
}

fn is_true(value: &bool) -> bool {
    *value
}

/// `pid_namespace_init` when known, and `container_ended: true` when it says so: the
/// keys scripts read, the second derived from the first.
fn namespace_init_json<S: serde::Serializer>(
    init: &Option<NamespaceInit>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(None)?;
    if let Some(init) = init {
        map.serialize_entry("pid_namespace_init", init)?;
    }
    if NamespaceInit::exited(*init) {
        map.serialize_entry("container_ended", &true)?;
    }
    map.end()
}

impl Process {
    /// The verdict's view of a process read from `/proc`.
    pub fn new(facts: &ProcessFacts, lens: &ProcessLens) -> Process {
        let foreign = lens.procfs_view != ProcfsView::Own;
        Process {
            pid: facts.local_pid.unwrap_or(facts.pid),
            procfs_pid: foreign.then_some(facts.pid),
            visible_here: facts.local_pid.is_some(),
            start_time_ticks: facts.start_time_ticks,
            started_unix_seconds: lens.started(facts.start_time_ticks),
            started: lens.start(facts.start_time_ticks),
            comm: facts.comm.clone(),
            state: ProcessState::from_letter(facts.state),
            ppid: facts.ppid,
            pgid: facts.pgid,
            sid: facts.sid,
            threads: facts.threads,
            uid: facts.uid,
            user: facts.user.clone(),
            wchan: facts.wchan.clone(),
            kill_pending_since_unix_seconds: facts.kill_pending_since_unix_seconds,
            lineage: facts.lineage.clone(),
            cgroup: facts.cgroup.clone(),
            pod: lens
                .kubernetes
                .and_then(|view| view.pod_of(facts.cgroup.pod_uid.as_deref()))
                .cloned(),
            container: facts.cgroup.container_id.as_ref().and_then(|id| {
                lens.containers
                    .and_then(|reading| reading.names.get(id))
                    .cloned()
            }),
            slurm_job: SlurmJob::of(facts, lens.slurm),
            pid_namespace_init: facts.pid_namespace_init,
            descriptors: facts.descriptors.clone(),
            mappings: facts.mappings.clone(),
            from_witness: from_witness(facts, lens.witness),
        }
    }

    /// Its container has ended (PID 1 of its PID namespace exited): it survived the
    /// SIGKILL that ends a container, so it is stuck.
    pub fn container_ended(&self) -> bool {
        NamespaceInit::exited(self.pid_namespace_init)
    }

    /// What ended around it when its PID namespace's PID 1 exited: its container, or a
    /// PID namespace that no container id names; `None` while it has not.
    pub fn ended(&self) -> Option<Ended> {
        self.container_ended()
            .then_some(match self.cgroup.container_id {
                Some(_) => Ended::Container,
                None => Ended::PidNamespace,
            })
    }

    /// Killed, and the kill waits: a SIGKILL pending in uninterruptible sleep.
    pub fn killed(&self) -> bool {
        self.state == ProcessState::DiskSleep && self.kill_pending_since_unix_seconds.is_some()
    }
}

/// What ended around a process that outlived its PID namespace's PID 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its container (its cgroup names one).
    Container,
    /// A PID namespace no container id names.
    PidNamespace,
}

/// How the observation's raw numbers read where the verdict is given: start times in
/// clock ticks after boot become dates, the procfs's PIDs become ours, cgroups become
/// named containers and Slurm jobs that run or have ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessLens<'a> {
    /// When the host booted, in seconds since the Unix epoch.
    pub boot_time_unix_seconds: Option<u64>,
    /// Clock ticks per second of start times.
    pub ticks_per_second: u64,
    /// Whether the procfs read shows our PID namespace.
    pub procfs_view: ProcfsView,
    /// The Slurm job steps that run, when they were looked for.
    pub slurm: Option<&'a SlurmReading>,
    /// The names the container engines gave containers, when they are watched.
    pub containers: Option<&'a ContainersReading>,
    /// The kubelet's names of pods, when it is watched.
    pub kubernetes: Option<&'a KubernetesView>,
    /// What a served exporter witnessed before this look, when the look went by it.
    pub witness: Option<&'a Witnessed>,
    /// When the look was made, in milliseconds since the Unix epoch, when known.
    pub now_unix_millis: Option<u64>,
}

impl ProcessLens<'_> {
    /// Milliseconds from `since` (since the Unix epoch) to the look, when both are known.
    pub fn millis_since(&self, since: Option<u64>) -> Option<u64> {
        Some(self.now_unix_millis?.saturating_sub(since?))
    }

    /// When a process that started `ticks` after boot started, in seconds since the epoch.
    pub fn started(&self, ticks: u64) -> Option<u64> {
        let boot = self.boot_time_unix_seconds?;
        Some(boot + ticks / self.ticks_per_second.max(1))
    }

    /// When a process that started `ticks` after boot started, as a person reads it: a
    /// date when the boot time is known, else the seconds after boot (clock ticks are
    /// the kernel's unit, not a person's).
    pub fn start(&self, ticks: u64) -> Started {
        match self.started(ticks) {
            Some(unix_seconds) => Started::At { unix_seconds },
            None => Started::AfterBoot {
                seconds: ticks / self.ticks_per_second.max(1),
            },
        }
    }
}

/// When a process started, as the verdict says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// At this time, in seconds since the Unix epoch.
    At {
        /// Seconds since the Unix epoch.
        unix_seconds: u64,
    },
    /// This many seconds after the host booted: the observation has no boot time (a
    /// snapshot recorded without it).
    AfterBoot {
        /// Whole seconds after boot.
        seconds: u64,
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
