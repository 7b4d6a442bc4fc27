//! Render a [`Report`] as Prometheus metrics through prometheus-client's encoders, one
//! function per group of metric families.

use crate::classify::pods::{KubernetesView, PodName};
use crate::classify::{
    GoneReason, GpuAccount, GpuOutcome, GpuVerdict, InstanceVerdict, OwnerState, Report, Role,
};
use crate::observe::kubernetes::KubeletSource;
use crate::observe::{
    GpuError, GpuState, MemoryReading, MigDeviceReading, ProcessList, ProcfsView, RecoveryAction,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use strum::IntoEnumIterator;

/// At most this many `vram_holder_info` series per GPU: each is a label set of its own.
pub const MAX_HOLDER_SERIES_PER_GPU: usize = 16;

/// What the exporter says about itself.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    /// Crate version.
    pub version: &'static str,
    /// Source revision it was built from.
    pub revision: &'static str,
}

impl BuildInfo {
    /// This build's version and revision.
    pub fn current() -> BuildInfo {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            revision: option_env!("VRAM_EXPORTER_REVISION").unwrap_or("unknown"),
        }
    }
}

/// Choices that change which series are rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Emit `vram_process_used_bytes` for at most this many processes; `None` for none.
    pub per_process_limit: Option<usize>,
}

type Labels = Vec<(&'static str, String)>;

/// Name, help and reading of one per-GPU memory gauge.
type MemorySeries = (&'static str, &'static str, fn(&MemoryReading) -> u64);

/// Writes one gauge family with all its samples.
fn gauge<V, I>(encoder: &mut DescriptorEncoder, name: &str, help: &str, samples: I) -> fmt::Result
where
    V: prometheus_client::encoding::EncodeGaugeValue + Clone + Default,
    I: IntoIterator<Item = (Labels, V)>,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        let metric = family.encode_family(&labels)?;
        ConstGauge::new(value).encode(metric)?;
    }
    Ok(())
}

fn gpu_labels(gpu: &GpuVerdict) -> Labels {
    vec![("gpu", gpu.index.to_string()), ("uuid", gpu.uuid.clone())]
}

fn with(mut labels: Labels, key: &'static str, value: impl Into<String>) -> Labels {
    labels.push((key, value.into()));
    labels
}

/// `container_id` and `pod_uid`, empty when the process runs in neither.
fn container_labels(labels: Labels, container_id: Option<&str>, pod_uid: Option<&str>) -> Labels {
    let labels = with(labels, "container_id", container_id.unwrap_or_default());
    with(labels, "pod_uid", pod_uid.unwrap_or_default())
}

/// `namespace` and `pod`, empty when the process runs in no pod or its name is unknown.
fn pod_labels(labels: Labels, pod: Option<&PodName>) -> Labels {
    let labels = with(
        labels,
        "namespace",
        pod.map(|pod| pod.namespace.clone()).unwrap_or_default(),
    );
    with(
        labels,
        "pod",
        pod.map(|pod| pod.name.clone()).unwrap_or_default(),
    )
}

fn flag(value: bool) -> i64 {
    i64::from(value)
}

/// The GPUs that answered, with their accounts.
type Measured<'a> = [(&'a GpuVerdict, &'a GpuAccount)];

/// What one scrape spent its time on.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScrapeTiming {
    /// Seconds spent reading NVML and /proc and classifying.
    pub total_seconds: f64,
    /// Seconds of that spent on the holder scan; `None` when this scrape made none (a
    /// replayed snapshot's scan was not made now).
    pub scan_seconds: Option<f64>,
}

/// Encode every series for one report.
pub fn encode_report(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    build: &BuildInfo,
    options: &RenderOptions,
    timing: ScrapeTiming,
) -> fmt::Result {
    let measured: Vec<_> = report
        .gpus
        .iter()
        .filter_map(|gpu| gpu.account().map(|account| (gpu, account)))
        .collect();
    exporter_health(encoder, report, build)?;
    gpu_identity(encoder, &report.gpus)?;
    memory(encoder, &measured)?;
    owners(encoder, &measured)?;
    orphans(encoder, &measured)?;
    holders(encoder, &measured)?;
    holder_scan(encoder, report, timing.scan_seconds)?;
    if let Some(limit) = options.per_process_limit {
        per_process(encoder, &measured, limit)?;
    }
    if let Some(kubernetes) = &report.kubernetes {
        encode_kubernetes(encoder, kubernetes)?;
    }
    encode_mig(encoder, &report.gpus)?;
    encode_instance_verdicts(encoder, &report.gpus)?;
    encode_gpu_health(encoder, &report.gpus)?;
    gauge(
        encoder,
        "vram_scrape_duration_seconds",
        "Seconds this scrape spent reading NVML and /proc and classifying.",
        [(Labels::new(), timing.total_seconds)],
    )
}

/// Build info, NVML, and what the exporter can see of processes.
fn exporter_health(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    build: &BuildInfo,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_build_info",
        "Version and revision of the exporter and the driver it talks to; always 1.",
        [(
            vec![
                ("version", build.version.to_string()),
                ("revision", build.revision.to_string()),
                (
                    "driver_version",
                    report.driver_version.clone().unwrap_or_default(),
                ),
            ],
            1i64,
        )],
    )?;
    gauge(
        encoder,
        "vram_nvml_up",
        "1 when NVML loaded and answered this scrape, 0 when it could not be loaded or initialised.",
        [(Labels::new(), flag(report.nvml_up))],
    )?;
    gauge(
        encoder,
        "vram_host_pid_namespace",
        "1 when the exporter runs in the host PID namespace; 0 means NVML hides other namespaces' processes and unattributed memory is not called orphaned.",
        [(Labels::new(), flag(report.host_pid_namespace == Some(true)))],
    )?;
    gauge(
        encoder,
        "vram_procfs_own_pid_namespace",
        "1 when --path.procfs shows the exporter's own PID namespace, in which NVML names processes; 0 when it shows another, so owners are looked up through NSpid and those not found there are unknown.",
        [(Labels::new(), flag(report.procfs_view == ProcfsView::Own))],
    )?;
    gauge(
        encoder,
        "vram_procfs_errors",
        "Entries under /proc that existed but could not be read during this scrape.",
        [(Labels::new(), report.procfs_errors)],
    )
}

fn gpu_identity(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_info",
        "Identity of each GPU; always 1.",
        gpus.iter().map(|gpu| {
            let labels = gpu_labels(gpu);
            let labels = with(labels, "name", gpu.name.clone());
            let labels = with(labels, "pci_bus_id", gpu.pci_bus_id.clone());
            let minor = gpu.minor.map(|m| m.to_string()).unwrap_or_default();
            (with(labels, "minor", minor), 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_up",
        "1 when every NVML call for this GPU answered, 0 when one failed and its other series are missing.",
        gpus.iter()
            .map(|gpu| (gpu_labels(gpu), flag(gpu.account().is_some()))),
    )?;
    gauge(
        encoder,
        "vram_gpu_error",
        "1 for the kind of NVML failure this GPU shows (gpu_lost, reset_required, not_supported, unknown), else 0.",
        gpus.iter().flat_map(|gpu| {
            let failure = match &gpu.outcome {
                GpuOutcome::Failed { error, .. } => Some(*error),
                GpuOutcome::Measured(_) => None,
            };
            GpuError::iter().map(move |kind| {
                (
                    with(gpu_labels(gpu), "error", kind.as_str()),
                    flag(failure == Some(kind)),
                )
            })
        }),
    )
}

fn memory(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    let memory_series: [MemorySeries; 4] = [
        ("vram_total_bytes", "Installed GPU memory in bytes.", |m| m.total),
        (
            "vram_used_bytes",
            "GPU memory allocated by contexts in bytes, excluding the driver's reservation (NVML v2).",
            |m| m.used,
        ),
        (
            "vram_reserved_bytes",
            "GPU memory reserved by the driver in bytes; never owned by a process.",
            |m| m.reserved,
        ),
        ("vram_free_bytes", "GPU memory neither used nor reserved, in bytes.", |m| m.free),
    ];
    for (name, help, value) in memory_series {
        gauge(
            encoder,
            name,
            help,
            measured
                .iter()
                .map(|(gpu, account)| (gpu_labels(gpu), value(&account.memory))),
        )?;
    }
    gauge(
        encoder,
        "vram_memory_inconsistent",
        "1 when NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): the figures are clamped to the total and unattributed memory is not called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (gpu_labels(gpu), flag(account.memory_inconsistent))),
    )
}

fn owners(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_owner_processes",
        "Processes NVML charges memory to on this GPU, by state; gone means no live process holds the context any more (it exited, or its PID names another process now).",
        measured.iter().flat_map(|(gpu, account)| {
            OwnerState::ALL.into_iter().map(move |state| {
                (
                    with(gpu_labels(gpu), "state", state.as_str()),
                    account.tally.processes(state),
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_owned_bytes",
        "Bytes NVML charges to owners in each state.",
        measured.iter().flat_map(|(gpu, account)| {
            OwnerState::ALL.into_iter().map(move |state| {
                (
                    with(gpu_labels(gpu), "state", state.as_str()),
                    account.tally.bytes(state),
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_gone_owner_processes",
        "Gone owners by why: exited, or reused (the PID names another process now, one without a context on this GPU or with another start time).",
        measured.iter().flat_map(|(gpu, account)| {
            GoneReason::ALL.into_iter().map(move |reason| {
                (
                    with(gpu_labels(gpu), "reason", reason.as_str()),
                    account.gone(reason),
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_owner_processes_usage_unavailable",
        "Owners whose memory usage NVML reports as unavailable; while a live one exists, unattributed memory is not called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (gpu_labels(gpu), account.usage_unavailable_owners)),
    )?;
    gauge(
        encoder,
        "vram_exited_container_processes",
        "Live owners and culprits of this GPU whose container has ended (PID 1 of their PID namespace exited): they survived the SIGKILL that ends a container, typically stuck in the driver.",
        measured.iter().map(|(gpu, account)| {
            (gpu_labels(gpu), account.exited_container_processes())
        }),
    )
}

fn orphans(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_orphaned_bytes",
        "GPU memory held without a live owner: charged to gone owners (owner_gone) or charged to nobody above the noise floor (unattributed).",
        measured.iter().flat_map(|(gpu, account)| {
            [
                (
                    with(gpu_labels(gpu), "reason", "owner_gone"),
                    account.orphaned_owner_gone_bytes,
                ),
                (
                    with(gpu_labels(gpu), "reason", "unattributed"),
                    account.orphaned_unattributed_bytes(),
                ),
            ]
        }),
    )?;
    gauge(
        encoder,
        "vram_unattributed_bytes",
        "Used bytes charged to no listed process, above the per-context noise floor; reported even when it cannot be called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (gpu_labels(gpu), account.unattributed_bytes)),
    )
}

fn holders(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_holder_processes",
        "Processes holding this GPU's device file while it has orphaned memory, by role: culprit (holds a context here: its end frees the memory), bystander (no context here: an NVML client or another GPU's job, never blamed), undetermined (mappings unreadable). 0 while nothing is orphaned.",
        measured.iter().flat_map(|(gpu, account)| {
            Role::ALL.into_iter().map(move |role| {
                (
                    with(gpu_labels(gpu), "role", role.as_str()),
                    account.holders(role).len() as u64,
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_holder_info",
        "One series per culprit: a process with a context on this GPU that keeps its orphaned memory alive, named by PID and start time; always 1.",
        measured.iter().flat_map(|(gpu, account)| {
            account
                .culprits
                .iter()
                .take(MAX_HOLDER_SERIES_PER_GPU)
                .map(move |culprit| {
                    let process = &culprit.process;
                    let labels = with(gpu_labels(gpu), "pid", process.pid.to_string());
                    let started = process
                        .started_unix_seconds
                        .map(|seconds| seconds.to_string())
                        .unwrap_or_default();
                    let labels = with(labels, "start_time", started);
                    let labels = with(labels, "comm", process.comm.clone());
                    let labels = with(labels, "state", process.state.owner_state().as_str());
                    let labels = container_labels(
                        labels,
                        process.cgroup.container_id.as_deref(),
                        process.cgroup.pod_uid.as_deref(),
                    );
                    let labels = pod_labels(labels, process.pod.as_ref());
                    (labels, 1i64)
                })
        }),
    )
}

fn holder_scan(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    scan_seconds: Option<f64>,
) -> fmt::Result {
    let scan = report.holder_scan;
    gauge(
        encoder,
        "vram_holder_scan_complete",
        "0 when this scrape's scan for device-file holders was cut short or denied, so holders may be missing; 1 otherwise, also when no scan was needed.",
        [(Labels::new(), flag(scan.is_none_or(|scan| scan.complete)))],
    )?;
    gauge(
        encoder,
        "vram_holder_scan_duration_seconds",
        "Seconds this scrape's scan for device-file holders took; 0 when no GPU had orphaned memory.",
        [(Labels::new(), scan_seconds.unwrap_or(0.0))],
    )
}

fn per_process(
    encoder: &mut DescriptorEncoder,
    measured: &Measured<'_>,
    limit: usize,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_process_used_bytes",
        "Bytes NVML charges each process on each GPU (opt-in, capped).",
        measured
            .iter()
            .flat_map(|(gpu, account)| {
                account.owners.iter().map(move |owner| {
                    let labels = with(gpu_labels(gpu), "pid", owner.pid.to_string());
                    let labels = with(labels, "comm", owner.comm().unwrap_or_default().to_string());
                    let labels = with(labels, "state", owner.state.as_str());
                    let process = owner.process.as_deref();
                    let labels = container_labels(
                        labels,
                        process.and_then(|process| process.cgroup.container_id.as_deref()),
                        process.and_then(|process| process.cgroup.pod_uid.as_deref()),
                    );
                    let labels =
                        pod_labels(labels, process.and_then(|process| process.pod.as_ref()));
                    (labels, owner.used_bytes.unwrap_or(0))
                })
            })
            .take(limit),
    )
}

/// The kubelet's view: the pods each GPU is assigned to, and the health of its sources.
fn encode_kubernetes(encoder: &mut DescriptorEncoder, kubernetes: &KubernetesView) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_pod_info",
        "One series per container a GPU (or a MIG device on it) is assigned to, from the kubelet's pod-resources API; always 1. A GPU assigned to no pod has none.",
        kubernetes.gpu_pods.iter().map(|assigned| {
            let labels = vec![
                ("gpu", assigned.gpu.to_string()),
                ("uuid", assigned.uuid.clone()),
                ("namespace", assigned.namespace.clone()),
                ("pod", assigned.pod.clone()),
                ("container", assigned.container.clone()),
                ("resource", assigned.resource.clone()),
                ("device", assigned.device.clone()),
            ];
            (labels, 1i64)
        }),
    )?;
    let health = |source: KubeletSource| match source {
        KubeletSource::PodResources => &kubernetes.pod_resources,
        KubeletSource::PodLogs => &kubernetes.pod_logs,
    };
    gauge(
        encoder,
        "vram_kubelet_up",
        "1 when the last read of this kubelet source (pod_resources: the pod-resources API; pod_logs: the pod log directories) succeeded, 0 when it failed or the source is absent.",
        KubeletSource::iter()
            .map(|source| (vec![("source", source.as_str().to_string())], flag(health(source).up()))),
    )?;
    gauge(
        encoder,
        "vram_kubelet_error",
        "1 for the kind of failure of this kubelet source's last read (absent: nothing at its path, no kubelet or not mounted; unavailable, timeout, rpc_error, malformed, unreadable), else 0.",
        KubeletSource::iter().flat_map(|source| {
            let failure = health(source).error;
            source.errors().iter().map(move |&kind| {
                let labels = vec![
                    ("source", source.as_str().to_string()),
                    ("error", kind.as_str().to_string()),
                ];
                (labels, flag(failure == Some(kind)))
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_kubelet_last_success_timestamp_seconds",
        "When the answer of this kubelet source in use was read, in seconds since the Unix epoch; 0 when it never answered. A failing source keeps serving its last good answer.",
        KubeletSource::iter().map(|source| {
            (
                vec![("source", source.as_str().to_string())],
                health(source).last_success_unix_seconds.unwrap_or(0.0),
            )
        }),
    )?;
    gauge(
        encoder,
        "vram_kubelet_unmatched_devices",
        "GPU and MIG devices the kubelet assigns to containers that match no GPU NVML lists (a GPU NVML lost, or an id it cannot place).",
        [(Labels::new(), kubernetes.unmatched_devices)],
    )
}

// MIG devices and what the driver says a GPU needs (issue 13).

/// Writes one counter family; prometheus-client appends `_total` to `name`.
fn counter<I>(encoder: &mut DescriptorEncoder, name: &str, help: &str, samples: I) -> fmt::Result
where
    I: IntoIterator<Item = (Labels, u64)>,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        let metric = family.encode_family(&labels)?;
        ConstCounter::new(value).encode(metric)?;
    }
    Ok(())
}

/// The labels of a MIG device: its parent's, then dcgm-exporter's names for the GPU
/// instance id and profile and DCGM's entity name for the compute instance id, so
/// queries can join with `DCGM_FI_*` series.
fn mig_labels(gpu: &GpuVerdict, device: &MigDeviceReading) -> Labels {
    let id = |id: Option<u32>| id.map(|id| id.to_string()).unwrap_or_default();
    let labels = with(gpu_labels(gpu), "GPU_I_ID", id(device.gpu_instance_id));
    let labels = with(labels, "GPU_CI_ID", id(device.compute_instance_id));
    with(labels, "GPU_I_PROFILE", device.profile.clone())
}

/// The labels of a MIG instance's verdict, the same as its device's.
fn instance_labels(gpu: &GpuVerdict, instance: &InstanceVerdict) -> Labels {
    let id = |id: Option<u32>| id.map(|id| id.to_string()).unwrap_or_default();
    let labels = with(gpu_labels(gpu), "GPU_I_ID", id(instance.gpu_instance_id));
    let labels = with(labels, "GPU_CI_ID", id(instance.compute_instance_id));
    with(labels, "GPU_I_PROFILE", instance.profile.clone())
}

/// The verdict on each MIG instance: owners by state, orphaned memory by reason, and the
/// holders of its capability nodes by role.
fn encode_instance_verdicts(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    let measured: Vec<(&GpuVerdict, &InstanceVerdict, &GpuAccount)> = gpus
        .iter()
        .flat_map(|gpu| {
            gpu.instances
                .iter()
                .filter_map(move |instance| Some((gpu, instance, instance.account()?)))
        })
        .collect();
    gauge(
        encoder,
        "vram_mig_owner_processes",
        "Processes NVML charges memory to in this MIG instance, by state (as vram_owner_processes).",
        measured.iter().flat_map(|(gpu, instance, account)| {
            OwnerState::ALL.into_iter().map(move |state| {
                (
                    with(instance_labels(gpu, instance), "state", state.as_str()),
                    account.tally.processes(state),
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_orphaned_bytes",
        "Memory of this MIG instance held without a live owner, by reason (as vram_orphaned_bytes).",
        measured.iter().flat_map(|(gpu, instance, account)| {
            [
                (
                    with(instance_labels(gpu, instance), "reason", "owner_gone"),
                    account.orphaned_owner_gone_bytes,
                ),
                (
                    with(instance_labels(gpu, instance), "reason", "unattributed"),
                    account.orphaned_unattributed_bytes(),
                ),
            ]
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_holder_processes",
        "Processes holding this MIG instance's capability nodes while it has orphaned memory, by role (as vram_holder_processes).",
        measured.iter().flat_map(|(gpu, instance, account)| {
            Role::ALL.into_iter().map(move |role| {
                (
                    with(instance_labels(gpu, instance), "role", role.as_str()),
                    account.holders(role).len() as u64,
                )
            })
        }),
    )
}

/// Every MIG device of every GPU with MIG enabled.
fn mig_devices(gpus: &[GpuVerdict]) -> impl Iterator<Item = (&GpuVerdict, &MigDeviceReading)> {
    gpus.iter().flat_map(|gpu| {
        gpu.mig
            .iter()
            .flat_map(|mig| &mig.devices)
            .map(move |device| (gpu, device))
    })
}

/// A MIG device's memory and processes, when its calls answered.
fn mig_measured(device: &MigDeviceReading) -> Option<(&MemoryReading, &ProcessList)> {
    match &device.state {
        GpuState::Ok { memory, processes } => Some((memory, processes)),
        GpuState::Failed { .. } => None,
    }
}

fn encode_mig(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    let with_mig: Vec<_> = gpus
        .iter()
        .filter_map(|gpu| gpu.mig.as_ref().map(|mig| (gpu, mig)))
        .collect();
    gauge(
        encoder,
        "vram_gpu_mig_mode",
        "1 when MIG is enabled on this GPU, 0 when disabled; absent for GPUs without MIG. Read at most every 30 s: it changes only at a GPU reset.",
        with_mig
            .iter()
            .map(|(gpu, mig)| (gpu_labels(gpu), flag(mig.enabled))),
    )?;
    gauge(
        encoder,
        "vram_gpu_mig_mode_pending",
        "The MIG mode this GPU takes at its next reset (1 enabled, 0 disabled); differs from vram_gpu_mig_mode while a change waits for the reset, and shows a change within 30 s.",
        with_mig
            .iter()
            .map(|(gpu, mig)| (gpu_labels(gpu), flag(mig.pending))),
    )?;
    gauge(
        encoder,
        "vram_mig_info",
        "Identity of each MIG device (a compute instance inside a GPU instance); always 1.",
        mig_devices(gpus).map(|(gpu, device)| {
            let labels = with(mig_labels(gpu, device), "mig_uuid", device.uuid.clone());
            (with(labels, "name", device.name.clone()), 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_up",
        "1 when this MIG device's memory and process calls answered, 0 when one failed and its other series are missing.",
        mig_devices(gpus).map(|(gpu, device)| {
            (
                mig_labels(gpu, device),
                flag(mig_measured(device).is_some()),
            )
        }),
    )?;
    let memory_series: [MemorySeries; 4] = [
        (
            "vram_mig_total_bytes",
            "Memory of this MIG device's GPU instance in bytes.",
            |m| m.total,
        ),
        (
            "vram_mig_used_bytes",
            "Memory allocated in this MIG device in bytes, excluding the driver's reservation (NVML v2).",
            |m| m.used,
        ),
        (
            "vram_mig_reserved_bytes",
            "Memory of this MIG device reserved by the driver in bytes.",
            |m| m.reserved,
        ),
        (
            "vram_mig_free_bytes",
            "Memory of this MIG device neither used nor reserved, in bytes.",
            |m| m.free,
        ),
    ];
    for (name, help, value) in memory_series {
        gauge(
            encoder,
            name,
            help,
            mig_devices(gpus).filter_map(|(gpu, device)| {
                mig_measured(device).map(|(memory, _)| (mig_labels(gpu, device), value(memory)))
            }),
        )?;
    }
    gauge(
        encoder,
        "vram_mig_processes",
        "Processes NVML lists in this MIG device (compute, graphics and MPS, once each); with a refused list, those of the lists that answered.",
        mig_devices(gpus).filter_map(|(gpu, device)| {
            mig_measured(device).map(|(_, processes)| {
                (
                    mig_labels(gpu, device),
                    processes.entries().len() as u64,
                )
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_process_list_denied",
        "1 when NVML refused a process list of this MIG device (no permission): who owns its memory cannot be told.",
        mig_devices(gpus).filter_map(|(gpu, device)| {
            mig_measured(device).map(|(_, processes)| {
                (
                    mig_labels(gpu, device),
                    flag(processes.denied().is_some()),
                )
            })
        }),
    )
}

fn encode_gpu_health(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_process_list_denied",
        "1 when NVML refused a process list of this GPU (no permission; a MIG GPU's aggregate lists need root) and its MIG devices could not make up for it: memory no listed process is charged for is not called orphaned.",
        gpus.iter().filter_map(|gpu| {
            gpu.account()
                .map(|account| (gpu_labels(gpu), flag(account.processes_denied.is_some())))
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_recovery_action",
        "1 for the recovery action the driver asks for (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, system_reboot; unknown for a value this exporter does not know), else 0; absent where the driver cannot say (before 565).",
        gpus.iter().flat_map(|gpu| {
            gpu.health.recovery_action.into_iter().flat_map(move |action| {
                recovery_labels().map(move |name| {
                    (
                        with(gpu_labels(gpu), "action", name),
                        flag(action.as_str() == name),
                    )
                })
            })
        }),
    )?;
    let rows = |gpu: &GpuVerdict| gpu.health.remapped_rows;
    gauge(
        encoder,
        "vram_gpu_remapped_rows",
        "Memory rows this GPU has remapped to spare rows, by the errors that caused it (correctable, uncorrectable); absent on GPUs without row remapping.",
        gpus.iter().flat_map(|gpu| {
            rows(gpu).into_iter().flat_map(move |rows| {
                [
                    (
                        with(gpu_labels(gpu), "cause", "correctable"),
                        u64::from(rows.correctable),
                    ),
                    (
                        with(gpu_labels(gpu), "cause", "uncorrectable"),
                        u64::from(rows.uncorrectable),
                    ),
                ]
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_row_remap_pending",
        "1 when a row remapping waits for the next reset of this GPU.",
        gpus.iter()
            .filter_map(|gpu| rows(gpu).map(|rows| (gpu_labels(gpu), flag(rows.pending)))),
    )?;
    gauge(
        encoder,
        "vram_gpu_row_remap_failure",
        "1 when a row remapping of this GPU failed (no spare row left): the GPU should be replaced.",
        gpus.iter().filter_map(|gpu| {
            rows(gpu).map(|rows| (gpu_labels(gpu), flag(rows.failure)))
        }),
    )?;
    let pages = |gpu: &GpuVerdict| gpu.health.retired_pages;
    gauge(
        encoder,
        "vram_gpu_retired_pages",
        "Memory pages this GPU has retired, by cause (multiple_single_bit_ecc, double_bit_ecc); absent on GPUs that remap rows instead.",
        gpus.iter().flat_map(|gpu| {
            pages(gpu).into_iter().flat_map(move |pages| {
                [
                    (
                        with(gpu_labels(gpu), "cause", "multiple_single_bit_ecc"),
                        u64::from(pages.multiple_single_bit_ecc),
                    ),
                    (
                        with(gpu_labels(gpu), "cause", "double_bit_ecc"),
                        u64::from(pages.double_bit_ecc),
                    ),
                ]
            })
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_retired_pages_pending",
        "1 when page retirements of this GPU wait for the next reboot or reset.",
        gpus.iter()
            .filter_map(|gpu| pages(gpu).map(|pages| (gpu_labels(gpu), flag(pages.pending)))),
    )?;
    gauge(
        encoder,
        "vram_gpu_memory_os_managed",
        "1 when this GPU's memory is a NUMA node the operating system manages (GH200, GB200 in NUMA mode): used memory then includes pages kept after processes exit, and memory charged to no process is normal.",
        gpus.iter().map(|gpu| {
            (gpu_labels(gpu), flag(gpu.health.numa_node.is_some()))
        }),
    )?;
    gauge(
        encoder,
        "vram_xid_watched",
        "1 while the exporter receives this GPU's critical Xid events, 0 when it cannot (not supported, NVML failing); absent outside the server.",
        gpus.iter().filter_map(|gpu| {
            gpu.health
                .xid
                .as_ref()
                .map(|xid| (gpu_labels(gpu), flag(xid.watched)))
        }),
    )?;
    counter(
        encoder,
        "vram_xid_errors",
        "Critical Xid errors NVML reported for this GPU since the exporter started, by Xid (79: fallen off the bus; 999: an Xid NVML cannot name).",
        gpus.iter().flat_map(|gpu| {
            gpu.health.xid.iter().flat_map(move |xid| {
                xid.counts
                    .iter()
                    .map(move |(number, count)| (with(gpu_labels(gpu), "xid", number.to_string()), *count))
            })
        }),
    )
}

/// Label values of `vram_gpu_recovery_action`: every named action, then `unknown`.
fn recovery_labels() -> impl Iterator<Item = &'static str> {
    RecoveryAction::iter().map(RecoveryAction::as_str)
}
