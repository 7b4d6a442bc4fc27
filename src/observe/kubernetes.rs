//! Kubernetes: which pod each GPU is assigned to, and the names of the pods that owners
//! and holders run in, from two local kubelet sources read on a timer of their own.
//!
//! - The pod-resources API ([`super::kubelet`]) says which container has which device.
//! - The pod log directories ([`super::pods`]) name a pod uid, which is all a process's
//!   cgroup gives.
//!
//! A refresh runs on a thread of its own every `--kubelet.refresh-interval`, never in a
//! scrape: a hung kubelet delays nothing but the next refresh. Each source keeps its last
//! good answer, served with the time it was taken, until a refresh succeeds again. Without
//! a kubelet (no socket, no directory) both say `absent` and everything else works as
//! before.

use super::kubelet;
use super::pods::{read_pod_log_dirs, PodName, PodNameCache};
use super::{GpuReading, NvmlReading};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The pod-resources socket where the kubelet makes it.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where the kubelet makes one directory per pod.
pub const DEFAULT_POD_LOGS: &str = "/var/log/pods";
/// The longest one call to the kubelet may take (less when the refresh interval is shorter).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The resource names of NVIDIA's device plugin whose devices are whole GPUs or MIG
/// devices (time-slicing adds `.shared`); only their ids may be GPU indices.
fn is_gpu_resource(resource: &str) -> bool {
    let Some(name) = resource.strip_prefix("nvidia.com/") else {
        return false;
    };
    let name = name.strip_suffix(".shared").unwrap_or(name);
    name == "gpu" || name.starts_with("mig-")
}

/// Where the kubelet's sources are, and how often to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// The pod-resources socket (in a directory mounted from the host).
    pub pod_resources_socket: PathBuf,
    /// The directory of pod log directories.
    pub pod_logs: PathBuf,
    /// Time between two refreshes.
    pub refresh_interval: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            pod_resources_socket: DEFAULT_POD_RESOURCES_SOCKET.into(),
            pod_logs: DEFAULT_POD_LOGS.into(),
            refresh_interval: Duration::from_secs(10),
        }
    }
}

/// Which kubelet source a reading or a series is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeletSource {
    /// `v1.PodResourcesLister/List` on the kubelet's socket.
    PodResources,
    /// The pod log directories.
    PodLogs,
}

impl KubeletSource {
    /// Both, in the order metrics list them.
    pub const ALL: [KubeletSource; 2] = [KubeletSource::PodResources, KubeletSource::PodLogs];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeletSource::PodResources => "pod_resources",
            KubeletSource::PodLogs => "pod_logs",
        }
    }

    /// The kinds of failure this source can have, in the order metrics list them.
    pub fn errors(self) -> &'static [SourceError] {
        match self {
            KubeletSource::PodResources => &[
                SourceError::Absent,
                SourceError::Unavailable,
                SourceError::Timeout,
                SourceError::RpcError,
                SourceError::Malformed,
            ],
            KubeletSource::PodLogs => &[SourceError::Absent, SourceError::Unreadable],
        }
    }
}

/// Why a source's last refresh failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceError {
    /// Nothing where it should be: no kubelet on this host, or the path is not mounted.
    Absent,
    /// The socket is there but the connection failed.
    Unavailable,
    /// The kubelet did not answer in time.
    Timeout,
    /// The kubelet answered with a gRPC error.
    RpcError,
    /// The answer was not the message the API defines.
    Malformed,
    /// The directory is there but could not be read.
    Unreadable,
}

impl SourceError {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceError::Absent => "absent",
            SourceError::Unavailable => "unavailable",
            SourceError::Timeout => "timeout",
            SourceError::RpcError => "rpc_error",
            SourceError::Malformed => "malformed",
            SourceError::Unreadable => "unreadable",
        }
    }
}

/// How a source's last refresh went, and when it last succeeded.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SourceHealth {
    /// Why the last refresh failed; `None` when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SourceError>,
    /// The failure in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the answer in use was taken, in seconds since the Unix epoch; `None` if never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_unix_seconds: Option<f64>,
}

impl SourceHealth {
    /// Whether the last refresh succeeded.
    pub fn up(&self) -> bool {
        self.error.is_none()
    }

    fn not_yet_read() -> SourceHealth {
        SourceHealth {
            error: Some(SourceError::Unavailable),
            message: Some("not read yet".into()),
            last_success_unix_seconds: None,
        }
    }
}

/// One NVIDIA device the kubelet has assigned to a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceAssignment {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The extended resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.18gb`, ...).
    pub resource: String,
    /// The device plugin's id of the device: a `GPU-...` or `MIG-...` UUID, or an index.
    pub device_id: String,
}

/// What the kubelet's sources said, as of one observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KubernetesReading {
    /// The pod-resources API.
    pub pod_resources: SourceHealth,
    /// NVIDIA devices assigned to containers, from its last good answer.
    #[serde(default)]
    pub devices: Vec<DeviceAssignment>,
    /// The GPU (its UUID) each MIG device the kubelet named is part of, from NVML.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_parents: BTreeMap<String, String>,
    /// The pod log directories.
    pub pod_logs: SourceHealth,
    /// Names of the pods that owners and holders run in, by pod uid.
    #[serde(default)]
    pub pod_names: BTreeMap<String, PodName>,
}

/// One container a GPU is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPod {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The extended resource it was assigned as.
    pub resource: String,
    /// The device the kubelet named (the GPU's UUID, a MIG device's, or an index),
    /// without a time-slicing replica's `::N`.
    pub device: String,
}

/// What the renderers show of Kubernetes: GPU assignments joined to NVML's GPUs, pod
/// names by uid, and the health of both sources.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KubernetesView {
    /// The pod-resources API.
    pub pod_resources: SourceHealth,
    /// The pod log directories.
    pub pod_logs: SourceHealth,
    /// Every container a GPU that NVML lists is assigned to, by GPU index.
    pub gpu_pods: Vec<GpuPod>,
    /// GPU and MIG devices the kubelet assigns that match no GPU NVML lists.
    pub unmatched_devices: u64,
    /// Pod names by uid.
    pub pod_names: BTreeMap<String, PodName>,
}

impl KubernetesView {
    /// The name of the pod with uid `uid`, when its directory was seen.
    pub fn pod_of(&self, uid: Option<&str>) -> Option<&PodName> {
        self.pod_names.get(uid?)
    }
}

impl KubernetesReading {
    /// Joins the kubelet's devices to the GPUs of `nvml`.
    pub fn view(&self, nvml: &NvmlReading) -> KubernetesView {
        let gpus: &[GpuReading] = match nvml {
            NvmlReading::Up { gpus, .. } => gpus,
            NvmlReading::Down { .. } => &[],
        };
        let mut gpu_pods = Vec::new();
        let mut unmatched_devices = 0;
        for device in &self.devices {
            match gpu_of(device, gpus, &self.mig_parents) {
                Some(gpu) => gpu_pods.push(GpuPod {
                    gpu: gpu.index,
                    uuid: gpu.uuid.clone(),
                    namespace: device.namespace.clone(),
                    pod: device.pod.clone(),
                    container: device.container.clone(),
                    resource: device.resource.clone(),
                    device: replica_of(&device.device_id).to_string(),
                }),
                None if is_gpu_resource(&device.resource) => unmatched_devices += 1,
                None => {}
            }
        }
        gpu_pods.sort_by(|a, b| {
            (a.gpu, &a.namespace, &a.pod, &a.container, &a.device).cmp(&(
                b.gpu,
                &b.namespace,
                &b.pod,
                &b.container,
                &b.device,
            ))
        });
        // Time-slicing hands one GPU out as several replicas: one series per container.
        gpu_pods.dedup();
        KubernetesView {
            pod_resources: self.pod_resources.clone(),
            pod_logs: self.pod_logs.clone(),
            gpu_pods,
            unmatched_devices,
            pod_names: self.pod_names.clone(),
        }
    }

    /// The MIG device UUIDs among the assigned devices: what NVML must place on a GPU.
    pub fn mig_device_ids(&self) -> Vec<&str> {
        self.devices
            .iter()
            .map(|device| replica_of(&device.device_id))
            .filter(|id| id.starts_with("MIG-"))
            .collect()
    }
}

/// Time-slicing names each replica of a device `<id>::<n>`.
fn replica_of(id: &str) -> &str {
    match id.rsplit_once("::") {
        Some((device, replica)) if replica.bytes().all(|b| b.is_ascii_digit()) => device,
        _ => id,
    }
}

/// The GPU a device id names: its UUID, the UUID of a MIG device on it, or (for the
/// device plugin's `index` id strategy) its index, `N` or `N:M` for MIG device M on GPU N.
fn gpu_of<'a>(
    device: &DeviceAssignment,
    gpus: &'a [GpuReading],
    mig_parents: &BTreeMap<String, String>,
) -> Option<&'a GpuReading> {
    let id = replica_of(&device.device_id);
    if id.is_empty() {
        return None;
    }
    let uuid = mig_parents.get(id).map_or(id, String::as_str);
    if let Some(gpu) = gpus.iter().find(|gpu| gpu.uuid == uuid) {
        return Some(gpu);
    }
    if !is_gpu_resource(&device.resource) {
        return None;
    }
    let index = id.split_once(':').map_or(id, |(gpu, _)| gpu);
    let index: u32 = index.parse().ok()?;
    gpus.iter().find(|gpu| gpu.index == index)
}

/// The NVIDIA devices of an answer, sorted.
pub fn nvidia_devices(answer: &kubelet::v1::ListPodResourcesResponse) -> Vec<DeviceAssignment> {
    let mut devices = Vec::new();
    for pod in &answer.pod_resources {
        for container in &pod.containers {
            for group in &container.devices {
                if !group.resource_name.starts_with("nvidia.com/") {
                    continue;
                }
                for id in &group.device_ids {
                    devices.push(DeviceAssignment {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        resource: group.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
        }
    }
    devices.sort();
    devices
}

/// Both sources as last refreshed.
#[derive(Debug)]
struct Latest {
    pod_resources: SourceHealth,
    devices: Vec<DeviceAssignment>,
    pod_logs: SourceHealth,
    names: PodNameCache,
}

/// The two kubelet sources, refreshed on a thread of their own.
#[derive(Debug, Clone)]
pub struct KubernetesWatch {
    latest: Arc<Mutex<Latest>>,
}

impl KubernetesWatch {
    /// Reads both sources once, waiting at most for one call's timeout; when
    /// `long_running`, a thread then refreshes them every `refresh_interval`. Only
    /// changes of state are logged (at info and warning level when `long_running`).
    pub fn start(config: KubernetesConfig, long_running: bool) -> KubernetesWatch {
        let latest = Arc::new(Mutex::new(Latest {
            pod_resources: SourceHealth::not_yet_read(),
            devices: Vec::new(),
            pod_logs: SourceHealth::not_yet_read(),
            names: PodNameCache::default(),
        }));
        let timeout = CALL_TIMEOUT.min(config.refresh_interval);
        let (first_done, first) = mpsc::channel();
        let shared = Arc::clone(&latest);
        let spawned = std::thread::Builder::new()
            .name("kubelet-refresh".into())
            .spawn(move || refresh_loop(&config, timeout, &shared, long_running, first_done));
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
    pub fn reading<'a>(&self, uids: impl IntoIterator<Item = &'a str>) -> KubernetesReading {
        let latest = self.lock();
        KubernetesReading {
            pod_resources: latest.pod_resources.clone(),
            devices: latest.devices.clone(),
            mig_parents: BTreeMap::new(),
            pod_logs: latest.pod_logs.clone(),
            pod_names: latest.names.names_of(uids),
        }
    }

    /// Adds the names of the pods whose uids are given to `reading`.
    pub fn add_names<'a>(
        &self,
        reading: &mut KubernetesReading,
        uids: impl IntoIterator<Item = &'a str>,
    ) {
        let latest = self.lock();
        reading.pod_names.extend(latest.names.names_of(uids));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Latest> {
        self.latest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn refresh_loop(
    config: &KubernetesConfig,
    timeout: Duration,
    latest: &Mutex<Latest>,
    long_running: bool,
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
    let mut first = true;
    loop {
        refresh(config, timeout, &runtime, latest, long_running, first);
        first = false;
        let _ = first_done.send(());
        if !long_running {
            return;
        }
        std::thread::sleep(config.refresh_interval);
    }
}

/// One refresh of both sources; the lock is taken only to store the results.
fn refresh(
    config: &KubernetesConfig,
    timeout: Duration,
    runtime: &tokio::runtime::Runtime,
    latest: &Mutex<Latest>,
    long_running: bool,
    first: bool,
) {
    let answer = runtime.block_on(kubelet::list(&config.pod_resources_socket, timeout));
    let listing = read_pod_log_dirs(&config.pod_logs);
    let now = unix_seconds();
    let mut latest = latest
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
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
            latest.pod_resources.message = Some(error.to_string());
        }
    }
    log_change(
        KubeletSource::PodResources,
        &config.pod_resources_socket,
        &previous,
        &latest.pod_resources,
        long_running,
        first,
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
            let kind = match error.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
                    SourceError::Absent
                }
                _ => SourceError::Unreadable,
            };
            latest.pod_logs.error = Some(kind);
            latest.pod_logs.message = Some(format!(
                "cannot list {}: {error}",
                config.pod_logs.display()
            ));
        }
    }
    log_change(
        KubeletSource::PodLogs,
        &config.pod_logs,
        &previous,
        &latest.pod_logs,
        long_running,
        first,
    );
    tracing::debug!(
        pod_resources = latest.pod_resources.error.map_or("up", SourceError::as_str),
        pod_logs = latest.pod_logs.error.map_or("up", SourceError::as_str),
        devices = latest.devices.len(),
        pods_named = latest.names.len(),
        "kubelet sources read"
    );
}

/// Logs a source only when its state changes: when it fails in a new way, and when it
/// recovers. At start only a failure is worth a line (at debug level otherwise: the
/// gauges say it, and a host without Kubernetes should not hear about a kubelet; a
/// start-up error such as a busy port stays the only line). One-shot commands say
/// nothing: their output shows it.
fn log_change(
    source: KubeletSource,
    path: &std::path::Path,
    previous: &SourceHealth,
    now: &SourceHealth,
    long_running: bool,
    first: bool,
) {
    if !long_running || (!first && previous.error == now.error) {
        return;
    }
    let source = source.as_str();
    let path = path.display();
    match now.error {
        None if first => tracing::debug!(source, path = %path, "kubelet source answers"),
        None => tracing::info!(source, path = %path, "kubelet source answers"),
        Some(SourceError::Absent) if first => tracing::debug!(
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

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |elapsed| elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{GpuHealth, GpuState, MemoryReading, ProcessList};

    fn gpu(index: u32) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            pci_bus_id: String::new(),
            minor: Some(index),
            state: GpuState::Ok {
                memory: MemoryReading {
                    total: 1,
                    reserved: 0,
                    used: 0,
                    free: 1,
                },
                processes: ProcessList::Listed(Vec::new()),
            },
            mig: None,
            health: GpuHealth::default(),
        }
    }

    fn assigned(pod: &str, container: &str, resource: &str, id: &str) -> DeviceAssignment {
        DeviceAssignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_id: id.into(),
        }
    }

    fn reading(devices: Vec<DeviceAssignment>) -> KubernetesReading {
        KubernetesReading {
            pod_resources: SourceHealth::default(),
            devices,
            mig_parents: BTreeMap::from([("MIG-a".to_string(), "GPU-3".to_string())]),
            pod_logs: SourceHealth::default(),
            pod_names: BTreeMap::new(),
        }
    }

    fn nvml(count: u32) -> NvmlReading {
        NvmlReading::Up {
            driver_version: String::new(),
            gpus: (0..count).map(gpu).collect(),
        }
    }

    fn placed(view: &KubernetesView) -> Vec<(u32, &str, &str)> {
        view.gpu_pods
            .iter()
            .map(|p| (p.gpu, p.pod.as_str(), p.container.as_str()))
            .collect()
    }

    #[test]
    fn devices_join_gpus_by_uuid_mig_parent_and_index() {
        let view = reading(vec![
            assigned("a", "main", "nvidia.com/gpu", "GPU-1"),
            assigned("b", "main", "nvidia.com/mig-1g.18gb", "MIG-a"),
            assigned("c", "main", "nvidia.com/gpu", "2"),
            assigned("d", "main", "nvidia.com/mig-3g.71gb", "0:1"),
            assigned("e", "main", "nvidia.com/gpu.shared", "GPU-0::3"),
        ])
        .view(&nvml(4));
        assert_eq!(
            placed(&view),
            [
                (0, "d", "main"),
                (0, "e", "main"),
                (1, "a", "main"),
                (2, "c", "main"),
                (3, "b", "main")
            ]
        );
        assert_eq!(view.gpu_pods[4].uuid, "GPU-3");
        assert_eq!(view.gpu_pods[4].device, "MIG-a");
        assert_eq!(view.unmatched_devices, 0);
    }

    #[test]
    fn devices_nvml_does_not_list_are_counted_not_placed() {
        let view = reading(vec![
            assigned("a", "main", "nvidia.com/gpu", "GPU-9"),
            assigned("b", "main", "nvidia.com/mig-1g.18gb", "MIG-unknown"),
            assigned("c", "main", "nvidia.com/gpu", "7"),
            // Not GPUs: an RDMA device of NVIDIA's network operator is neither.
            assigned("d", "main", "nvidia.com/hostdev", "0000:3b:00.1"),
            assigned("e", "main", "nvidia.com/hostdev", "1"),
        ])
        .view(&nvml(2));
        assert!(view.gpu_pods.is_empty(), "{view:?}");
        assert_eq!(view.unmatched_devices, 3);
        let down = reading(vec![assigned("a", "main", "nvidia.com/gpu", "GPU-1")]).view(
            &NvmlReading::Down {
                error: "no driver".into(),
            },
        );
        assert_eq!(down.unmatched_devices, 1);
    }

    #[test]
    fn time_sliced_replicas_of_one_container_are_one_assignment() {
        let view = reading(vec![
            assigned("a", "main", "nvidia.com/gpu.shared", "GPU-1::0"),
            assigned("a", "main", "nvidia.com/gpu.shared", "GPU-1::1"),
            assigned("b", "main", "nvidia.com/gpu.shared", "GPU-1::2"),
        ])
        .view(&nvml(2));
        assert_eq!(placed(&view), [(1, "a", "main"), (1, "b", "main")]);
        assert_eq!(view.gpu_pods[0].device, "GPU-1");
    }

    #[test]
    fn mig_device_ids_are_what_nvml_must_place() {
        let reading = reading(vec![
            assigned("a", "main", "nvidia.com/gpu", "GPU-1"),
            assigned("b", "main", "nvidia.com/mig-1g.18gb", "MIG-a"),
            assigned("c", "main", "nvidia.com/mig-1g.18gb.shared", "MIG-b::1"),
        ]);
        assert_eq!(reading.mig_device_ids(), ["MIG-a", "MIG-b"]);
    }

    #[test]
    fn only_nvidia_devices_are_kept_from_an_answer() {
        use kubelet::v1::*;
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "ml".into(),
                    containers: vec![
                        ContainerResources {
                            name: "trainer".into(),
                            devices: vec![
                                ContainerDevices {
                                    resource_name: "nvidia.com/gpu".into(),
                                    device_ids: vec!["GPU-1".into(), "GPU-0".into()],
                                    topology: None,
                                },
                                ContainerDevices {
                                    resource_name: "example.com/fpga".into(),
                                    device_ids: vec!["f0".into()],
                                    topology: None,
                                },
                            ],
                        },
                        ContainerResources {
                            name: "sidecar".into(),
                            devices: Vec::new(),
                        },
                    ],
                },
                PodResources {
                    name: "web".into(),
                    namespace: "default".into(),
                    containers: Vec::new(),
                },
            ],
        };
        let devices = nvidia_devices(&answer);
        assert_eq!(
            devices,
            [
                assigned("train", "trainer", "nvidia.com/gpu", "GPU-0"),
                assigned("train", "trainer", "nvidia.com/gpu", "GPU-1"),
            ]
        );
    }

    #[test]
    fn pod_of_looks_a_uid_up() {
        let mut reading = reading(Vec::new());
        let name = PodName {
            namespace: "ml".into(),
            name: "sglang-0".into(),
        };
        reading.pod_names.insert("u1".into(), name.clone());
        let view = reading.view(&nvml(1));
        assert_eq!(view.pod_of(Some("u1")), Some(&name));
        assert_eq!(view.pod_of(Some("u2")), None);
        assert_eq!(view.pod_of(None), None);
    }

    #[test]
    fn readings_round_trip_and_old_snapshots_lack_them() {
        let mut reading = reading(vec![assigned("a", "main", "nvidia.com/gpu", "GPU-1")]);
        reading.pod_logs = SourceHealth {
            error: Some(SourceError::Absent),
            message: Some("cannot list /var/log/pods".into()),
            last_success_unix_seconds: None,
        };
        let text = serde_json::to_value(&reading).unwrap();
        assert_eq!(text["pod_logs"]["error"], "absent");
        assert_eq!(
            serde_json::from_value::<KubernetesReading>(text).unwrap(),
            reading
        );
    }

    #[test]
    fn resources_that_may_carry_indices() {
        for gpu in [
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-1g.18gb",
            "nvidia.com/mig-2g.35gb.shared",
        ] {
            assert!(is_gpu_resource(gpu), "{gpu}");
        }
        for other in [
            "nvidia.com/hostdev",
            "amd.com/gpu",
            "gpu",
            "nvidia.com/gpus",
        ] {
            assert!(!is_gpu_resource(other), "{other}");
        }
    }
}
