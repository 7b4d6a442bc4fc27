//! The kubelet's two sources, read on a thread of their own: once at start and, for a
//! server, again every refresh interval, never in a scrape, so a hung kubelet delays
//! nothing but the next refresh. Each source keeps its last good answer, served with the
//! time it was taken, until a refresh succeeds again.

use super::config::KubernetesConfig;
use super::pod_resources::{self, nvidia_devices};
use super::pods::{read_pod_log_dirs, PodNameCache};
use super::reading::{
    DeviceAssignment, KubeletSource, KubernetesReading, SourceError, SourceHealth,
};
use crate::dates::now_unix_seconds_f64;
use crate::observe::error_line::one_line;
use crate::observe::lifespan::Lifespan;
use crate::sync::lock;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The longest one call to the kubelet may take (less when the refresh interval is shorter).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Both sources as last refreshed.
#[derive(Debug)]
struct Latest {
    pod_resources: SourceHealth,
    devices: Vec<DeviceAssignment>,
    pod_logs: SourceHealth,
    names: PodNameCache,
    /// A kubelet is expected: its paths were given, or a source was found since start.
    expected: bool,
    /// Whether the line saying that this host has no kubelet was logged.
    said_absent: bool,
}

/// The two kubelet sources, refreshed on a thread of their own.
#[derive(Debug, Clone)]
pub(crate) struct KubernetesWatch {
    latest: Arc<Mutex<Latest>>,
}

/// Which read of the sources this is, which decides what is worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// A one-shot command's only read: its output says what failed, the log nothing.
    Only,
    /// A server's first read: a failure is worth a line, a missing kubelet only a quiet one.
    First,
    /// A server's later refresh: a change of state is worth a line.
    Again,
}

impl KubernetesWatch {
    /// Reads both sources once, waiting at most for one call's timeout; for a server, a
    /// thread then refreshes them every `refresh_interval`. Only changes of state are
    /// logged, and only by a server.
    pub(crate) fn start(config: KubernetesConfig, lifespan: Lifespan) -> KubernetesWatch {
        let latest = Arc::new(Mutex::new(Latest {
            pod_resources: not_yet_read(),
            devices: Vec::new(),
            pod_logs: not_yet_read(),
            names: PodNameCache::default(),
            expected: config.expected,
            said_absent: false,
        }));
        let timeout = CALL_TIMEOUT.min(config.refresh_interval);
        let (first_done, first) = mpsc::channel();
        let shared = Arc::clone(&latest);
        let spawned = std::thread::Builder::new()
            .name("kubelet-refresh".into())
            .spawn(move || refresh_loop(&config, timeout, &shared, lifespan, first_done));
        match spawned {
            // A kubelet that hangs at start leaves the first reading "not read yet".
            Ok(_) => {
                let _ = first.recv_timeout(timeout + Duration::from_secs(1));
            }
            Err(error) => {
                tracing::error!(error = %error, "cannot start the kubelet refresh thread; pods are not named")
            }
        }
        KubernetesWatch { latest }
    }

    /// The sources as last refreshed, with the names of the pods whose uids are given.
    pub(crate) fn reading<'a>(&self, uids: impl IntoIterator<Item = &'a str>) -> KubernetesReading {
        let latest = lock(&self.latest);
        KubernetesReading {
            pod_resources: latest.pod_resources.clone(),
            devices: latest.devices.clone(),
            mig_parents: BTreeMap::new(),
            pod_logs: latest.pod_logs.clone(),
            pod_names: latest.names.names_of(uids),
            expected: latest.expected,
        }
    }

    /// Adds the names of the pods whose uids are given to `reading`.
    pub(crate) fn add_names<'a>(
        &self,
        reading: &mut KubernetesReading,
        uids: impl IntoIterator<Item = &'a str>,
    ) {
        let latest = lock(&self.latest);
        reading.pod_names.extend(latest.names.names_of(uids));
    }
}

/// A source before its first read.
fn not_yet_read() -> SourceHealth {
    SourceHealth {
        error: Some(SourceError::Unavailable),
        message: Some("not read yet".into()),
        last_success_unix_seconds: None,
    }
}

fn refresh_loop(
    config: &KubernetesConfig,
    timeout: Duration,
    latest: &Mutex<Latest>,
    lifespan: Lifespan,
    first_done: mpsc::Sender<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(error = %error, "cannot start the kubelet client; pods are not named");
            return;
        }
    };
    let mut read = match lifespan {
        Lifespan::Serving => Read::First,
        Lifespan::OneShot => Read::Only,
    };
    loop {
        refresh(config, timeout, &runtime, latest, read);
        let _ = first_done.send(());
        if read == Read::Only {
            return;
        }
        read = Read::Again;
        std::thread::sleep(config.refresh_interval);
    }
}

/// One refresh of both sources; the lock is taken only to store the results.
fn refresh(
    config: &KubernetesConfig,
    timeout: Duration,
    runtime: &tokio::runtime::Runtime,
    latest: &Mutex<Latest>,
    read: Read,
) {
    let answer = runtime.block_on(pod_resources::list(&config.pod_resources_socket, timeout));
    let listing = read_pod_log_dirs(&config.pod_logs);
    let now = now_unix_seconds_f64();
    let mut latest = lock(latest);
    let previous = latest.pod_resources.clone();
    match answer {
        Ok(answer) => {
            latest.devices = nvidia_devices(&answer);
            latest.pod_resources = SourceHealth {
                error: None,
                message: None,
                last_success_unix_seconds: Some(now),
            };
        }
        Err(error) => {
            latest.pod_resources.error = Some(error.kind());
            latest.pod_resources.message = Some(one_line(&error));
        }
    }
    log_change(
        KubeletSource::PodResources,
        &config.pod_resources_socket,
        &previous,
        &latest.pod_resources,
        (read, config.expected),
    );
    let previous = latest.pod_logs.clone();
    match listing {
        Ok(listing) => {
            latest.names.update(listing);
            latest.pod_logs = SourceHealth {
                error: None,
                message: None,
                last_success_unix_seconds: Some(now),
            };
        }
        Err(error) => {
            latest.pod_logs.error = Some(error.kind());
            latest.pod_logs.message = Some(one_line(&error));
        }
    }
    log_change(
        KubeletSource::PodLogs,
        &config.pod_logs,
        &previous,
        &latest.pod_logs,
        (read, config.expected),
    );
    let found = |health: &SourceHealth| health.error != Some(SourceError::Absent);
    let expected = latest.expected || found(&latest.pod_resources) || found(&latest.pod_logs);
    if read == Read::Again && !expected && !latest.said_absent {
        // The one line a host without Kubernetes hears about it, and no series: at the
        // second read rather than the first, so that a start-up error (a port in use)
        // stays the only line of a server that does not start.
        latest.said_absent = true;
        tracing::info!(
            pod_resources = %config.pod_resources_socket.display(),
            pod_logs = %config.pod_logs.display(),
            "no kubelet on this host; pods are not named, and its series appear once one is found"
        );
    }
    latest.expected = expected;
    tracing::debug!(
        pod_resources = latest.pod_resources.error.map_or("up", SourceError::as_str),
        pod_logs = latest.pod_logs.error.map_or("up", SourceError::as_str),
        devices = latest.devices.len(),
        pods_named = latest.names.len(),
        "kubelet sources read"
    );
}

/// Logs a source only when its state changes: when it fails in a new way, and when it
/// recovers. At start only a failure is worth a line, and an absent source only when its
/// path was given (`expected`): a host without Kubernetes hears one line about it, from
/// [`refresh`], and no more. One-shot commands say nothing: their output shows it.
fn log_change(
    source: KubeletSource,
    path: &Path,
    previous: &SourceHealth,
    now: &SourceHealth,
    (read, expected): (Read, bool),
) {
    match read {
        Read::Only => return,
        Read::Again if previous.error == now.error => return,
        Read::First | Read::Again => {}
    }
    let first = read == Read::First;
    let source = source.as_str();
    let path = path.display();
    match now.error {
        None if first => tracing::debug!(source, path = %path, "kubelet source answers"),
        None => tracing::info!(source, path = %path, "kubelet source answers"),
        Some(SourceError::Absent) if first && !expected => tracing::debug!(
            source,
            path = %path,
            "kubelet source absent (no kubelet on this host, or the path is not mounted); pods are not named"
        ),
        Some(SourceError::Absent) => tracing::info!(
            source,
            path = %path,
            "kubelet source absent (no kubelet on this host, or the path is not mounted); pods are not named"
        ),
        Some(_) => tracing::warn!(
            source,
            error = now.message.as_deref().unwrap_or_default(),
            "kubelet source failing; serving its last good answer (logged again when it changes)"
        ),
    }
}
