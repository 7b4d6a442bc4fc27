//! Observe: the only code that touches the system, one folder per source, none of which
//! imports another:
//!
//! - [`nvml`]: the GPUs, their memory and the processes NVML charges for it, MIG, and
//!   what the driver says each GPU needs;
//! - [`procfs`]: the processes NVML names and those that hold NVIDIA device files, with
//!   the container, pod and Slurm job step each runs in, and which Slurm steps still run;
//! - [`kubernetes`]: the kubelet's pod-resources API and pod log directories;
//! - [`containers`]: the container engines' names for the containers processes run in.
//!
//! `snapshot` holds what one look saw ([`Observation`]) and the file that carries it
//! elsewhere ([`Snapshot`]). This module is the one place that combines the sources
//! ([`LiveHost`]), or replays a snapshot instead ([`Source`]).

pub mod containers;
mod error_line;
pub mod kubernetes;
mod lifespan;
pub mod nvml;
mod pod_uid;
pub mod procfs;
mod snapshot;

pub use kubernetes::KubernetesReading;
pub use lifespan::Lifespan;
pub use nvml::{
    GpuError, GpuHealth, GpuReading, GpuState, MemoryReading, MigCapabilities, MigDeviceReading,
    MigReading, NvmlProcess, NvmlReading, ProcessList, RecoveryAction, RemappedRows, RetiredPages,
    XidReading,
};
pub use procfs::{
    CgroupAttribution, HolderScan, Identity, NamespaceInit, NodeSet, PidNamespace, ProcessFacts,
    ProcessLookup, ProcfsView, References, RunningStep, Runtime, SlurmReading, SlurmStep,
};
pub use snapshot::{read_snapshot, Observation, ObserveError, OwnerLookup, Snapshot};

use self::containers::{ContainerWatch, ContainersConfig, Engine, Wanted};
use self::kubernetes::{KubernetesConfig, KubernetesWatch};
use self::nvml::NvmlSource;
use self::procfs::{Memory, OwnersRead, Placement, ProcRoot, Slurmstepds};
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// The container engines, when they are watched.
    containers: Option<ContainerWatch>,
    /// The slurmstepds found by earlier looks.
    slurmstepds: Mutex<Slurmstepds>,
    /// The driver's table of MIG capability minors.
    mig_minors: PathBuf,
}

impl LiveHost {
    /// A live source reading NVML from `nvml_library` and processes from `proc_root`; a
    /// server logs a missing NVML once and retries, and counts critical Xid events.
    pub fn new(
        nvml_library: Option<PathBuf>,
        proc_root: ProcRoot,
        scan_budget: Duration,
        lifespan: Lifespan,
    ) -> Self {
        LiveHost {
            nvml: NvmlSource::new(nvml_library, lifespan),
            placement: Placement::locate(&proc_root),
            boot_time_unix_seconds: proc_root.boot_time(),
            mig_minors: proc_root.root.join(nvml::MIG_MINORS),
            proc_root,
            scan_budget,
            first_seen: Mutex::new(HashMap::new()),
            memory: Mutex::new(Memory::new()),
            kubernetes: None,
            containers: None,
            slurmstepds: Mutex::new(Slurmstepds::default()),
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

    fn observe(&self) -> Observation {
        let started = Instant::now();
        let mut nvml = self.nvml.read();
        let nvml_read = started.elapsed();
        nvml::attach_capabilities(&mut nvml, &self.mig_minors);
        let looked = procfs::look_at_owners(
            &self.proc_root,
            self.placement,
            &mut lock(&self.memory),
            &nvml.listed_pids(),
            Instant::now() + self.scan_budget,
        );
        let mut owners: BTreeMap<u32, OwnerLookup> = looked
            .lookups
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
        let mut procfs_errors = looked.errors;
        let pid_namespace = self.proc_root.own_pid_namespace();
        if pid_namespace == PidNamespace::Unreadable {
            procfs_errors += 1;
        }
        let kubernetes = self
            .kubernetes
            .as_ref()
            .map(|watch| self.kubernetes_reading(watch, &owners));
        let slurm = self.slurm_reading(cgroups_of(&owners));
        let containers = self
            .containers
            .as_ref()
            .map(|watch| watch.reading(wanted_containers(cgroups_of(&owners))));
        // Where a slow scrape's time went, for whoever profiles one.
        tracing::debug!(
            nvml_seconds = nvml_read.as_secs_f64(),
            rest_seconds = (started.elapsed() - nvml_read).as_secs_f64(),
            owners = owners.len(),
            "observed"
        );
        Observation {
            nvml,
            host_pid_namespace: pid_namespace.is_host(),
            procfs_view: looked.view,
            boot_time_unix_seconds: self.boot_time_unix_seconds,
            clock_ticks_per_second: clock_ticks_per_second(),
            owners,
            holder_scan: None,
            procfs_errors,
            kubernetes,
            slurm,
            containers,
        }
    }

    /// Whether the Slurm job steps of the processes in `cgroups` run now, looked for
    /// within the scan budget; `None` when none runs in a job.
    fn slurm_reading<'a>(
        &self,
        cgroups: impl Iterator<Item = &'a CgroupAttribution>,
    ) -> Option<SlurmReading> {
        let wanted: Vec<(u64, Option<String>)> = cgroups
            .filter_map(|cgroup| cgroup.slurm.as_ref())
            .map(|step| (step.job_id, step.step.clone()))
            .collect();
        if wanted.is_empty() {
            return None;
        }
        let deadline = Instant::now() + self.scan_budget;
        Some(lock(&self.slurmstepds).look(&self.proc_root, &wanted, deadline))
    }

    /// The holder scan, served from and adding to what earlier looks found.
    fn scan(&self, until: Option<Instant>, owners_read: OwnersRead) -> HolderScan {
        let mut memory = lock(&self.memory);
        let deadline = scan_deadline(Instant::now(), self.scan_budget, until);
        procfs::look_for_holders(
            &self.proc_root,
            self.placement,
            &mut memory,
            owners_read,
            deadline,
        )
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

/// The owners this observation read, for the holder scan that follows it.
fn owners_read(observation: &Observation) -> OwnersRead {
    let listed = observation.nvml.listed_pids();
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
            if let (Some(watch), Some(reading)) = (&host.containers, &mut observation.containers) {
                let cgroups = scan.holders.iter().map(|holder| &holder.cgroup);
                watch.add_names(reading, wanted_containers(cgroups));
            }
            // Holders in Slurm jobs, with the owners: whether their steps run, as of now.
            if scan
                .holders
                .iter()
                .any(|holder| holder.cgroup.slurm.is_some())
            {
                let holders = scan.holders.iter().map(|holder| &holder.cgroup);
                observation.slurm =
                    host.slurm_reading(cgroups_of(&observation.owners).chain(holders));
            }
            observation.holder_scan = Some(scan);
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
