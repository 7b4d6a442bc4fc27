//! Observe: the only code that touches the system (NVML and `/proc`), or replays a
//! snapshot of them.

pub mod cgroup;
mod holders;
mod model;
pub mod nvml;
pub mod parse;
mod pidns;
pub mod procfs;

pub use model::*;

use self::nvml::NvmlSource;
use self::procfs::{ProcRoot, Reader, Unread};
use std::collections::{BTreeMap, HashMap};
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
    /// The process first seen under each PID that NVML lists: a PID names a process only
    /// with its start time, so a later process under the same number is someone else.
    first_seen: Mutex<HashMap<u32, Identity>>,
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
            proc_root,
            scan_budget,
            first_seen: Mutex::new(HashMap::new()),
        }
    }

    /// The `/proc` root this host reads.
    pub fn proc_root(&self) -> &ProcRoot {
        &self.proc_root
    }

    fn observe(&self) -> Observation {
        let nvml = self.nvml.read();
        let reader = Reader::new(&self.proc_root);
        let mut procfs_errors = 0;
        let mut inits =
            pidns::NamespaceInits::new(&self.proc_root, Instant::now() + self.scan_budget);
        let mut owners = BTreeMap::new();
        for pid in listed_pids(&nvml) {
            if owners.contains_key(&pid) {
                continue;
            }
            let now = match reader.procfs_pid(pid) {
                None => ProcessLookup::NotVisible,
                Some(procfs_pid) => match reader.read(procfs_pid, None) {
                    Ok((mut facts, errors)) => {
                        procfs_errors += errors;
                        // Which owners' containers have ended: a short walk up from each
                        // owner in a nested PID namespace, a pass over /proc at most once.
                        facts.pid_namespace_init = inits.of(procfs_pid);
                        ProcessLookup::Present(Box::new(facts))
                    }
                    Err(Unread::Missing) => ProcessLookup::Missing,
                    Err(Unread::Unreadable(error)) => {
                        procfs_errors += 1;
                        ProcessLookup::Unreadable { error }
                    }
                },
            };
            owners.insert(
                pid,
                OwnerLookup {
                    first_seen: None,
                    now,
                },
            );
        }
        self.remember_identities(&nvml, &mut owners);
        let host_pid_namespace = self.proc_root.host_pid_namespace();
        if host_pid_namespace.is_none() {
            procfs_errors += 1;
        }
        Observation {
            nvml,
            host_pid_namespace,
            procfs_view: reader.view(),
            boot_time_unix_seconds: self.proc_root.boot_time(),
            clock_ticks_per_second: clock_ticks_per_second(),
            owners,
            holder_scan: None,
            procfs_errors,
        }
    }

    /// Fill in each owner's first-seen identity, remembering new ones and forgetting the
    /// PIDs NVML no longer lists (on GPUs that answered: a GPU that failed this time may
    /// list them again).
    fn remember_identities(&self, nvml: &NvmlReading, owners: &mut BTreeMap<u32, OwnerLookup>) {
        let mut first_seen = crate::sync::lock(&self.first_seen);
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

/// Every PID NVML lists on a GPU that answered.
fn listed_pids(nvml: &NvmlReading) -> Vec<u32> {
    match nvml {
        NvmlReading::Up { gpus, .. } => gpus
            .iter()
            .filter_map(|gpu| match &gpu.state {
                GpuState::Ok { processes, .. } => Some(processes),
                GpuState::Failed { .. } => None,
            })
            .flatten()
            .map(|process| process.pid)
            .collect(),
        NvmlReading::Down { .. } => Vec::new(),
    }
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
    /// One observation, without the holder scan.
    pub fn observe(&self) -> Result<Observation, ObserveError> {
        match self {
            Source::Live(host) => Ok(host.observe()),
            Source::Replay(path) => read_snapshot(path),
        }
    }

    /// Adds the holder scan to `observation` (a replay keeps the scan it recorded).
    pub fn scan_holders(&self, observation: &mut Observation) {
        if let Source::Live(host) = self {
            let reader = Reader::new(&host.proc_root);
            observation.holder_scan = Some(reader.scan_holders(host.scan_budget));
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
