//! Render a [`Report`] as Prometheus metrics through prometheus-client's encoders, one
//! function per group of metric families. Every label set is a typed struct (its fields
//! in the order the labels are written); every figure and every label value comes from
//! the classifier.

use crate::classify::{
    CallHealth, Engine, EngineError, EngineHealth, ExporterProcess, GoneReason, GpuAccount,
    GpuError, GpuVerdict, InstanceVerdict, KubeletSource, KubernetesView, MemoryReading,
    OrphanReason, OwnerState, PodName, Process, ProcfsView, RecoveryAction, Report, Role, Seen,
    StateTally,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::fmt;
use strum::{IntoEnumIterator, VariantArray};

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

// Label sets.

/// A series without labels.
#[derive(Debug, Clone, EncodeLabelSet)]
struct NoLabels {}

/// `vram_build_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
    driver_version: String,
}

/// Which GPU: the labels every per-GPU series starts with.
#[derive(Debug, Clone, EncodeLabelSet)]
struct GpuLabels {
    gpu: u32,
    uuid: String,
}

impl GpuLabels {
    fn of(gpu: &GpuVerdict) -> GpuLabels {
        GpuLabels {
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
        }
    }
}

/// `vram_gpu_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct GpuInfoLabels {
    #[prometheus(flatten)]
    gpu: GpuLabels,
    name: String,
    pci_bus_id: String,
    minor: Option<u32>,
}

/// Which MIG device: its parent's labels, then dcgm-exporter's names for the GPU instance
/// id and profile and DCGM's entity name for the compute instance id, so queries can join
/// with `DCGM_FI_*` series.
#[allow(non_snake_case)]
#[derive(Debug, Clone, EncodeLabelSet)]
struct MigLabels {
    #[prometheus(flatten)]
    gpu: GpuLabels,
    GPU_I_ID: Option<u32>,
    GPU_CI_ID: Option<u32>,
    GPU_I_PROFILE: String,
}

impl MigLabels {
    fn of(gpu: &GpuVerdict, instance: &InstanceVerdict) -> MigLabels {
        MigLabels {
            gpu: GpuLabels::of(gpu),
            GPU_I_ID: instance.gpu_instance_id,
            GPU_CI_ID: instance.compute_instance_id,
            GPU_I_PROFILE: instance.profile.clone(),
        }
    }
}

/// `vram_mig_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct MigInfoLabels {
    #[prometheus(flatten)]
    device: MigLabels,
    mig_uuid: String,
    name: String,
}

/// Where a process runs: `container_id` and `pod_uid`, then `namespace` and `pod`, then
/// its container's name and image, then its Slurm job's id, step and user; each empty
/// when the process runs in none or its pod's or container's name is unknown. Only per-process series carry them: on a per-GPU series they
/// would multiply its series by the workloads that come and go.
#[derive(Debug, Clone, EncodeLabelSet)]
struct PlaceLabels {
    container_id: Option<String>,
    pod_uid: Option<String>,
    namespace: Option<String>,
    pod: Option<String>,
    container_name: Option<String>,
    container_image: Option<String>,
    slurm_job_id: Option<u64>,
    slurm_step: Option<String>,
    slurm_user: Option<String>,
}

impl PlaceLabels {
    fn of(process: Option<&Process>) -> PlaceLabels {
        let pod: Option<&PodName> = process.and_then(|process| process.pod.as_ref());
        let job = process.and_then(|process| process.slurm_job.as_ref());
        let container = process.and_then(|process| process.container.as_ref());
        PlaceLabels {
            container_id: process.and_then(|process| process.cgroup.container_id.clone()),
            pod_uid: process.and_then(|process| process.cgroup.pod_uid.clone()),
            namespace: pod.map(|pod| pod.namespace.clone()),
            pod: pod.map(|pod| pod.name.clone()),
            container_name: container.map(|container| container.name.clone()),
            container_image: container.and_then(|container| container.image.clone()),
            slurm_job_id: job.map(|job| job.job_id),
            slurm_step: job.and_then(|job| job.step.clone()),
            slurm_user: job.and_then(|job| job.user.clone()),
        }
    }
}

/// `vram_holder_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct HolderLabels {
    #[prometheus(flatten)]
    gpu: GpuLabels,
    pid: u32,
    start_time: Option<u64>,
    comm: String,
    state: &'static str,
    #[prometheus(flatten)]
    place: PlaceLabels,
}

/// `vram_left_behind_since_timestamp_seconds`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct LeftBehindLabels {
    #[prometheus(flatten)]
    gpu: GpuLabels,
    pid: u32,
    start_time: Option<u64>,
    comm: String,
    parent_pid: u32,
    parent_comm: Option<String>,
    #[prometheus(flatten)]
    place: PlaceLabels,
}

/// `vram_process_used_bytes`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct ProcessLabels {
    #[prometheus(flatten)]
    gpu: GpuLabels,
    pid: u32,
    comm: String,
    state: &'static str,
    #[prometheus(flatten)]
    place: PlaceLabels,
}

/// `vram_gpu_pod_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
struct PodLabels {
    gpu: u32,
    uuid: String,
    namespace: String,
    pod: String,
    container: String,
    resource: String,
    device: String,
}

/// An owner state.
#[derive(Debug, Clone, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// Why: a gone owner's reason, or an orphan's.
#[derive(Debug, Clone, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// A holder's role.
#[derive(Debug, Clone, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

/// A kind of failure.
#[derive(Debug, Clone, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

/// The NVML call something is stuck in.
#[derive(Debug, Clone, EncodeLabelSet)]
struct CallLabel {
    call: String,
}

/// A recovery action.
#[derive(Debug, Clone, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

/// What caused a repair of memory.
#[derive(Debug, Clone, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

/// An Xid number.
#[derive(Debug, Clone, EncodeLabelSet)]
struct XidLabel {
    xid: u64,
}

/// A kubelet source.
#[derive(Debug, Clone, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// A container engine.
#[derive(Debug, Clone, EncodeLabelSet)]
struct EngineLabel {
    engine: &'static str,
}

/// Name, help and reading of one memory gauge.
type MemorySeries = (&'static str, &'static str, fn(&MemoryReading) -> u64);

/// Writes one family of `kind` with all its samples, each value made a metric by `metric`.
fn family<L, V, M, I>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    kind: MetricType,
    metric: fn(V) -> M,
    samples: I,
) -> fmt::Result
where
    L: EncodeLabelSet,
    M: EncodeMetric,
    I: IntoIterator<Item = (L, V)>,
{
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        metric(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one gauge family with all its samples.
fn gauge<L, V, I>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: I,
) -> fmt::Result
where
    L: EncodeLabelSet,
    V: prometheus_client::encoding::EncodeGaugeValue + Clone + Default,
    I: IntoIterator<Item = (L, V)>,
{
    let metric = ConstGauge::new;
    family(encoder, (name, help), MetricType::Gauge, metric, samples)
}

/// Writes one counter family; prometheus-client appends `_total` to `name`.
fn counter<L, I>(encoder: &mut DescriptorEncoder, name: &str, help: &str, samples: I) -> fmt::Result
where
    L: EncodeLabelSet,
    I: IntoIterator<Item = (L, u64)>,
{
    let metric = ConstCounter::new;
    family(encoder, (name, help), MetricType::Counter, metric, samples)
}

/// One sample without labels.
fn single<V>(value: V) -> [(NoLabels, V); 1] {
    [(NoLabels {}, value)]
}

fn flag(value: bool) -> i64 {
    i64::from(value)
}

/// One sample per GPU where `value` has one.
fn per_gpu<'a, V>(
    gpus: &'a [GpuVerdict],
    value: impl Fn(&'a GpuVerdict) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels, V)> + 'a {
    gpus.iter()
        .filter_map(move |gpu| Some((GpuLabels::of(gpu), value(gpu)?)))
}

/// One sample per GPU for the kind it shows (`is` answers true), always 1; a GPU that
/// shows none of the kinds has none. The other kinds' zeros are left out: on a fleet they
/// were most of the series and said nothing (docs/fleet.md, "Cardinality").
fn active_kind<'a, K: 'a, L: 'a>(
    gpus: &'a [GpuVerdict],
    kinds: impl IntoIterator<Item = K> + Clone + 'a,
    label: impl Fn(&K) -> L + Copy + 'a,
    is: impl Fn(&'a GpuVerdict, &K) -> Option<bool> + Copy + 'a,
) -> impl Iterator<Item = ((GpuLabels, L), i64)> + 'a {
    gpus.iter().flat_map(move |gpu| {
        kinds.clone().into_iter().filter_map(move |kind| {
            is(gpu, &kind)?.then(|| ((GpuLabels::of(gpu), label(&kind)), 1))
        })
    })
}

/// The GPUs that answered, with their accounts.
type Measured<'a> = [(&'a GpuVerdict, &'a GpuAccount)];

/// The MIG instances that answered, with their GPU's verdict and their accounts.
type MeasuredInstances<'a> = [(&'a GpuVerdict, &'a InstanceVerdict, &'a GpuAccount)];

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
    left_behind(encoder, &measured)?;
    holder_scan(encoder, report, timing.scan_seconds)?;
    if let Some(limit) = options.per_process_limit {
        per_process(encoder, &measured, limit)?;
    }
    if let Some(kubernetes) = &report.kubernetes {
        encode_kubernetes(encoder, kubernetes)?;
    }
    if let Some(engines) = &report.container_engines {
        encode_container_engines(encoder, engines)?;
    }
    let measured_instances: Vec<_> = report
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.instances
                .iter()
                .filter_map(move |instance| Some((gpu, instance, instance.account()?)))
        })
        .collect();
    encode_mig(encoder, &report.gpus, &measured_instances)?;
    encode_instance_verdicts(encoder, &measured_instances)?;
    encode_gpu_health(encoder, &report.gpus)?;
    gauge(
        encoder,
        "vram_scrape_duration_seconds",
        "Seconds this scrape spent reading NVML and /proc and classifying.",
        single(timing.total_seconds),
    )?;
    match &report.exporter_process {
        Some(process) => exporter_process(encoder, process),
        None => Ok(()),
    }
}

/// The exporter's own process, under the names every exporter of the ecosystem serves
/// them by (node_exporter's, client_golang's), which dashboards and alerts expect.
fn exporter_process(encoder: &mut DescriptorEncoder, process: &ExporterProcess) -> fmt::Result {
    family(
        encoder,
        (
            "process_cpu_seconds",
            "Seconds of CPU time the exporter's process has spent, in user and kernel mode.",
        ),
        MetricType::Counter,
        ConstCounter::new,
        single(process.cpu_seconds),
    )?;
    gauge(
        encoder,
        "process_resident_memory_bytes",
        "Resident memory of the exporter's process, in bytes.",
        single(process.resident_bytes),
    )?;
    gauge(
        encoder,
        "process_virtual_memory_bytes",
        "Virtual memory of the exporter's process, in bytes.",
        single(process.virtual_bytes),
    )?;
    let optional = [
        (
            "process_open_fds",
            "File descriptors the exporter's process has open.",
            process.open_fds,
        ),
        (
            "process_max_fds",
            "Most file descriptors the exporter's process may have open (its soft limit).",
            process.max_fds,
        ),
    ];
    for (name, help, value) in optional {
        if let Some(value) = value {
            gauge(encoder, name, help, single(value))?;
        }
    }
    match process.start_time_seconds {
        Some(start) => gauge(
            encoder,
            "process_start_time_seconds",
            "When the exporter's process started, in seconds since the Unix epoch.",
            single(start),
        ),
        None => Ok(()),
    }
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
            BuildLabels {
                version: build.version,
                revision: build.revision,
                driver_version: report.nvml.driver_version().unwrap_or_default().into(),
            },
            1i64,
        )],
    )?;
    gauge(
        encoder,
        "vram_nvml_up",
        "1 when NVML loaded and answered this scrape, 0 when it is missing, failed or does not answer (vram_nvml_error says which).",
        single(flag(report.nvml.is_up())),
    )?;
    gauge(
        encoder,
        "vram_nvml_error",
        "1 for the reason NVML gave no reading (missing, init_failed, not_answering, failed); absent while it answers.",
        report.nvml.failure().map(|kind| {
            (
                ErrorLabel {
                    error: kind.as_str(),
                },
                1i64,
            )
        }),
    )?;
    gauge(
        encoder,
        "vram_nvml_stuck_seconds",
        "Seconds NVML's library-level call (init, device count) has been running, while NVML does not answer; absent otherwise.",
        report.nvml.stuck().map(|stuck| {
            (
                CallLabel {
                    call: stuck.call.clone(),
                },
                stuck.stuck_seconds,
            )
        }),
    )?;
    gauge(
        encoder,
        "vram_host_pid_namespace",
        "1 when the exporter runs in the host PID namespace; 0 means NVML hides other namespaces' processes and unattributed memory is not called orphaned.",
        single(flag(!report.blind())),
    )?;
    gauge(
        encoder,
        "vram_procfs_own_pid_namespace",
        "1 when --path.procfs shows the exporter's own PID namespace, in which NVML names processes; 0 when it shows another, so owners are looked up through NSpid and those not found there are unknown.",
        single(flag(report.procfs_view == ProcfsView::Own)),
    )?;
    gauge(
        encoder,
        "vram_procfs_errors",
        "Entries under /proc that existed but could not be read during this scrape.",
        single(report.procfs_errors),
    )?;
    gauge(
        encoder,
        "vram_procfs_stuck_seconds",
        "Seconds a /proc read has been blocked (a process in uninterruptible sleep blocks reads of its memory map), 0 when none is: owners it kept from being read are unknown, and the holder scan is incomplete.",
        single(
            report
                .procfs_stuck
                .as_ref()
                .map_or(0.0, |stuck| stuck.stuck_seconds),
        ),
    )
}

fn gpu_identity(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_info",
        "Identity of each GPU; always 1.",
        gpus.iter().map(|gpu| {
            let labels = GpuInfoLabels {
                gpu: GpuLabels::of(gpu),
                name: gpu.name.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                minor: gpu.minor,
            };
            (labels, 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_up",
        "1 when every NVML call for this GPU answered, 0 when one failed or has not returned (vram_gpu_error says which) and its other series are missing.",
        per_gpu(gpus, |gpu| Some(flag(gpu.account().is_some()))),
    )?;
    gauge(
        encoder,
        "vram_gpu_error",
        "1 for the kind of NVML failure this GPU shows (gpu_lost, reset_required, not_supported, no_permission, unknown, timeout: a call that has not returned); absent while the GPU answers.",
        active_kind(
            gpus,
            GpuError::iter(),
            |kind| ErrorLabel {
                error: kind.as_str(),
            },
            |gpu, kind| Some(gpu.outcome.error_kind() == Some(*kind)),
        ),
    )?;
    gauge(
        encoder,
        "vram_gpu_stuck_seconds",
        "Seconds the NVML call this GPU is stuck in has been running; only for a GPU that does not answer, which is asked nothing more until the call returns.",
        gpus.iter().filter_map(|gpu| {
            let (call, seconds) = gpu.outcome.stuck()?;
            Some((
                (
                    GpuLabels::of(gpu),
                    CallLabel {
                        call: call.to_string(),
                    },
                ),
                seconds,
            ))
        }),
    )
}

/// The four memory gauges of a GPU.
const GPU_MEMORY: [MemorySeries; 4] = [
    ("vram_total_bytes", "Installed GPU memory in bytes.", |m| {
        m.total
    }),
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
    (
        "vram_free_bytes",
        "GPU memory neither used nor reserved, in bytes.",
        |m| m.free,
    ),
];

/// The four memory gauges of a MIG device.
const MIG_MEMORY: [MemorySeries; 4] = [
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

fn memory(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    for (name, help, value) in GPU_MEMORY {
        gauge(
            encoder,
            name,
            help,
            measured
                .iter()
                .map(|(gpu, account)| (GpuLabels::of(gpu), value(&account.memory))),
        )?;
    }
    gauge(
        encoder,
        "vram_memory_inconsistent",
        "1 when NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): the figures are clamped to the total and unattributed memory is not called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), flag(account.memory_inconsistent))),
    )
}

/// A figure of the owners in one state: their count or their bytes.
type TallyOf = fn(&StateTally, OwnerState) -> u64;

/// Per account, one sample per kind (an owner state, a reason, a role): the account's
/// labels with the kind's, and the account's figure for the kind.
fn by_kind<'a, A: Clone + 'a, K: Copy + 'static, L: 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
    kinds: &'static [K],
    label: fn(K) -> L,
    figure: impl Fn(&GpuAccount, K) -> u64 + Copy + 'a,
) -> impl Iterator<Item = ((A, L), u64)> + 'a {
    accounts.flat_map(move |(labels, account)| {
        kinds
            .iter()
            .map(move |&kind| ((labels.clone(), label(kind)), figure(account, kind)))
    })
}

/// [`by_kind`] without the kinds whose figure is 0: counts of processes by state, reason
/// or role, where an idle GPU had a zero for every kind and a fleet paid a series for each
/// (docs/fleet.md, "Cardinality"). A missing kind reads as none.
fn nonzero_by_kind<'a, A: Clone + 'a, K: Copy + 'static, L: 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
    kinds: &'static [K],
    label: fn(K) -> L,
    figure: impl Fn(&GpuAccount, K) -> u64 + Copy + 'a,
) -> impl Iterator<Item = ((A, L), u64)> + 'a {
    by_kind(accounts, kinds, label, figure).filter(|(_, value)| *value != 0)
}

/// Orphaned bytes by reason, per account.
fn orphaned_by_reason<'a, A: Clone + 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
) -> impl Iterator<Item = ((A, ReasonLabel), u64)> + 'a {
    let label = |reason: OrphanReason| ReasonLabel {
        reason: reason.as_str(),
    };
    by_kind(
        accounts,
        OrphanReason::VARIANTS,
        label,
        GpuAccount::orphaned_by,
    )
}

/// Holders by role, per account.
fn holders_by_role<'a, A: Clone + 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
) -> impl Iterator<Item = ((A, RoleLabel), u64)> + 'a {
    let count = |account: &GpuAccount, role| account.holders(role).len() as u64;
    nonzero_by_kind(
        accounts,
        Role::VARIANTS,
        |role| RoleLabel {
            role: role.as_str(),
        },
        count,
    )
}

fn state_label(state: OwnerState) -> StateLabel {
    let state = state.as_str();
    StateLabel { state }
}

/// The measured GPUs' accounts under their labels.
fn gpu_accounts<'a>(
    measured: &'a Measured<'a>,
) -> impl Iterator<Item = (GpuLabels, &'a GpuAccount)> + 'a {
    measured
        .iter()
        .map(|(gpu, account)| (GpuLabels::of(gpu), *account))
}

fn owners(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    let by_state_series: [(&str, &str, TallyOf); 2] = [
        (
            "vram_owner_processes",
            "Processes NVML charges memory to on this GPU, by state; gone means no live process holds the context any more (it exited, or its PID names another process now). A state without owners has no series.",
            StateTally::processes,
        ),
        (
            "vram_owned_bytes",
            "Bytes NVML charges to owners in each state; a state without owners has no series.",
            StateTally::bytes,
        ),
    ];
    for (name, help, tally) in by_state_series {
        let owners = nonzero_by_kind(
            gpu_accounts(measured),
            OwnerState::VARIANTS,
            state_label,
            move |account, state| tally(&account.tally, state),
        );
        gauge(encoder, name, help, owners)?;
    }
    gauge(
        encoder,
        "vram_gone_owner_processes",
        "Gone owners by why: exited, or reused (the PID names another process now, one without a context on this GPU or with another start time); a reason without owners has no series.",
        nonzero_by_kind(
            gpu_accounts(measured),
            GoneReason::VARIANTS,
            |reason| ReasonLabel {
                reason: reason.as_str(),
            },
            GpuAccount::gone,
        ),
    )?;
    gauge(
        encoder,
        "vram_owner_processes_usage_unavailable",
        "Owners whose memory usage NVML reports as unavailable; while a live one exists, unattributed memory is not called orphaned. Absent when there are none.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.usage_unavailable_owners))
            .filter(|(_, owners)| *owners != 0),
    )?;
    gauge(
        encoder,
        "vram_exited_container_processes",
        "Live owners and culprits of this GPU whose container has ended (PID 1 of their PID namespace exited): they survived the SIGKILL that ends a container, typically stuck in the driver. Absent when there are none.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.exited_container_processes()))
            .filter(|(_, processes)| *processes != 0),
    )
}

/// Orphaned memory, and the processes that hold it.
fn orphans(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_orphaned_bytes",
        "GPU memory held without a live owner: charged to gone owners (owner_gone) or charged to nobody above the noise floor (unattributed).",
        orphaned_by_reason(gpu_accounts(measured)),
    )?;
    gauge(
        encoder,
        "vram_unattributed_bytes",
        "Used bytes charged to no listed process, above the per-context noise floor; reported even when it cannot be called orphaned.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.unattributed_bytes)),
    )?;
    gauge(
        encoder,
        "vram_holder_processes",
        "Processes holding this GPU's device file while it has orphaned memory, by role: culprit (holds a context here: its end frees the memory), bystander (no context here: an NVML client or another GPU's job; or the MPS control daemon or server; never blamed), undetermined (mappings unreadable). Only roles with holders have a series: none while nothing is orphaned.",
        holders_by_role(gpu_accounts(measured)),
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
                    let labels = HolderLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: process.pid,
                        start_time: process.started_unix_seconds,
                        comm: process.comm.clone(),
                        state: process.state.owner_state().as_str(),
                        place: PlaceLabels::of(Some(process)),
                    };
                    (labels, 1i64)
                })
        }),
    )
}

/// Memory that workers of an exited server hold, and those workers.
fn left_behind(encoder: &mut DescriptorEncoder, measured: &Measured<'_>) -> fmt::Result {
    gauge(
        encoder,
        "vram_left_behind_bytes",
        "Bytes NVML charges to live owners whose parent (the server that started them) the exporter saw exit: workers a killed server left behind, holding memory for nobody. Not orphaned: killing them frees it.",
        measured
            .iter()
            .map(|(gpu, account)| (GpuLabels::of(gpu), account.left_behind_bytes())),
    )?;
    gauge(
        encoder,
        "vram_left_behind_since_timestamp_seconds",
        "One series per owner counted in vram_left_behind_bytes, named by PID and start time with the parent that exited: when the exporter saw the parent gone, in seconds since the epoch.",
        measured.iter().flat_map(|(gpu, account)| {
            account
                .left_behind
                .iter()
                .filter_map(|owner| match &owner.seen {
                    Seen::ParentExited {
                        parent,
                        exit_seen_unix_seconds,
                        ..
                    } => Some((owner, parent, *exit_seen_unix_seconds)),
                    Seen::Possibly { .. } => None,
                })
                .take(MAX_HOLDER_SERIES_PER_GPU)
                .map(move |(owner, parent, exit_seen)| {
                    let process = &owner.process;
                    let labels = LeftBehindLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: process.pid,
                        start_time: process.started_unix_seconds,
                        comm: process.comm.clone(),
                        parent_pid: parent.pid,
                        parent_comm: parent.comm.clone(),
                        place: PlaceLabels::of(Some(process)),
                    };
                    (labels, exit_seen as i64)
                })
        }),
    )
}

fn holder_scan(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    scan_seconds: Option<f64>,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_holder_scan_complete",
        "0 when this scrape's scan for device-file holders was cut short (by its time budget or a blocked /proc read) or denied, so holders may be missing; 1 otherwise, also when no scan was needed.",
        single(flag(report.holders_all_seen())),
    )?;
    gauge(
        encoder,
        "vram_holder_scan_duration_seconds",
        "Seconds this scrape's scan for device-file holders took; 0 when no GPU had orphaned memory.",
        single(scan_seconds.unwrap_or(0.0)),
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
                    let labels = ProcessLabels {
                        gpu: GpuLabels::of(gpu),
                        pid: owner.pid,
                        comm: owner.comm().unwrap_or_default().to_string(),
                        state: owner.state().as_str(),
                        place: PlaceLabels::of(owner.process()),
                    };
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
fn encode_container_engines(
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
fn encode_health<'a, L, E>(
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

// MIG devices and what the driver says a GPU needs.

/// The verdict on each MIG instance: owners by state, orphaned memory by reason, and the
/// holders of its capability nodes by role.
fn encode_instance_verdicts(
    encoder: &mut DescriptorEncoder,
    measured: &MeasuredInstances<'_>,
) -> fmt::Result {
    let accounts = || {
        measured
            .iter()
            .map(|(gpu, instance, account)| (MigLabels::of(gpu, instance), *account))
    };
    gauge(
        encoder,
        "vram_mig_owner_processes",
        "Processes NVML charges memory to in this MIG instance, by state (as vram_owner_processes).",
        nonzero_by_kind(
            accounts(),
            OwnerState::VARIANTS,
            state_label,
            |account, state| account.tally.processes(state),
        ),
    )?;
    gauge(
        encoder,
        "vram_mig_orphaned_bytes",
        "Memory of this MIG instance held without a live owner, by reason (as vram_orphaned_bytes).",
        orphaned_by_reason(accounts()),
    )?;
    gauge(
        encoder,
        "vram_mig_holder_processes",
        "Processes holding this MIG instance's capability nodes while it has orphaned memory, by role (as vram_holder_processes).",
        holders_by_role(accounts()),
    )
}

fn encode_mig(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuVerdict],
    measured: &MeasuredInstances<'_>,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_mig_mode",
        "1 when MIG is enabled on this GPU, 0 when disabled; absent for GPUs without MIG. Read at most every 30 s: it changes only at a GPU reset.",
        per_gpu(gpus, |gpu| Some(flag(gpu.mig?.enabled))),
    )?;
    gauge(
        encoder,
        "vram_gpu_mig_mode_pending",
        "The MIG mode this GPU takes at its next reset (1 enabled, 0 disabled); differs from vram_gpu_mig_mode while a change waits for the reset, and shows a change within 30 s.",
        per_gpu(gpus, |gpu| Some(flag(gpu.mig?.pending))),
    )?;
    let instances = || {
        gpus.iter()
            .flat_map(|gpu| gpu.instances.iter().map(move |instance| (gpu, instance)))
    };
    gauge(
        encoder,
        "vram_mig_info",
        "Identity of each MIG device (a compute instance inside a GPU instance); always 1.",
        instances().map(|(gpu, instance)| {
            let labels = MigInfoLabels {
                device: MigLabels::of(gpu, instance),
                mig_uuid: instance.uuid.clone(),
                name: instance.name.clone(),
            };
            (labels, 1i64)
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_up",
        "1 when this MIG device's memory and process calls answered, 0 when one failed and its other series are missing.",
        instances().map(|(gpu, instance)| {
            (
                MigLabels::of(gpu, instance),
                flag(instance.account().is_some()),
            )
        }),
    )?;
    for (name, help, value) in MIG_MEMORY {
        gauge(
            encoder,
            name,
            help,
            measured.iter().map(|(gpu, instance, account)| {
                (MigLabels::of(gpu, instance), value(&account.memory))
            }),
        )?;
    }
    gauge(
        encoder,
        "vram_mig_processes",
        "Processes NVML lists in this MIG device (compute, graphics and MPS, once each); with a refused list, those of the lists that answered.",
        measured.iter().map(|(gpu, instance, account)| {
            (MigLabels::of(gpu, instance), account.owners.len() as u64)
        }),
    )?;
    gauge(
        encoder,
        "vram_mig_process_list_denied",
        "1 when NVML refused a process list of this MIG device (no permission): who owns its memory cannot be told.",
        measured.iter().map(|(gpu, instance, account)| {
            (
                MigLabels::of(gpu, instance),
                flag(account.processes_denied.is_some()),
            )
        }),
    )
}

/// A family's name and help.
type Family = (&'static str, &'static str);

/// What a GPU says of one kind of memory repair: the repairs by cause, and whether one
/// waits for the next reset.
type Repairs = ([u32; 2], bool);

/// Row remapping's families: rows by cause, and a remapping waiting.
const ROW_REMAPPING: [Family; 2] = [
    (
        "vram_gpu_remapped_rows",
        "Memory rows this GPU has remapped to spare rows, by the errors that caused it (correctable, uncorrectable); absent on GPUs without row remapping.",
    ),
    (
        "vram_gpu_row_remap_pending",
        "1 when a row remapping waits for the next reset of this GPU.",
    ),
];

/// Page retirement's families: pages by cause, and retirements waiting.
const PAGE_RETIREMENT: [Family; 2] = [
    (
        "vram_gpu_retired_pages",
        "Memory pages this GPU has retired, by cause (multiple_single_bit_ecc, double_bit_ecc); absent on GPUs that remap rows instead.",
    ),
    (
        "vram_gpu_retired_pages_pending",
        "1 when page retirements of this GPU wait for the next reboot or reset.",
    ),
];

/// The causes of row remappings, in the order of [`remapped_rows`]' counts.
const ROW_CAUSES: [&str; 2] = ["correctable", "uncorrectable"];

fn remapped_rows(gpu: &GpuVerdict) -> Option<Repairs> {
    let rows = gpu.health.remapped_rows?;
    Some(([rows.correctable, rows.uncorrectable], rows.pending))
}

/// The causes of page retirements, in the order of [`retired_pages`]' counts.
const PAGE_CAUSES: [&str; 2] = ["multiple_single_bit_ecc", "double_bit_ecc"];

fn retired_pages(gpu: &GpuVerdict) -> Option<Repairs> {
    let pages = gpu.health.retired_pages?;
    Some((
        [pages.multiple_single_bit_ecc, pages.double_bit_ecc],
        pages.pending,
    ))
}

/// One kind of memory repair as two families: its counts by cause, and whether one waits;
/// absent for GPUs that `read` has nothing of.
fn repairs(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuVerdict],
    [counted, pending]: [Family; 2],
    causes: [&'static str; 2],
    read: fn(&GpuVerdict) -> Option<Repairs>,
) -> fmt::Result {
    gauge(
        encoder,
        counted.0,
        counted.1,
        gpus.iter().flat_map(|gpu| {
            read(gpu).into_iter().flat_map(move |(counts, _)| {
                causes.into_iter().zip(counts).map(|(cause, count)| {
                    ((GpuLabels::of(gpu), CauseLabel { cause }), u64::from(count))
                })
            })
        }),
    )?;
    gauge(
        encoder,
        pending.0,
        pending.1,
        per_gpu(gpus, move |gpu| Some(flag(read(gpu)?.1))),
    )
}

fn encode_gpu_health(encoder: &mut DescriptorEncoder, gpus: &[GpuVerdict]) -> fmt::Result {
    gauge(
        encoder,
        "vram_gpu_process_list_denied",
        "1 when NVML refused a process list of this GPU (no permission; a MIG GPU's aggregate lists need root) and its MIG devices could not make up for it: memory no listed process is charged for is not called orphaned.",
        per_gpu(gpus, |gpu| {
            Some(flag(gpu.account()?.processes_denied.is_some()))
        }),
    )?;
    gauge(
        encoder,
        "vram_gpu_recovery_action",
        "1 for the recovery action the driver asks for, one series per GPU (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, system_reboot; unknown for a value this exporter does not know); absent where the driver cannot say (before 565).",
        active_kind(
            gpus,
            // Every named action, then `Unrecognised(0)`: `unknown` for any value this
            // build does not know.
            RecoveryAction::iter(),
            |kind| ActionLabel {
                action: kind.as_str(),
            },
            // Every unrecognised value is the one `unknown` series: compare kinds, not values.
            |gpu, kind| {
                let action = gpu.health.recovery_action?;
                Some(std::mem::discriminant(&action) == std::mem::discriminant(kind))
            },
        ),
    )?;
    repairs(encoder, gpus, ROW_REMAPPING, ROW_CAUSES, remapped_rows)?;
    gauge(
        encoder,
        "vram_gpu_row_remap_failure",
        "1 when a row remapping of this GPU failed (no spare row left): the GPU should be replaced.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.remapped_rows?.failure))),
    )?;
    repairs(encoder, gpus, PAGE_RETIREMENT, PAGE_CAUSES, retired_pages)?;
    gauge(
        encoder,
        "vram_gpu_memory_os_managed",
        "1 when this GPU's memory is a NUMA node the operating system manages (GH200, GB200 in NUMA mode): used memory then includes pages kept after processes exit, and memory charged to no process is normal.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.memory_os_managed))),
    )?;
    gauge(
        encoder,
        "vram_xid_watched",
        "1 while the exporter receives this GPU's critical Xid events, 0 when it cannot (not supported, NVML failing); absent outside the server.",
        per_gpu(gpus, |gpu| Some(flag(gpu.health.xid.as_ref()?.watched))),
    )?;
    counter(
        encoder,
        "vram_xid_errors",
        "Critical Xid errors NVML reported for this GPU since the exporter started, by Xid (79: fallen off the bus; 999: an Xid NVML cannot name).",
        gpus.iter().flat_map(|gpu| {
            gpu.health.xid.iter().flat_map(move |xid| {
                xid.counts
                    .iter()
                    .map(move |(&xid, &count)| ((GpuLabels::of(gpu), XidLabel { xid }), count))
            })
        }),
    )
}
