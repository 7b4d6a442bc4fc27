//! The label set of every family: a typed struct each, its fields in the order the
//! labels are written.

use crate::classify::{GpuVerdict, InstanceVerdict, PodName, Process};
use prometheus_client::encoding::EncodeLabelSet;

// Label sets.

/// A series without labels.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct NoLabels {}

/// `vram_build_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: &'static str,
    pub(super) revision: &'static str,
    pub(super) driver_version: String,
}

/// Which GPU: the labels every per-GPU series starts with.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct GpuLabels {
    pub(super) gpu: u32,
    pub(super) uuid: String,
}

impl GpuLabels {
    pub(super) fn of(gpu: &GpuVerdict) -> GpuLabels {
        GpuLabels {
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
        }
    }
}

/// `vram_gpu_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct GpuInfoLabels {
    #[prometheus(flatten)]
    pub(super) gpu: GpuLabels,
    pub(super) name: String,
    pub(super) pci_bus_id: String,
    pub(super) minor: Option<u32>,
}

/// Which MIG device: its parent's labels, then dcgm-exporter's names for the GPU instance
/// id and profile and DCGM's entity name for the compute instance id, so queries can join
/// with `DCGM_FI_*` series.
#[allow(non_snake_case)]
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct MigLabels {
    #[prometheus(flatten)]
    pub(super) gpu: GpuLabels,
    GPU_I_ID: Option<u32>,
    GPU_CI_ID: Option<u32>,
    GPU_I_PROFILE: String,
}

impl MigLabels {
    pub(super) fn of(gpu: &GpuVerdict, instance: &InstanceVerdict) -> MigLabels {
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
pub(super) struct MigInfoLabels {
    #[prometheus(flatten)]
    pub(super) device: MigLabels,
    pub(super) mig_uuid: String,
    pub(super) name: String,
}

/// Where a process runs: `container_id` and `pod_uid`, then `namespace` and `pod`, then
/// its container's name and image, then its Slurm job's id, step and user; each empty
/// when the process runs in none or its pod's or container's name is unknown. Only per-process series carry them: on a per-GPU series they
/// would multiply its series by the workloads that come and go.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct PlaceLabels {
    pub(super) container_id: Option<String>,
    pub(super) pod_uid: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) pod: Option<String>,
    pub(super) container_name: Option<String>,
    pub(super) container_image: Option<String>,
    pub(super) slurm_job_id: Option<u64>,
    pub(super) slurm_step: Option<String>,
    pub(super) slurm_user: Option<String>,
}

impl PlaceLabels {
    pub(super) fn of(process: Option<&Process>) -> PlaceLabels {
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
pub(super) struct HolderLabels {
    #[prometheus(flatten)]
    pub(super) gpu: GpuLabels,
    pub(super) pid: u32,
    pub(super) start_time: Option<u64>,
    pub(super) comm: String,
    pub(super) state: &'static str,
    #[prometheus(flatten)]
    pub(super) place: PlaceLabels,
}

/// `vram_left_behind_since_timestamp_seconds`.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct LeftBehindLabels {
    #[prometheus(flatten)]
    pub(super) gpu: GpuLabels,
    pub(super) pid: u32,
    pub(super) start_time: Option<u64>,
    pub(super) comm: String,
    pub(super) parent_pid: u32,
    pub(super) parent_comm: Option<String>,
    #[prometheus(flatten)]
    pub(super) place: PlaceLabels,
}

/// `vram_process_used_bytes`.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct ProcessLabels {
    #[prometheus(flatten)]
    pub(super) gpu: GpuLabels,
    pub(super) pid: u32,
    pub(super) comm: String,
    pub(super) state: &'static str,
    #[prometheus(flatten)]
    pub(super) place: PlaceLabels,
}

/// `vram_gpu_pod_info`.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct PodLabels {
    pub(super) gpu: u32,
    pub(super) uuid: String,
    pub(super) namespace: String,
    pub(super) pod: String,
    pub(super) container: String,
    pub(super) resource: String,
    pub(super) device: String,
}

/// An owner state.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct StateLabel {
    pub(super) state: &'static str,
}

/// Why: a gone owner's reason, or an orphan's.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

/// A holder's role.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct RoleLabel {
    pub(super) role: &'static str,
}

/// A kind of failure.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct ErrorLabel {
    pub(super) error: &'static str,
}

/// The NVML call something is stuck in.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct CallLabel {
    pub(super) call: String,
}

/// A recovery action.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct ActionLabel {
    pub(super) action: &'static str,
}

/// What caused a repair of memory.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct CauseLabel {
    pub(super) cause: &'static str,
}

/// An Xid number.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct XidLabel {
    pub(super) xid: u64,
}

/// A kubelet source.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct SourceLabel {
    pub(super) source: &'static str,
}

/// A container engine.
#[derive(Debug, Clone, EncodeLabelSet)]
pub(super) struct EngineLabel {
    pub(super) engine: &'static str,
}
