//! The verdict for the whole host and for each GPU and MIG instance in it, and what
//! `check` and the written files report of it.

use super::account::GpuAccount;
use super::exporter_process::ExporterProcess;
use super::holders::scan::ScanSummary;
use super::owners::OwnerState;
use super::processes::pods::KubernetesView;
use super::verdict::finding::{CheckStatus, FindingKind};
use super::verdict::Verdict;
use crate::observe::containers::{Engine, EngineHealth};
use crate::observe::kubernetes::PodName;
use crate::observe::{
    GpuError, GpuHealth, NvmlFailure, ProcfsView, RecoveryAction, RemappedRows, RetiredPages,
    StuckCall, StuckRead, WitnessReading, XidReading,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A GPU's account with the verdict on it: in JSON, the account's figures and then the
/// verdict's `finding`, `remedy` and `notes`, side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    /// The figures and the processes they rest on.
    #[serde(flatten)]
    pub account: GpuAccount,
    /// What they amount to, what would free the memory, and the notes.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// A GPU's account and verdict, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuOutcome {
    /// The readings succeeded.
    Measured(Box<Judged>),
    /// A call failed: the GPU's figures are unknown, not zero.
    Failed {
        /// The kind of failure.
        error: GpuError,
        /// NVML's own words.
        message: String,
    },
    /// A call has not returned in time (a GPU that fell off the bus, a wedged driver):
    /// nothing is known of its memory, so it is neither orphaned nor fine: cannot tell.
    NotAnswering {
        /// The NVML function it is stuck in.
        call: String,
        /// Seconds it had been stuck when the look was made.
        stuck_seconds: f64,
    },
}

impl GpuOutcome {
    /// The kind of failure, when the readings did not succeed: a GPU that does not
    /// answer is a `timeout`.
    pub fn error_kind(&self) -> Option<GpuError> {
        match self {
            GpuOutcome::Measured(_) => None,
            GpuOutcome::Failed { error, .. } => Some(*error),
            GpuOutcome::NotAnswering { .. } => Some(GpuError::Timeout),
        }
    }

    /// The account and its verdict when the readings succeeded.
    pub fn judged(&self) -> Option<&Judged> {
        match self {
            GpuOutcome::Measured(judged) => Some(judged),
            GpuOutcome::Failed { .. } | GpuOutcome::NotAnswering { .. } => None,
        }
    }

    /// The account when the readings succeeded.
    pub fn account(&self) -> Option<&GpuAccount> {
        self.judged().map(|judged| &judged.account)
    }

    /// The verdict when the readings succeeded.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.judged().map(|judged| &judged.verdict)
    }

    /// What the verdict amounts to, as a word, when the readings succeeded.
    pub fn finding(&self) -> Option<FindingKind> {
        self.verdict().map(|verdict| verdict.finding.kind())
    }

    /// The call it is stuck in and for how long, when it does not answer.
    pub fn stuck(&self) -> Option<(&str, f64)> {
        match self {
            GpuOutcome::NotAnswering {
                call,
                stuck_seconds,
            } => Some((call, *stuck_seconds)),
            GpuOutcome::Measured(_) | GpuOutcome::Failed { .. } => None,
        }
    }
}

/// The verdict for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuVerdict {
    /// NVML's device index.
    pub index: u32,
    /// Stable identity; empty when NVML could not say.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Minor number of its device node.
    pub minor: Option<u32>,
    /// The containers the kubelet assigned it to (`namespace/pod`, `container`), when known.
    pub assigned_to: Vec<AssignedPod>,
    /// The account, or the failure.
    pub outcome: GpuOutcome,
    /// The verdict on each MIG device NVML listed (only while MIG is enabled): a context
    /// lives in one.
    pub instances: Vec<InstanceVerdict>,
    /// Its MIG mode; `None` for a GPU without MIG.
    pub mig: Option<MigMode>,
    /// What the driver says the GPU needs.
    pub health: Health,
}

/// A GPU's MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigMode {
    /// MIG is enabled now.
    pub enabled: bool,
    /// MIG will be enabled after the next GPU reset.
    pub pending: bool,
}

/// What the driver says a GPU needs, as the verdict states it. Each part is `None` where
/// this driver or GPU cannot say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// The recovery action the driver asks for (drivers 565 and later).
    pub recovery_action: Option<RecoveryAction>,
    /// Row remapping (Ampere and later).
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement (GPUs before Ampere).
    pub retired_pages: Option<RetiredPages>,
    /// The operating system manages the GPU's memory (a coherent GH200/GB200 in NUMA
    /// mode): pages stay allocated after a process exits there, which is normal.
    pub memory_os_managed: bool,
    /// Critical Xid errors counted since the exporter started; `None` when nothing
    /// watches them.
    pub xid: Option<XidReading>,
}

impl Health {
    pub(super) fn of(health: &GpuHealth) -> Health {
        Health {
            recovery_action: health.recovery_action,
            remapped_rows: health.remapped_rows,
            retired_pages: health.retired_pages,
            memory_os_managed: health.numa_node.is_some(),
            xid: health.xid.clone(),
        }
    }
}

/// A container a GPU is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssignedPod {
    /// Its pod.
    pub pod: PodName,
    /// The container's name.
    pub container: String,
}

/// The verdict on one MIG instance (a MIG device): the same account as a GPU's, for its
/// own memory and processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceVerdict {
    /// Its index among the GPU's MIG devices.
    pub index: u32,
    /// `MIG-...`.
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA H200 MIG 1g.18gb`.
    pub name: String,
    /// Its profile, e.g. `1g.18gb`.
    pub profile: String,
    /// The GPU instance id.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance id.
    pub compute_instance_id: Option<u32>,
    /// The account, or the failure.
    #[serde(flatten)]
    pub outcome: GpuOutcome,
}

impl InstanceVerdict {
    /// The account when the instance answered.
    pub fn account(&self) -> Option<&GpuAccount> {
        self.outcome.account()
    }

    /// The verdict when the instance answered.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.outcome.verdict()
    }

    /// `GI 2, CI 0, 1g.18gb`, how people name an instance.
    pub fn label(&self) -> String {
        let id = |id: Option<u32>| id.map_or_else(|| "?".to_string(), |id| id.to_string());
        format!(
            "GI {}, CI {}, {}",
            id(self.gpu_instance_id),
            id(self.compute_instance_id),
            if self.profile.is_empty() {
                "MIG"
            } else {
                &self.profile
            }
        )
    }
}

impl GpuVerdict {
    /// The account when the GPU answered.
    pub fn account(&self) -> Option<&GpuAccount> {
        self.outcome.account()
    }

    /// The verdict when the GPU answered.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.outcome.verdict()
    }

    /// The GPU's own outcome, then each MIG instance's with the instance it is of: every
    /// account a question about the GPU goes over.
    pub fn outcomes(&self) -> impl Iterator<Item = (Option<&InstanceVerdict>, &GpuOutcome)> {
        std::iter::once((None, &self.outcome)).chain(
            self.instances
                .iter()
                .map(|instance| (Some(instance), &instance.outcome)),
        )
    }

    /// The findings of the GPU and of each MIG instance that answered.
    fn findings(&self) -> impl Iterator<Item = FindingKind> + '_ {
        self.outcomes().filter_map(|(_, outcome)| outcome.finding())
    }

    /// Orphaned bytes, 0 for a GPU that did not answer.
    pub fn orphaned_bytes(&self) -> u64 {
        self.account().map_or(0, GpuAccount::orphaned_bytes)
    }

    /// Memory a person waits to see freed after acting (see
    /// [`GpuAccount::to_free_bytes`]); 0 for a GPU that did not answer.
    pub fn to_free_bytes(&self) -> u64 {
        self.account().map_or(0, GpuAccount::to_free_bytes)
    }

    /// Whether the GPU or one of its MIG instances holds memory that `check --wait` waits
    /// for: orphaned, left behind, killed and stuck, or being freed.
    pub fn awaits_freeing(&self) -> bool {
        self.findings().any(FindingKind::awaits_freeing)
    }

    /// Whether the GPU or one of its MIG instances holds orphaned memory.
    pub fn has_orphan(&self) -> bool {
        self.findings()
            .any(|finding| finding == FindingKind::Orphaned)
    }

    /// What `check` says of this GPU: the worst of the GPU's own verdict and its MIG
    /// instances'; a GPU that does not answer says so, and one that failed cannot tell.
    pub fn status(&self) -> CheckStatus {
        if self.outcome.stuck().is_some() {
            return CheckStatus::NotAnswering;
        }
        self.outcomes()
            .map(|(_, outcome)| {
                outcome
                    .finding()
                    .map_or(CheckStatus::CannotTell, FindingKind::status)
            })
            .max()
            .unwrap_or(CheckStatus::Clear)
    }
}

impl Report {
    /// What `check` reports for the GPUs shown. NVML that does not answer is "cannot
    /// tell", as a GPU that does not answer is; NVML that is missing or fails is an
    /// error of the host.
    pub fn check_status(&self, gpus: &[&GpuVerdict]) -> CheckStatus {
        match &self.nvml {
            NvmlStatus::Down {
                reason: NvmlFailure::NotAnswering,
                ..
            } => return CheckStatus::NotAnswering,
            NvmlStatus::Down { .. } => return CheckStatus::NvmlDown,
            NvmlStatus::Up { .. } => {}
        }
        gpus.iter()
            .map(|gpu| gpu.status())
            .max()
            .unwrap_or(CheckStatus::Clear)
    }
}

/// What a file written from one look (a snapshot, a textfile) carries, as its command's
/// exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Everything answered.
    Complete,
    /// NVML is missing or failed: the file says so, and the command reports an error.
    NvmlDown,
    /// NVML, a GPU or a `/proc` read did not answer in time: the file says which.
    NotAnswered,
}

impl Report {
    /// What a file written from this report carries.
    pub fn written(&self) -> Written {
        match self.nvml.failure() {
            Some(NvmlFailure::NotAnswering) => return Written::NotAnswered,
            Some(_) => return Written::NvmlDown,
            None => {}
        }
        let gpu_stuck = self.gpus.iter().any(|gpu| gpu.outcome.stuck().is_some());
        if gpu_stuck || self.procfs_stuck.is_some() {
            Written::NotAnswered
        } else {
            Written::Complete
        }
    }
}

/// Whether NVML answered, and what it said of itself.
#[derive(Debug, Clone, PartialEq)]
pub enum NvmlStatus {
    /// NVML loaded and answered.
    Up {
        /// The kernel driver's version.
        driver_version: String,
    },
    /// NVML could not be loaded or initialised, or does not answer: nothing can be said
    /// of the GPUs.
    Down {
        /// Why, in one line.
        error: String,
        /// The kind of failure.
        reason: NvmlFailure,
        /// The library-level call that has not returned, when NVML does not answer.
        stuck: Option<StuckCall>,
    },
}

impl NvmlStatus {
    /// Whether NVML answered.
    pub fn is_up(&self) -> bool {
        matches!(self, NvmlStatus::Up { .. })
    }

    /// The driver's version, when NVML answered.
    pub fn driver_version(&self) -> Option<&str> {
        match self {
            NvmlStatus::Up { driver_version } => Some(driver_version),
            NvmlStatus::Down { .. } => None,
        }
    }

    /// The kind of failure, when NVML did not answer.
    pub fn failure(&self) -> Option<NvmlFailure> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { reason, .. } => Some(*reason),
        }
    }

    /// The call NVML is stuck in, when it does not answer.
    pub fn stuck(&self) -> Option<&StuckCall> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { stuck, .. } => stuck.as_ref(),
        }
    }

    /// Why NVML did not answer.
    pub fn error(&self) -> Option<&str> {
        match self {
            NvmlStatus::Up { .. } => None,
            NvmlStatus::Down { error, .. } => Some(error),
        }
    }
}

/// The verdict for the whole host.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Whether NVML answered.
    pub nvml: NvmlStatus,
    /// Whether we run in the host PID namespace (`None`: could not tell).
    pub host_pid_namespace: Option<bool>,
    /// Whether the procfs read shows our PID namespace.
    pub procfs_view: ProcfsView,
    /// One verdict per GPU; none while NVML is down.
    pub gpus: Vec<GpuVerdict>,
    /// `/proc` entries that could not be read.
    pub procfs_errors: u64,
    /// The holder scan, when one ran.
    pub holder_scan: Option<ScanSummary>,
    /// The `/proc` reader, when it had not returned at this look's deadline.
    pub procfs_stuck: Option<StuckRead>,

    // Kubernetes.
    /// Each GPU's pods, pod names by uid, and the kubelet sources' health; `None` when the
    /// observation has none (a snapshot of an older version).
    pub kubernetes: Option<KubernetesView>,

    // Container engines.
    /// How each watched container engine's last call went; `None` when none is watched.
    pub container_engines: Option<BTreeMap<Engine, EngineHealth>>,
    /// The exporter's own process, from the observation's reading of it (see
    /// [`exporter_process`]): a server's only.
    pub exporter_process: Option<ExporterProcess>,
    /// The witness state the look went by: a one-shot command's only.
    pub witness: Option<Arc<WitnessReading>>,
}

/// What the exporter can see of the host's processes, as `check` warns of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sight {
    /// Every process: it runs in the host's PID namespace and reads a procfs of it.
    Whole,
    /// It cannot find itself in the procfs it reads (a procfs of another PID namespace):
    /// owners NVML names cannot be looked up, so none is judged.
    ProcfsNotOurs,
    /// It runs outside the host's PID namespace (or cannot tell): NVML hides other
    /// namespaces' processes, so memory without a visible owner is not called orphaned.
    OutsideHostNamespace,
}

impl Report {
    /// True when NVML's process lists may be missing processes of other PID namespaces.
    pub fn blind(&self) -> bool {
        self.host_pid_namespace != Some(true)
    }

    /// What the exporter can see of the host's processes.
    pub fn sight(&self) -> Sight {
        if self.procfs_view == ProcfsView::Unknown {
            Sight::ProcfsNotOurs
        } else if self.blind() {
            Sight::OutsideHostNamespace
        } else {
            Sight::Whole
        }
    }

    /// Whether no holder is missing for want of looking: the scan saw every process, or
    /// none was made, as none is where nothing is orphaned (a replayed snapshot without a
    /// scan says [`Blindness::NoScan`] in the remedy of an orphan instead).
    pub fn holders_all_seen(&self) -> bool {
        self.holder_scan.is_none_or(|scan| scan.complete())
    }

    /// Total orphaned bytes over all GPUs.
    pub fn orphaned_bytes(&self) -> u64 {
        orphaned_bytes_of(self.gpus.iter())
    }

    /// Whether some owner, on any GPU or MIG instance, is being freed: a look a moment
    /// later says whether the free ended, or the owner is gone (see
    /// [`super::ENDING_AT_MOST_MILLIS`]).
    pub fn owners_being_freed(&self) -> bool {
        self.gpus
            .iter()
            .flat_map(GpuVerdict::outcomes)
            .filter_map(|(_, outcome)| outcome.account())
            .any(|account| account.tally.processes(OwnerState::Exiting) > 0)
    }
}

/// Total orphaned bytes of `gpus` (those `check --gpu` chose, or all).
pub fn orphaned_bytes_of<'a>(gpus: impl IntoIterator<Item = &'a GpuVerdict>) -> u64 {
    gpus.into_iter()
        .map(GpuVerdict::orphaned_bytes)
        .fold(0, u64::saturating_add)
}
