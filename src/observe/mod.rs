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

pub use model::*;

use self::nvml::NvmlSource;
use self::procfs::ProcRoot;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why an observation could not be made at all.
#[derive(Debug, Error)]
pub enum ObserveError {
    /// The replay file could not be read.
    #[error("cannot read snapshot {path}: {source}")]
    ReadSnapshot {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The replay file is not a snapshot.
    #[error("{path} is not a vram-exporter snapshot: {source}")]
    ParseSnapshot {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
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
            mig_minors: proc_root.root.join(mig::MIG_MINORS),
            proc_root,
            scan_budget,
        }
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
        let mut nvml = self.nvml.read();
        mig::attach_capabilities(&mut nvml, &self.mig_minors);
        // Every PID listed on a GPU or on one of its MIG devices.
        let listed: Vec<u32> = match &nvml {
            NvmlReading::Up { gpus, .. } => gpus
                .iter()
                .flat_map(|gpu| {
                    let instances = gpu.mig.iter().flat_map(|mig| &mig.devices);
                    std::iter::once(&gpu.state).chain(instances.map(|device| &device.state))
                })
                .filter_map(|state| match state {
                    GpuState::Ok { processes, .. } => Some(processes.entries()),
                    GpuState::Failed { .. } => None,
                })
                .flatten()
                .map(|process| process.pid)
                .collect(),
            NvmlReading::Down { .. } => Vec::new(),
        };
        let mut processes = BTreeMap::new();
        let mut procfs_errors = 0;
        for pid in listed {
            if processes.contains_key(&pid) {
                continue;
            }
            let (lookup, errors) = self.proc_root.lookup(pid);
            procfs_errors += errors;
            processes.insert(pid, lookup);
        }
        // Which owners' containers have ended: a short walk up from each owner in a
        // nested PID namespace, a pass over /proc at most once.
        let mut inits =
            pidns::NamespaceInits::new(&self.proc_root, Instant::now() + self.scan_budget);
        for (pid, lookup) in &mut processes {
            if let ProcessLookup::Present(facts) = lookup {
                facts.pid_namespace_init = inits.of(*pid);
            }
        }
        let host_pid_namespace = self.proc_root.host_pid_namespace();
        if host_pid_namespace.is_none() {
            procfs_errors += 1;
        }
        Observation {
            nvml,
            host_pid_namespace,
            processes,
            holder_scan: None,
            procfs_errors,
        }
    }
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
            let scan = host
                .proc_root
                .scan_holders(std::process::id(), host.scan_budget);
            observation.holder_scan = Some(scan);
        }
    }
}

/// Reads a snapshot written by `vram-exporter snapshot`.
pub fn read_snapshot(path: &Path) -> Result<Observation, ObserveError> {
    let text = std::fs::read_to_string(path).map_err(|source| ObserveError::ReadSnapshot {
        path: path.to_path_buf(),
        source,
    })?;
    let snapshot: Snapshot =
        serde_json::from_str(&text).map_err(|source| ObserveError::ParseSnapshot {
            path: path.to_path_buf(),
            source,
        })?;
    if snapshot.format != Snapshot::FORMAT {
        return Err(ObserveError::SnapshotFormat {
            path: path.to_path_buf(),
            format: snapshot.format,
        });
    }
    Ok(snapshot.observation)
}
