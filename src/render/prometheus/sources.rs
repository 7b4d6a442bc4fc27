//! The sources asked on threads of their own: the kubelet (the pods each GPU is
//! assigned to) and the container engines, each with its health.

use super::encode::{flag, gauge, single};
use super::labels::{EngineLabel, ErrorLabel, PodLabels, SourceLabel};
use crate::classify::{
    CallHealth, Engine, EngineError, EngineHealth, KubeletSource, KubernetesView,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use std::collections::BTreeMap;
use std::fmt;
use strum::IntoEnumIterator;

/// The kubelet's view: the pods each GPU is assigned to, and the health of its sources.
pub(super) fn encode_kubernetes(
    encoder: &mut DescriptorEncoder,
    kubernetes: &KubernetesView,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_pod_info",
        "One series per container a GPU (or a MIG device on it) is assigned to, from the kubelet's pod-resources API; always 1. A GPU assigned to no pod has none.",
        kubernetes.gpu_pods.iter().map(|assigned| {
            let labels = PodLabels {
                gpu: assigned.gpu,
                uuid: assigned.uuid.clone(),
                namespace: assigned.namespace.clone(),
                pod: assigned.pod.clone(),
                container: assigned.container.clone(),
                resource: assigned.resource.clone(),
                device: assigned.device.clone(),
            };
            (labels, 1i64)
        }),
    )?;
    let health = |source: KubeletSource| match source {
        KubeletSource::PodResources => &kubernetes.pod_resources,
        KubeletSource::PodLogs => &kubernetes.pod_logs,
    };
    encode_health(
        encoder,
        [
            ("vram_kubelet_up", "1 when the last read of this kubelet source (pod_resources: the pod-resources API; pod_logs: the pod log directories) succeeded, 0 when it failed or the source is absent."),
            ("vram_kubelet_error", "1 for the kind of failure of this kubelet source's last read (absent: nothing at its path, no kubelet or not mounted; unavailable, timeout, rpc_error, malformed, unreadable); no series while it reads."),
            ("vram_kubelet_last_success_timestamp_seconds", "When the answer of this kubelet source in use was read, in seconds since the Unix epoch; 0 when it never answered. A failing source keeps serving its last good answer."),
        ],
        KubeletSource::iter().map(|source| {
            let label = SourceLabel {
                source: source.as_str(),
            };
            (label, health(source), source.errors())
        }),
    )?;
    gauge(
        encoder,
        "vram_kubelet_unmatched_devices",
        "GPU and MIG devices the kubelet assigns to containers that match no GPU NVML lists (a GPU NVML lost, or an id it cannot place).",
        single(kubernetes.unmatched_devices),
    )
}

/// The container engines' health, named as the kubelet sources' is.
pub(super) fn encode_container_engines(
    encoder: &mut DescriptorEncoder,
    engines: &BTreeMap<Engine, EngineHealth>,
) -> fmt::Result {
    encode_health(
        encoder,
        [
            ("vram_container_engine_up", "1 when the last call to this container engine's socket (docker, podman) succeeded, 0 when it failed or the socket is absent."),
            ("vram_container_engine_error", "1 for the kind of failure of this container engine's last call (absent: no socket at its path; unavailable, timeout, http_error, malformed); no series while it answers."),
            ("vram_container_engine_last_success_timestamp_seconds", "When a call to this container engine last succeeded, in seconds since the Unix epoch; 0 when none has. Containers it named stay named."),
        ],
        engines.iter().map(|(engine, health)| {
            let label = EngineLabel {
                engine: engine.as_str(),
            };
            (label, health, &EngineError::ALL[..])
        }),
    )
}

/// The three families of sources asked on a thread of their own (name and help each):
/// whether the last call succeeded, the kind of its failure (one series per kind the
/// source can have), and when one last succeeded (0 for never).
pub(super) fn encode_health<'a, L, E>(
    encoder: &mut DescriptorEncoder,
    [up, error, last_success]: [(&str, &str); 3],
    sources: impl Iterator<Item = (L, &'a CallHealth<E>, &'a [E])> + Clone,
) -> fmt::Result
where
    L: EncodeLabelSet + Clone,
    E: Copy + PartialEq + Into<&'static str> + 'a,
{
    gauge(
        encoder,
        up.0,
        up.1,
        sources
            .clone()
            .map(|(label, health, _)| (label, flag(health.up()))),
    )?;
    gauge(
        encoder,
        error.0,
        error.1,
        sources.clone().flat_map(|(label, health, kinds)| {
            kinds
                .iter()
                .filter(move |&&kind| health.error == Some(kind))
                .map(move |&kind| {
                    let labels = (label.clone(), ErrorLabel { error: kind.into() });
                    (labels, 1i64)
                })
        }),
    )?;
    gauge(
        encoder,
        last_success.0,
        last_success.1,
        sources.map(|(label, health, _)| (label, health.last_success_unix_seconds.unwrap_or(0.0))),
    )
}
