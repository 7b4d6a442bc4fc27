//! Observe: the only code that touches the system (NVML and `/proc`), or replays a
//! snapshot of them.

pub mod cgroup;
mod holders;
pub mod mig;
mod model;
pub mod nvml;
pub mod parse;
mod pidns;
pub mod procfs;
mod xid;

pub mod kubelet;
pub mod kubernetes;
pub mod pods;

pub use model::*;

use self::kubernetes::{KubernetesConfig, KubernetesWatch};
use self::nvml::NvmlSource;
use self::procfs::{Memory, OwnersRead, Placement, ProcRoot, Reader, Remembered, Unread};
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why an observation could not be made at all.
#[derive(Debug, Error)]
pub enum ObserveError {
    /// The replay file could not be read.
    #[error("cannot read snapshot {path}: {error}")]
    ReadSnapshot {
        /// The file.
        path: PathBuf,
        /// The I/O error, said in the message and therefore not a `source` as well.
        error: std::io::Error,
    },
    /// The replay file is not a snapshot.
    #[error("{path} is not a vram-exporter snapshot: {error}")]
    ParseSnapshot {
        /// The file.
        path: PathBuf,
        /// The JSON error, said in the message and therefore not a `source` as well.
        error: serde_json::Error,
    },
    /// The replay file is from an incompatible version.
    #[error(
        "{path} has snapshot format {format}; this build reads format {}",
        Snapshot::FORMAT
    )]
    SnapshotFormat {
        /// The file.
        path: PathBuf,
        /// The format it declares.
        format: u32,
    },
}

/// Where observations come from.
#[derive(Debug)]
pub enum Source {
    /// The live host.
    Live(Box<LiveHost>),
    /// A snapshot file, re-read on every observation.
    Replay(PathBuf),
}

/// NVML and `/proc` of the machine we run on.
#[derive(Debug)]
pub struct LiveHost {
    nvml: NvmlSource,
    proc_root: ProcRoot,
    scan_budget: Duration,
    /// The exporter's place in the procfs, found once.
    placement: Placement,
    /// When the host booted: read once, since it does not change (and reading
    /// `/proc/stat` renders every CPU's counters).
    boot_time_unix_seconds: Option<u64>,
    /// The process first seen under each PID that NVML lists: a PID names a process only
    /// with its start time, so a later process under the same number is someone else.
    first_seen: Mutex<HashMap<u32, Identity>>,
    /// What earlier looks found of each process, served while its start time is the same.
    memory: Mutex<Memory>,
    /// The kubelet's sources, when they are watched.
    kubernetes: Option<KubernetesWatch>,
    /// The driver's table of MIG capability minors.
    mig_minors: PathBuf,
}

impl LiveHost {
    /// A live source reading NVML from `nvml_library` and processes from `proc_root`.
    /// `long_running` is true for the server, which logs a missing NVML once and retries.
    pub fn new(
        nvml_library: Option<PathBuf>,
        proc_root: ProcRoot,
        scan_budget: Duration,
        long_running: bool,
    ) -> Self {
        LiveHost {
            nvml: NvmlSource::new(nvml_library, long_running),
            placement: Placement::locate(&proc_root),
            boot_time_unix_seconds: proc_root.boot_time(),
            mig_minors: proc_root.root.join(mig::MIG_MINORS),
            proc_root,
            scan_budget,
            first_seen: Mutex::new(HashMap::new()),
            memory: Mutex::new(Memory::new()),
            kubernetes: None,
        }
    }

    /// Also reads the kubelet's pod-resources socket and pod log directories, once now
    /// and, when `long_running`, on a thread of their own every refresh interval.
    pub fn with_kubernetes(mut self, config: KubernetesConfig, long_running: bool) -> Self {
        self.kubernetes = Some(KubernetesWatch::start(config, long_running));
        self
    }

    /// The kubelet's sources as last refreshed, with the names of the owners' pods and
    /// NVML's answer to which GPU each assigned MIG device is part of.
    fn kubernetes_reading(
        &self,
        watch: &KubernetesWatch,
        owners: &BTreeMap<u32, OwnerLookup>,
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
            reading.mig_parents = self.nvml.mig_parents(&mig);
        }
        reading
    }

    /// Reads the MIG capability minors from `path` instead of the procfs's own table
    /// (tests point it at a fixture); `None` keeps the default.
    pub fn with_mig_minors(mut self, path: Option<PathBuf>) -> Self {
        if let Some(path) = path {
            self.mig_minors = path;
        }
        self
    }

    /// The `/proc` root this host reads.
    pub fn proc_root(&self) -> &ProcRoot {
        &self.proc_root
    }

    fn observe(&self) -> Observation {
        let started = Instant::now();
        let mut nvml = self.nvml.read();
        let nvml_read = started.elapsed();
        mig::attach_capabilities(&mut nvml, &self.mig_minors);
        let mut memory = lock(&self.memory);
        let listed = listed_pids(&nvml);
        let reader = Reader::with_memory(&self.proc_root, self.placement, &memory)
            .holding_stat_files(listed.len() <= MAX_HELD_STAT_FILES);
        let mut procfs_errors = 0;
        let mut read_as_owners = HashSet::new();
        let mut inits =
            pidns::NamespaceInits::new(&self.proc_root, Instant::now() + self.scan_budget);
        let mut owners = BTreeMap::new();
        let mut learnt = Vec::new();
        let mut gone = Vec::new();
        for (pid, gpus) in listed {
            let now = match reader.procfs_pid(pid) {
                None => ProcessLookup::NotVisible,
                Some(procfs_pid) => {
                    read_as_owners.insert(procfs_pid);
                    let looked = reader.read_owner(procfs_pid, &gpus);
                    procfs_errors += looked.errors;
                    if let Some(remember) = looked.remember {
                        learnt.push((procfs_pid, remember));
                    }
                    match looked.facts {
                        Ok(mut facts) => {
                            // Which owners' containers have ended: a short walk up from
                            // each owner in a nested PID namespace, a pass over /proc at
                            // most once.
                            if looked.nested != Some(false) {
                                facts.pid_namespace_init = inits.of(procfs_pid);
                            }
                            ProcessLookup::Present(Box::new(facts))
                        }
                        Err(Unread::Missing) => {
                            gone.push(procfs_pid);
                            ProcessLookup::Missing
                        }
                        Err(Unread::Unreadable(error)) => ProcessLookup::Unreadable { error },
                    }
                }
            };
            owners.insert(
                pid,
                OwnerLookup {
                    first_seen: None,
                    now,
                },
            );
        }
        let procfs_view = reader.view();
        drop(reader);
        for pid in gone {
            memory.remove(&pid);
        }
        remember(&mut memory, learnt);
        for (pid, known) in memory.iter_mut() {
            if !read_as_owners.contains(pid) {
                known.let_go_of_stat_file();
            }
        }
        drop(memory);
        self.remember_identities(&nvml, &mut owners);
        let host_pid_namespace = self.proc_root.host_pid_namespace();
        if host_pid_namespace.is_none() {
            procfs_errors += 1;
        }
        let kubernetes = self
            .kubernetes
            .as_ref()
            .map(|watch| self.kubernetes_reading(watch, &owners));
        // Where a slow scrape's time went, for whoever profiles one.
        tracing::debug!(
            nvml_seconds = nvml_read.as_secs_f64(),
            rest_seconds = (started.elapsed() - nvml_read).as_secs_f64(),
            owners = owners.len(),
            "observed"
        );
        Observation {
            nvml,
            host_pid_namespace,
            procfs_view,
            boot_time_unix_seconds: self.boot_time_unix_seconds,
            clock_ticks_per_second: clock_ticks_per_second(),
            owners,
            holder_scan: None,
            procfs_errors,
            kubernetes,
        }
    }

    /// The holder scan, served from and adding to what earlier looks found.
    fn scan(&self, until: Option<Instant>, owners_read: OwnersRead) -> HolderScan {
        let mut memory = lock(&self.memory);
        let reader = Reader::with_memory(&self.proc_root, self.placement, &memory)
            .with_owners_read(owners_read);
        let (scan, learnt) =
            reader.scan_and_remember(scan_deadline(Instant::now(), self.scan_budget, until));
        drop(reader);
        // A complete scan saw every process: what it did not see has exited.
        if !scan.cut_short {
            let seen: HashSet<u32> = learnt.iter().map(|(pid, _)| *pid).collect();
            memory.retain(|pid, _| seen.contains(pid));
        }
        remember(&mut memory, learnt);
        scan
    }

    /// Fill in each owner's first-seen identity, remembering new ones and forgetting the
    /// PIDs NVML no longer lists (on GPUs that answered: a GPU that failed this time may
    /// list them again).
    fn remember_identities(&self, nvml: &NvmlReading, owners: &mut BTreeMap<u32, OwnerLookup>) {
        let mut first_seen = lock(&self.first_seen);
        let unanswered = match nvml {
            NvmlReading::Up { gpus, .. } => gpus
                .iter()
                .any(|gpu| matches!(gpu.state, GpuState::Failed { .. })),
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
}

/// Every PID NVML lists on a GPU that answered or on one of its MIG devices, with the
/// minor numbers of the GPUs it is listed on (a MIG device's context maps its GPU's node).
fn listed_pids(nvml: &NvmlReading) -> BTreeMap<u32, Vec<u32>> {
    let mut listed: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let NvmlReading::Up { gpus, .. } = nvml {
        for gpu in gpus {
            let instances = gpu.mig.iter().flat_map(|mig| &mig.devices);
            let states = std::iter::once(&gpu.state).chain(instances.map(|device| &device.state));
            for state in states {
                if let GpuState::Ok { processes, .. } = state {
                    for process in processes.entries() {
                        let minors = listed.entry(process.pid).or_default();
                        minors.extend(gpu.minor.filter(|minor| !minors.contains(minor)));
                    }
                }
            }
        }
    }
    listed
}

/// The owners this observation read, for the holder scan that follows it.
fn owners_read(observation: &Observation) -> OwnersRead {
    let listed = listed_pids(&observation.nvml);
    observation
        .owners
        .iter()
        .filter_map(|(pid, lookup)| match &lookup.now {
            ProcessLookup::Present(facts) => Some((
                facts.pid,
                (facts.start_time_ticks, listed.get(pid)?.clone()),
            )),
            _ => None,
        })
        .collect()
}

/// Add what a look learnt to the memory, keeping a reading the look did not redo.
fn remember(memory: &mut Memory, learnt: Vec<(u32, Remembered)>) {
    for (pid, newer) in learnt {
        let merged = match memory.remove(&pid) {
            Some(older) => older.updated_by(newer),
            None => newer,
        };
        memory.insert(pid, merged);
    }
}

/// The kernel's `USER_HZ`, in which `/proc` gives start times.
/// The most owners whose stat files are held open between scrapes (one descriptor each);
/// beyond it, each is opened again on every scrape.
const MAX_HELD_STAT_FILES: usize = 512;

/// When a scan that starts `now` must stop: after `budget`, or at `until` when that is
/// sooner (a scrape that stops waiting then; a scan already past it stops at once).
fn scan_deadline(now: Instant, budget: Duration, until: Option<Instant>) -> Instant {
    let own = now + budget;
    until.map_or(own, |until| own.min(until))
}

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
    pub fn with_kubernetes(self, config: &KubernetesConfig, long_running: bool) -> Source {
        match self {
            Source::Live(host) => {
                Source::Live(Box::new(host.with_kubernetes(config.clone(), long_running)))
            }
            replay @ Source::Replay(_) => replay,
        }
    }

    /// One observation, without the holder scan.
    pub fn observe(&self) -> Result<Observation, ObserveError> {
        match self {
            Source::Live(host) => Ok(host.observe()),
            Source::Replay(path) => read_snapshot(path),
        }
    }

    /// Adds the holder scan to `observation` (a replay keeps the scan it recorded); the
    /// scan stops at its budget or at `until`, whichever comes first.
    pub fn scan_holders(&self, observation: &mut Observation, until: Option<Instant>) {
        if let Source::Live(host) = self {
            let scan = host.scan(until, owners_read(observation));
            if let (Some(watch), Some(reading)) = (&host.kubernetes, &mut observation.kubernetes) {
                let uids = scan
                    .holders
                    .iter()
                    .filter_map(|holder| holder.cgroup.pod_uid.as_deref());
                watch.add_names(reading, uids);
            }
            observation.holder_scan = Some(scan);
        }
    }

    /// Whether we run in the host's PID namespace (`Some(None)`: it cannot be read);
    /// `None` for a replay.
    pub fn host_pid_namespace(&self) -> Option<Option<bool>> {
        match self {
            Source::Live(host) => Some(host.proc_root.host_pid_namespace()),
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

/// Reads a snapshot written by `vram-exporter snapshot`.
pub fn read_snapshot(path: &Path) -> Result<Observation, ObserveError> {
    let text = std::fs::read_to_string(path).map_err(|error| ObserveError::ReadSnapshot {
        path: path.to_path_buf(),
        error,
    })?;
    let snapshot: Snapshot =
        serde_json::from_str(&text).map_err(|error| ObserveError::ParseSnapshot {
            path: path.to_path_buf(),
            error,
        })?;
    if snapshot.format != Snapshot::FORMAT {
        return Err(ObserveError::SnapshotFormat {
            path: path.to_path_buf(),
            format: snapshot.format,
        });
    }
    Ok(snapshot.observation)
}

#[cfg(test)]
mod tests {
    use super::*;

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
