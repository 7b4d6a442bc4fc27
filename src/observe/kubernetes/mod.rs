//! Kubernetes: which pod each GPU is assigned to, and the names of the pods that owners
//! and holders run in, from two local kubelet sources read on a timer of their own.
//!
//! - `pod_resources`: the pod-resources API, which says which container has which
//!   device.
//! - `pods`: the pod log directories, which name the pod of a uid ([`PodName`]): a
//!   process's cgroup gives only the uid.
//! - `watch`: the thread that refreshes both (`KubernetesWatch`).
//! - `reading`: what they said ([`KubernetesReading`]), plain serialisable data.
//! - `config`: where the sources are, and how often to read them ([`KubernetesConfig`]).
//!
//! Without a kubelet (no socket, no directory) both say `absent` and everything else
//! works as before. Joining the assigned devices to NVML's GPUs is classification
//! (`classify::pods`), not observation.

mod config;
mod pod_resources;
mod pods;
mod reading;
mod watch;

pub use config::{KubernetesConfig, DEFAULT_POD_LOGS, DEFAULT_POD_RESOURCES_SOCKET};
#[cfg(test)]
pub(crate) use reading::examples;
pub use reading::{
    DeviceAssignment, KubeletSource, KubernetesReading, PodName, SourceError, SourceHealth,
};
pub(crate) use watch::KubernetesWatch;
