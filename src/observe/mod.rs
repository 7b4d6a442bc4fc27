//! Observe: the only code that touches the system (NVML and `/proc`), or replays a
//! snapshot of them.

pub mod cgroup;
mod holders;
mod model;
pub mod nvml;
pub mod parse;
mod pidns;
pub mod procfs;

pub mod kubelet;
pub mod kubernetes;
pub mod pods;

pub use model::*;

use self::kubernetes::{KubernetesConfig, KubernetesWatch};
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
    /// The kubelet's sources, when they are watched.
    kubernetes: Option<KubernetesWatch>,
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
        processes: &BTreeMap<u32, ProcessLookup>,
    ) -> KubernetesReading {
        let uids = processes.values().filter_map(|lookup| match lookup {
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

    /// The `/proc` root this host reads.
    pub fn proc_root(&self) -> &ProcRoot {
        &self.proc_root
    }

    fn observe(&self) -> Observation {
        let nvml = self.nvml.read();
        let listed: Vec<u32> = match &nvml {
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
        let kubernetes = self
            .kubernetes
            .as_ref()
            .map(|watch| self.kubernetes_reading(watch, &processes));
        Observation {
            nvml,
            host_pid_namespace,
            processes,
            holder_scan: None,
            procfs_errors,
            kubernetes,
        }
    }
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

    /// Adds the holder scan to `observation` (a replay keeps the scan it recorded).
    pub fn scan_holders(&self, observation: &mut Observation) {
        if let Source::Live(host) = self {
            let scan = host
                .proc_root
                .scan_holders(std::process::id(), host.scan_budget);
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
