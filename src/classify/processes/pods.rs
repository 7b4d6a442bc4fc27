//! The kubelet's view joined to NVML's: which GPU each device the kubelet assigns is
//! (by UUID, a MIG device's parent, or the device plugin's index), one assignment per
//! container however many time-slicing replicas it got, and pod names by uid. Pure: a
//! function of the two readings, as the rest of classification is.

pub use crate::observe::kubernetes::PodName;
use crate::observe::kubernetes::{DeviceAssignment, KubernetesReading, SourceHealth};
use crate::observe::{GpuReading, NvmlReading};
use serde::Serialize;
use std::collections::BTreeMap;

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

/// Joins the kubelet's devices in `kubernetes` to the GPUs of `nvml`.
pub fn kubernetes_view(kubernetes: &KubernetesReading, nvml: &NvmlReading) -> KubernetesView {
    let gpus: &[GpuReading] = match nvml {
        NvmlReading::Up { gpus, .. } => gpus,
        NvmlReading::Down { .. } => &[],
    };
    let mut gpu_pods = Vec::new();
    let mut unmatched_devices = 0;
    for device in &kubernetes.devices {
        match gpu_of(device, gpus, &kubernetes.mig_parents) {
            Some(gpu) => gpu_pods.push(GpuPod {
                gpu: gpu.index,
                uuid: gpu.uuid.clone(),
                namespace: device.namespace.clone(),
                pod: device.pod.clone(),
                container: device.container.clone(),
                resource: device.resource.clone(),
                device: device.device().to_string(),
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
        pod_resources: kubernetes.pod_resources.clone(),
        pod_logs: kubernetes.pod_logs.clone(),
        gpu_pods,
        unmatched_devices,
        pod_names: kubernetes.pod_names.clone(),
    }
}

/// The resource names of NVIDIA's device plugin whose devices are whole GPUs or MIG
/// devices (time-slicing adds `.shared`); only their ids may be GPU indices.
fn is_gpu_resource(resource: &str) -> bool {
    let Some(name) = resource.strip_prefix("nvidia.com/") else {
        return false;
    };
    let name = name.strip_suffix(".shared").unwrap_or(name);
    name == "gpu" || name.starts_with("mig-")
}

/// The GPU a device id names: its UUID, the UUID of a MIG device on it, or (for the
/// device plugin's `index` id strategy) its index, `N` or `N:M` for MIG device M on GPU N.
fn gpu_of<'a>(
    device: &DeviceAssignment,
    gpus: &'a [GpuReading],
    mig_parents: &BTreeMap<String, String>,
) -> Option<&'a GpuReading> {
    let id = device.device();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::kubernetes::examples::{assigned, reading};
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
        let view = kubernetes_view(
            &reading(vec![
                assigned("a", "main", "nvidia.com/gpu", "GPU-1"),
                assigned("b", "main", "nvidia.com/mig-1g.18gb", "MIG-a"),
                assigned("c", "main", "nvidia.com/gpu", "2"),
                assigned("d", "main", "nvidia.com/mig-3g.71gb", "0:1"),
                assigned("e", "main", "nvidia.com/gpu.shared", "GPU-0::3"),
            ]),
            &nvml(4),
        );
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
        let view = kubernetes_view(
            &reading(vec![
                assigned("a", "main", "nvidia.com/gpu", "GPU-9"),
                assigned("b", "main", "nvidia.com/mig-1g.18gb", "MIG-unknown"),
                assigned("c", "main", "nvidia.com/gpu", "7"),
                // Not GPUs: an RDMA device of NVIDIA's network operator is neither.
                assigned("d", "main", "nvidia.com/hostdev", "0000:3b:00.1"),
                assigned("e", "main", "nvidia.com/hostdev", "1"),
            ]),
            &nvml(2),
        );
        assert!(view.gpu_pods.is_empty(), "{view:?}");
        assert_eq!(view.unmatched_devices, 3);
        let down = kubernetes_view(
            &reading(vec![assigned("a", "main", "nvidia.com/gpu", "GPU-1")]),
            &NvmlReading::Down {
                error: "no driver".into(),
                reason: crate::observe::NvmlFailure::Missing,
                stuck: None,
            },
        );
        assert_eq!(down.unmatched_devices, 1);
    }

    #[test]
    fn time_sliced_replicas_of_one_container_are_one_assignment() {
        let view = kubernetes_view(
            &reading(vec![
                assigned("a", "main", "nvidia.com/gpu.shared", "GPU-1::0"),
                assigned("a", "main", "nvidia.com/gpu.shared", "GPU-1::1"),
                assigned("b", "main", "nvidia.com/gpu.shared", "GPU-1::2"),
            ]),
            &nvml(2),
        );
        assert_eq!(placed(&view), [(1, "a", "main"), (1, "b", "main")]);
        assert_eq!(view.gpu_pods[0].device, "GPU-1");
    }

    #[test]
    fn pod_of_looks_a_uid_up() {
        let mut reading = reading(Vec::new());
        let name = PodName {
            namespace: "ml".into(),
            name: "sglang-0".into(),
        };
        reading.pod_names.insert("u1".into(), name.clone());
        let view = kubernetes_view(&reading, &nvml(1));
        assert_eq!(view.pod_of(Some("u1")), Some(&name));
        assert_eq!(view.pod_of(Some("u2")), None);
        assert_eq!(view.pod_of(None), None);
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
