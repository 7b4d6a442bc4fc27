//! What the kubelet's sources said: plain data, serialisable, so a snapshot taken on one
//! machine replays to the same verdict on another.

use crate::observe::health::CallHealth;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strum::{EnumIter, IntoStaticStr};

/// Which kubelet source a reading or a series is about. Its label value is its name in
/// snake case; `KubeletSource::iter()` (strum's `IntoEnumIterator`) lists both in the
/// order metrics do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, IntoStaticStr, EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum KubeletSource {
    /// `v1.PodResourcesLister/List` on the kubelet's socket.
    PodResources,
    /// The pod log directories.
    PodLogs,
}

impl KubeletSource {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        self.into()
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

/// Why a source's last refresh failed. Its label value is its name in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
        self.into()
    }
}

/// How a kubelet source's last refresh went, and when the answer in use was taken.
pub type SourceHealth = CallHealth<SourceError>;

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

impl DeviceAssignment {
    /// The device the id names: time-slicing names each replica of a device `<id>::<n>`.
    pub fn device(&self) -> &str {
        match self.device_id.rsplit_once("::") {
            Some((device, replica)) if replica.bytes().all(|b| b.is_ascii_digit()) => device,
            _ => &self.device_id,
        }
    }
}

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodName {
    /// The namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

impl std::fmt::Display for PodName {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}/{}", self.namespace, self.name)
    }
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
    /// Whether a kubelet is expected on this host: its paths were given on the command
    /// line, or one of its sources was found since the exporter started (it may have
    /// gone since). Absent from snapshots where neither holds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expected: bool,
}

impl KubernetesReading {
    /// Whether the kubelet's sources are worth a series: a kubelet is expected here, or
    /// a source is anything but absent, or answered once. A host without Kubernetes gets
    /// no `vram_kubelet_*` series at all, rather than an `_up 0` that reads as down.
    pub fn shown(&self) -> bool {
        let found = |source: &SourceHealth| {
            source.error != Some(SourceError::Absent) || source.last_success_unix_seconds.is_some()
        };
        self.expected || found(&self.pod_resources) || found(&self.pod_logs)
    }

    /// The MIG device UUIDs among the assigned devices: what NVML must place on a GPU.
    pub(crate) fn mig_device_ids(&self) -> Vec<&str> {
        self.devices
            .iter()
            .map(DeviceAssignment::device)
            .filter(|id| id.starts_with("MIG-"))
            .collect()
    }
}

/// Readings for the tests of the kubelet's sources and of what classification makes of
/// them.
#[cfg(test)]
pub(crate) mod examples {
    use super::*;

    /// A device assigned to a container of a pod in namespace `ml`.
    pub(crate) fn assigned(
        pod: &str,
        container: &str,
        resource: &str,
        id: &str,
    ) -> DeviceAssignment {
        DeviceAssignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_id: id.into(),
        }
    }

    /// Both sources up, with `devices` assigned; NVML placed MIG device `MIG-a` on GPU
    /// `GPU-3`.
    pub(crate) fn reading(devices: Vec<DeviceAssignment>) -> KubernetesReading {
        KubernetesReading {
            pod_resources: SourceHealth::default(),
            devices,
            mig_parents: BTreeMap::from([("MIG-a".to_string(), "GPU-3".to_string())]),
            pod_logs: SourceHealth::default(),
            pod_names: BTreeMap::new(),
            expected: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::examples::{assigned, reading};
    use super::*;

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
    fn a_kubelet_is_shown_once_expected_or_found_and_never_for_a_host_without_one() {
        let absent = SourceHealth {
            error: Some(SourceError::Absent),
            message: Some("no socket".into()),
            last_success_unix_seconds: None,
        };
        let mut reading = reading(Vec::new());
        reading.pod_resources = absent.clone();
        reading.pod_logs = absent.clone();
        assert!(!reading.shown(), "a host without Kubernetes");
        let text = serde_json::to_value(&reading).unwrap();
        assert!(text.get("expected").is_none(), "{text}");

        reading.expected = true;
        assert!(
            reading.shown(),
            "paths given on the command line, or found before"
        );

        reading.expected = false;
        reading.pod_logs.error = Some(SourceError::Unreadable);
        assert!(reading.shown(), "there, but failing");

        reading.pod_logs = absent;
        reading.pod_resources.last_success_unix_seconds = Some(1.0);
        assert!(reading.shown(), "gone since it answered");
    }
}
