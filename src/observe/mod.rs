//! Observe: the only code that touches the system, one folder per source, none of which
//! imports another:
//!
//! - [`nvml`]: the GPUs, their memory and the processes NVML charges for it, MIG, and
//!   what the driver says each GPU needs;
//! - [`procfs`]: the processes NVML names and those that hold NVIDIA device files, with
//!   the container, pod and Slurm job step each runs in;
//! - [`slurm`]: which Slurm job steps still run, from their slurmstepds;
//! - [`kubernetes`]: the kubelet's pod-resources API and pod log directories;
//! - [`containers`]: the container engines' names for the containers processes run in.
//!
//! `snapshot` holds what one look saw ([`Observation`]) and the file that carries it
//! elsewhere ([`Snapshot`]). This module is the one place that combines the sources
//! ([`LiveHost`]), or replays a snapshot instead ([`Source`]).
//!
//! Every call that may block (NVML's, and `/proc` reads: a process in uninterruptible
//! sleep holding its memory map lock blocks reads of its maps) runs on a reader thread
//! of its own (`worker`), which a look waits for only until its [`Deadlines`]: a source
//! that does not answer by then is reported as such, with what it is stuck in, and the
//! others are served as on a healthy host. `procfs_jobs` is what the live host hands the
//! `/proc` reader thread and how long it waits for each answer; `witnessed` keeps what a
//! look witnessed in the witness state.

pub(crate) mod containers;
mod error_line;
pub(crate) mod health;
pub(crate) mod kubernetes;
mod lifespan;
pub(crate) mod nvml;
mod pod_uid;
pub mod procfs;
mod procfs_jobs;
pub(crate) mod slurm;
mod snapshot;
pub mod witness;
mod witnessed;
mod worker;

pub(crate) use error_line::one_line;
pub use kubernetes::KubernetesReading;
pub use lifespan::Lifespan;
pub use nvml::{
    GpuError, GpuHealth, GpuReading, GpuState, MemoryReading, MigCapabilities, MigDeviceReading,
    MigReading, NvmlFailure, NvmlLists, NvmlProcess, NvmlReading, ProcessList, RecoveryAction,
    RemappedRows, RetiredPages, StuckCall, XidReading,
};
pub use procfs::{
    CgroupAttribution, HolderScan, Identity, Leader, Lineage, NamespaceInit, NarrowAccess, NodeSet,
    PidNamespace, ProcessFacts, ProcessLookup, ProcfsView, References, Relative, Runtime,
    SlurmStep,
};
pub use slurm::{RunningStep, SlurmReading};
pub use snapshot::{
    read_snapshot, FirstSeen, Observation, ObserveError, OwnerLookup, Snapshot, StuckRead,
    WitnessReading, Witnessed,
};
pub(crate) use worker::block_on;

use self::containers::{ContainerWatch, ContainersConfig, Engine, Wanted};
use self::kubernetes::{KubernetesConfig, KubernetesWatch};
use self::nvml::{NvmlSource, NvmlThread};
use self::procfs::{EarlierLooks, OwnersRead, Placement, ProcRoot};
use self::slurm::Slurmstepds;
use self::worker::{Pending, Worker};
use crate::dates::since_epoch_now;
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// When each part of one look must be done, for a caller that waits from `started`
/// until `until` (a scrape's wait, `check --timeout`).
///
/// NVML gets the first half: every GPU is read side by side, so one that hangs costs the
/// look this much and no more, and a later look does not wait for it at all. The `/proc`
/// reads of NVML's owners are waited for until the next fifth has passed (those of the
/// owners NVML listed at the last look start with NVML, beside it); the holder scan stops at 85 % (or at its
/// own budget, when that is sooner) and is waited for until 90 %; the last tenth is left
/// to judge and encode. Healthy NVML and `/proc` answer in milliseconds, so these shares
/// matter only when something hangs, and then every part still has its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// When the look stops waiting for NVML.
    pub nvml: Instant,
    /// When it stops waiting for the `/proc` reads of NVML's owners.
    pub owners: Instant,
    /// When the holder scan stops on its own.
    pub scan_stops: Instant,
    /// When the look stops waiting for the holder scan (a blocked read outlasts its stop).
    pub scan_waited: Instant,
}

impl Deadlines {
    /// The deadlines of a look that starts at `started` and must be done by `until`.
    pub fn between(started: Instant, until: Instant) -> Deadlines {
        let span = until.saturating_duration_since(started);
        let at = |share: f64| started + span.mul_f64(share);
        Deadlines {
            nvml: at(0.5),
            owners: at(0.7),
            scan_stops: at(0.85),
            scan_waited: at(0.9),
        }
    }
}

/// Where the witness state is, and whether this exporter keeps it (a server and
/// `textfile` do; `check` and `snapshot` only read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The directory of the state file.
    pub directory: PathBuf,
    /// Whether looks write what they witnessed.
    pub keep: bool,
}

/// A reader thread that is in a call now: which, the call, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// What it reads.
    pub reader: ReaderThread,
    /// The call it is in (an NVML function, or a `/proc` look).
    pub call: &'static str,
    /// When the call started.
    pub since: Instant,
}

/// A reader thread of the live host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderThread {
    /// NVML's library-level calls (init, device count).
    NvmlLibrary,
    /// One GPU, by NVML index.
    Gpu(u32),
    /// `/proc`: NVML's owners and the holder scan.
    Procfs,
}

/// What the `/proc` reader thread is told it is doing, before its first read.
const READING_OWNERS: &str = "reading NVML's owners in /proc";
const SCANNING: &str = "scanning /proc for holders";
const LOOKING_FOR_SLURMSTEPDS: &str = "looking for the slurmstepds of jobs in /proc";

/// Where observations come from.
#[derive(Debug)]
pub enum Source {
    /// The live host.
    Live(Box<LiveHost>),
    /// A snapshot file, re-read on every observation.
    Replay(PathBuf),
}

/// NVML, `/proc` and the kubelet of the machine we run on.
#[derive(Debug)]
pub struct LiveHost {
    nvml: NvmlSource,
    proc_root: ProcRoot,
    /// The one thread that reads `/proc`, keeping what earlier looks found of each
    /// process (served while its start time is the same).
    procfs: Worker<EarlierLooks>,
    /// Whether the `/proc` reader was stuck at the last look, so it is logged once.
    procfs_stuck: Mutex<bool>,
    /// A server logs what does not answer; a one-shot command says it in its output.
    lifespan: Lifespan,
    scan_budget: Duration,
    /// The exporter's place in the procfs, found once.
    placement: Placement,
    /// When the host booted: read once, since it does not change (and reading
    /// `/proc/stat` renders every CPU's counters).
    boot_time_unix_seconds: Option<u64>,
    /// The process first seen under each PID that NVML lists: a PID names a process only
    /// with its start time, so a later process under the same number is someone else.
    first_seen: Mutex<HashMap<u32, Identity>>,
    /// The PIDs NVML listed at the last look, with the minors of the GPUs each was listed
    /// on: the owners whose `/proc` reads the next look starts before NVML answers.
    last_listed: Mutex<Arc<BTreeMap<u32, Vec<u32>>>>,
    /// The kubelet's sources, when they are watched.
    kubernetes: Option<KubernetesWatch>,
    /// The container engines, when they are watched.
    containers: Option<ContainerWatch>,
    /// What an exporter witnessed before this one looked, and what this one witnesses.
    witness: witnessed::Witness,
    /// The slurmstepds found by earlier looks.
    slurmstepds: Arc<Mutex<Slurmstepds>>,
    /// The driver's table of MIG capability minors.
    mig_minors: PathBuf,
    /// Whether the last look was followed by a holder scan: memory was orphaned then,
    /// and most likely still is, so the next look starts its scan early (see
    /// [`LiveHost::start_reading_owners`]).
    scanned_last: AtomicBool,
    /// The holder scan started early by this look, if it was: taken by
    /// [`LiveHost::scan`] when it was made with the owners this look read.
    early_scan: Mutex<Option<Pending<(OwnersRead, HolderScan)>>>,
}

impl LiveHost {
    /// A live source reading NVML from `nvml_library` and processes from `proc_root`,
    /// starting from the witness state in `state` (and keeping it, when it says so); a
    /// server logs a missing NVML once and retries, and counts critical Xid events.
    pub fn new(
        nvml_library: Option<PathBuf>,
        proc_root: ProcRoot,
        scan_budget: Duration,
        lifespan: Lifespan,
        state: StateConfig,
    ) -> Self {
        let witness =
            witnessed::Witness::read(state.directory, &proc_root.root, state.keep, lifespan);
        let (mut earlier_looks, mut first_seen) = (EarlierLooks::new(), HashMap::new());
        witness.seed(&mut earlier_looks, &mut first_seen);
        LiveHost {
            nvml: NvmlSource::new(nvml_library, lifespan),
            placement: Placement::locate(&proc_root),
            boot_time_unix_seconds: proc_root.boot_time(),
            mig_minors: proc_root.root.join(nvml::MIG_MINORS),
            proc_root,
            procfs: Worker::start("procfs-reader", earlier_looks),
            procfs_stuck: Mutex::new(false),
            lifespan,
            scan_budget,
            first_seen: Mutex::new(first_seen),
            witness,
            last_listed: Mutex::new(Arc::new(BTreeMap::new())),
            kubernetes: None,
            containers: None,
            slurmstepds: Arc::new(Mutex::new(Slurmstepds::default())),
            scanned_last: AtomicBool::new(false),
            early_scan: Mutex::new(None),
        }
    }

    /// Also reads the kubelet's pod-resources socket and pod log directories, once now
    /// and, for a server, on a thread of their own every refresh interval.
    pub fn with_kubernetes(mut self, config: KubernetesConfig, lifespan: Lifespan) -> Self {
        self.kubernetes = Some(KubernetesWatch::start(config, lifespan));
        self
    }

    /// Also names containers through their engines' sockets, on a thread of their own.
    pub fn with_containers(mut self, config: ContainersConfig, lifespan: Lifespan) -> Self {
        self.containers = Some(ContainerWatch::start(config, lifespan));
        self
    }

    /// Reads the MIG capability minors from `path` instead of the procfs's own table
    /// (tests point it at a fixture); `None` keeps the default.
    pub fn with_mig_minors(mut self, path: Option<PathBuf>) -> Self {
        if let Some(path) = path {
            self.mig_minors = path;
        }
        self
    }

    /// Reads one GPU after another instead of side by side (a hidden flag, for the
    /// benchmark that measures what reading them side by side saves).
    pub fn with_one_gpu_at_a_time(mut self, serial: bool) -> Self {
        if serial {
            self.nvml = self.nvml.one_gpu_at_a_time();
        }
        self
    }

    /// Loads NVML now, on its thread, without waiting: a server logs a missing NVML at
    /// start rather than at the first scrape.
    pub fn start_loading_nvml(&self) {
        self.nvml.start_loading();
    }

    /// Every reader thread that is in a call now.
    pub fn waiting(&self) -> Vec<Waiting> {
        let nvml = self.nvml.in_calls().into_iter().map(|(thread, in_call)| {
            let reader = match thread {
                NvmlThread::Library => ReaderThread::NvmlLibrary,
                NvmlThread::Gpu(index) => ReaderThread::Gpu(index),
            };
            (reader, in_call)
        });
        let procfs = self
            .procfs
            .in_call()
            .map(|in_call| (ReaderThread::Procfs, in_call));
        nvml.chain(procfs)
            .map(|(reader, in_call)| Waiting {
                reader,
                call: in_call.call,
                since: in_call.since,
            })
            .collect()
    }

    async fn observe(&self, deadlines: &Deadlines) -> Observation {
        let started = Instant::now();
        // The owners NVML listed at the last look are mostly those it lists now: their
        // /proc reads start now, on the /proc reader, while the GPU threads answer NVML,
        // instead of after them.
        let guessed = Arc::clone(&lock(&self.last_listed));
        let early = self.start_reading_owners(&guessed, deadlines);
        let mut nvml = self.nvml.read(deadlines.nvml).await;
        let nvml_read = started.elapsed();
        let listed = Arc::new(nvml.listed_pids());
        *lock(&self.last_listed) = Arc::clone(&listed);
        let (lookups, mut procfs_errors, procfs_view, procfs_stuck) = self
            .read_owners(early, &guessed, &listed, &mut nvml, deadlines)
            .await;
        if procfs_stuck.is_none() {
            self.procfs_answers();
        }
        let mut owners: BTreeMap<u32, OwnerLookup> = lookups
            .into_iter()
            .map(|(pid, now)| {
                (
                    pid,
                    OwnerLookup {
                        first_seen: None,
                        now,
                    },
                )
            })
            .collect();
        self.remember_identities(&nvml, &mut owners);
        let pid_namespace = self.proc_root.own_pid_namespace();
        if pid_namespace == PidNamespace::Unreadable {
            procfs_errors += 1;
        }
        let kubernetes = match &self.kubernetes {
            Some(watch) => Some(
                self.kubernetes_reading(watch, &owners, deadlines.owners)
                    .await,
            ),
            None => None,
        };
        let slurm = self
            .slurm_reading(cgroups_of(&owners), deadlines.owners)
            .await;
        let containers = self
            .containers
            .as_ref()
            .map(|watch| watch.reading(wanted_containers(cgroups_of(&owners)), deadlines.owners));
        // Where a slow scrape's time went, for whoever profiles one.
        tracing::debug!(
            nvml_seconds = nvml_read.as_secs_f64(),
            rest_seconds = (started.elapsed() - nvml_read).as_secs_f64(),
            owners = owners.len(),
            "observed"
        );
        let taken_at = since_epoch_now();
        let observation = Observation {
            nvml,
            host_pid_namespace: pid_namespace.is_host(),
            procfs_view,
            boot_time_unix_seconds: self.boot_time_unix_seconds,
            clock_ticks_per_second: clock_ticks_per_second(),
            taken_at_unix_seconds: taken_at.map(|since| since.as_secs()),
            taken_at_unix_millis: taken_at.map(|since| since.as_millis() as u64),
            owners,
            holder_scan: None,
            procfs_errors,
            procfs_stuck,
            kubernetes,
            slurm,
            containers,
            // A one-shot command's verdict says which of its facts came from the state.
            witness: (self.lifespan == Lifespan::OneShot).then(|| self.witness.reading()),
            own_process: None,
        };
        self.witness.keep(&observation);
        observation
    }

    /// Fill in each owner's first-seen identity, remembering new ones and forgetting the
    /// PIDs NVML no longer lists (on GPUs that answered: a GPU that failed this time may
    /// list them again).
    fn remember_identities(&self, nvml: &NvmlReading, owners: &mut BTreeMap<u32, OwnerLookup>) {
        let mut first_seen = lock(&self.first_seen);
        let unanswered = match nvml {
            NvmlReading::Up { gpus, .. } => gpus.iter().any(|gpu| {
                matches!(
                    gpu.state,
                    GpuState::Failed { .. } | GpuState::NotAnswering { .. }
                )
            }),
            NvmlReading::Down { .. } => true,
        };
        if !unanswered {
            first_seen.retain(|pid, _| owners.contains_key(pid));
        }
        for (pid, owner) in owners.iter_mut() {
            owner.first_seen = match (first_seen.get(pid), &owner.now) {
                (Some(identity), _) => Some(identity.clone()),
                (None, ProcessLookup::Present(facts)) => {
                    let identity = Identity::of(facts);
                    first_seen.insert(*pid, identity.clone());
                    Some(identity)
                }
                (None, _) => None,
            };
        }
    }

    /// The kubelet's sources as last refreshed, with the names of the owners' pods and
    /// NVML's answer to which GPU each assigned MIG device is part of.
    async fn kubernetes_reading(
        &self,
        watch: &KubernetesWatch,
        owners: &BTreeMap<u32, OwnerLookup>,
        until: Instant,
    ) -> KubernetesReading {
        let uids = owners.values().filter_map(|owner| match &owner.now {
            ProcessLookup::Present(facts) => facts.cgroup.pod_uid.as_deref(),
            _ => None,
        });
        let mut reading = watch.reading(uids);
        let mig: Vec<String> = reading
            .mig_device_ids()
            .into_iter()
            .map(str::to_string)
            .collect();
        if !mig.is_empty() {
            reading.mig_parents = self.nvml.mig_parents(&mig, until).await;
        }
        reading
    }
}

/// The cgroups of the owners that are there.
fn cgroups_of(owners: &BTreeMap<u32, OwnerLookup>) -> impl Iterator<Item = &CgroupAttribution> {
    owners.values().filter_map(|owner| match &owner.now {
        ProcessLookup::Present(facts) => Some(&facts.cgroup),
        _ => None,
    })
}

/// The containers to name, each with the engines that may know it: the one its cgroup's
/// runtime prefix names, or either for a bare id outside any pod. Kubernetes' containers
/// (a pod, containerd, CRI-O) are the kubelet's to name.
fn wanted_containers<'a>(cgroups: impl Iterator<Item = &'a CgroupAttribution>) -> Vec<Wanted> {
    cgroups
        .filter_map(|cgroup| {
            let id = cgroup.container_id.as_ref()?;
            let engines = match cgroup.runtime {
                Some(Runtime::Docker) => vec![Engine::Docker],
                Some(Runtime::Podman) => vec![Engine::Podman],
                None if cgroup.pod_uid.is_none() => vec![Engine::Docker, Engine::Podman],
                Some(Runtime::Containerd | Runtime::CriO) | None => return None,
            };
            Some((id.clone(), engines))
        })
        .collect()
}

/// When a scan that starts `now` must stop: after `budget`, or at `until` when that is
/// sooner (a scrape that stops waiting then; a scan already past it stops at once).
fn scan_deadline(now: Instant, budget: Duration, until: Option<Instant>) -> Instant {
    let own = now + budget;
    until.map_or(own, |until| own.min(until))
}

/// The kernel's `USER_HZ`, in which `/proc` gives start times.
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|&ticks| ticks > 0)
        .unwrap_or(100)
}

impl Source {
    /// A live source that also watches the kubelet's sources (see
    /// [`LiveHost::with_kubernetes`]); a replay keeps what its snapshot recorded.
    pub fn with_kubernetes(self, config: &KubernetesConfig, lifespan: Lifespan) -> Source {
        match self {
            Source::Live(host) => {
                Source::Live(Box::new(host.with_kubernetes(config.clone(), lifespan)))
            }
            replay @ Source::Replay(_) => replay,
        }
    }

    /// A live source that also names containers through their engines (see
    /// [`LiveHost::with_containers`]); a replay keeps what its snapshot recorded.
    pub fn with_containers(self, config: &ContainersConfig, lifespan: Lifespan) -> Source {
        match self {
            Source::Live(host) => {
                Source::Live(Box::new(host.with_containers(config.clone(), lifespan)))
            }
            replay @ Source::Replay(_) => replay,
        }
    }

    /// One observation, without the holder scan, waiting for each source until its
    /// deadline.
    pub async fn observe(&self, deadlines: &Deadlines) -> Result<Observation, ObserveError> {
        match self {
            Source::Live(host) => Ok(host.observe(deadlines).await),
            Source::Replay(path) => read_snapshot(path),
        }
    }

    /// Adds the holder scan to `observation` (a replay keeps the scan it recorded); the
    /// scan stops at its budget or at its deadline, whichever comes first.
    pub async fn scan_holders(&self, observation: &mut Observation, deadlines: &Deadlines) {
        if let Source::Live(host) = self {
            let (scan, stuck) = host.scan(deadlines, observation).await;
            if stuck.is_some() {
                observation.procfs_stuck = stuck;
            }
            if let (Some(watch), Some(reading)) = (&host.kubernetes, &mut observation.kubernetes) {
                let uids = scan
                    .holders
                    .iter()
                    .filter_map(|holder| holder.cgroup.pod_uid.as_deref());
                watch.add_names(reading, uids);
            }
            if let (Some(watch), Some(reading)) = (&host.containers, &mut observation.containers) {
                let cgroups = scan.holders.iter().map(|holder| &holder.cgroup);
                watch.add_names(reading, wanted_containers(cgroups), deadlines.scan_waited);
            }
            // Holders in Slurm jobs, with the owners: whether their steps run, as of now.
            if scan
                .holders
                .iter()
                .any(|holder| holder.cgroup.slurm.is_some())
            {
                let holders = scan.holders.iter().map(|holder| &holder.cgroup);
                observation.slurm = host
                    .slurm_reading(
                        cgroups_of(&observation.owners).chain(holders),
                        deadlines.scan_waited,
                    )
                    .await;
            }
            observation.holder_scan = Some(scan);
        }
    }

    /// Loads NVML now without waiting (see [`LiveHost::start_loading_nvml`]); nothing for
    /// a replay.
    pub fn start_loading_nvml(&self) {
        if let Source::Live(host) = self {
            host.start_loading_nvml();
        }
    }

    /// The reader threads in a call now; none for a replay.
    pub fn waiting(&self) -> Vec<Waiting> {
        match self {
            Source::Live(host) => host.waiting(),
            Source::Replay(_) => Vec::new(),
        }
    }

    /// Which PID namespace the exporter runs in; `None` for a replay, which has no live
    /// process to ask.
    pub fn pid_namespace(&self) -> Option<PidNamespace> {
        match self {
            Source::Live(host) => Some(host.proc_root.own_pid_namespace()),
            Source::Replay(_) => None,
        }
    }

    /// Whose PIDs the procfs read shows; `None` for a replay.
    pub fn procfs_view(&self) -> Option<ProcfsView> {
        match self {
            Source::Live(host) => Some(host.placement.view()),
            Source::Replay(_) => None,
        }
    }

    /// The name of the host observed, for a snapshot.
    pub fn hostname(&self) -> String {
        match self {
            Source::Live(host) => host.proc_root.hostname().unwrap_or_default(),
            Source::Replay(_) => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_gives_nvml_half_its_time_and_leaves_a_tenth_to_judge_and_encode() {
        let started = Instant::now();
        let deadlines = Deadlines::between(started, started + Duration::from_secs(10));
        assert_eq!(deadlines.nvml, started + Duration::from_secs(5));
        assert_eq!(deadlines.owners, started + Duration::from_secs(7));
        assert_eq!(deadlines.scan_stops, started + Duration::from_millis(8500));
        assert_eq!(deadlines.scan_waited, started + Duration::from_secs(9));
        // A caller already out of time gives every part none.
        let late = Deadlines::between(started, started);
        assert_eq!(late.nvml, started);
        assert_eq!(late.scan_waited, started);
    }

    #[test]
    fn a_scan_stops_at_its_budget_or_the_scrapes_deadline_whichever_is_first() {
        let now = Instant::now();
        let budget = Duration::from_secs(2);
        assert_eq!(scan_deadline(now, budget, None), now + budget);
        let soon = now + Duration::from_millis(300);
        assert_eq!(scan_deadline(now, budget, Some(soon)), soon);
        let later = now + Duration::from_secs(9);
        assert_eq!(scan_deadline(now, budget, Some(later)), now + budget);
    }
}
