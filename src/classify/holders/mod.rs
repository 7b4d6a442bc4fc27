//! Who keeps orphaned memory alive: every process holding a GPU's device file is a
//! candidate, with the evidence found for and against it. Only a candidate with a context
//! on the GPU (read-write shared mappings of its device file) is a culprit; the others are
//! bystanders, and a candidate whose mappings cannot be read is undetermined. The MPS
//! control daemon and server are bystanders whatever they map (see `mps`).

pub(crate) mod mps;
pub mod scan;

use crate::classify::owners::Owner;
use crate::classify::processes::{Process, ProcessLens};
use crate::classify::settings::Settings;
use crate::observe::{NarrowAccess, ProcessFacts, ProcfsView, References};
use mps::{MpsPart, MPS_COMM};
use serde::Serialize;
use std::collections::BTreeMap;
use strum::{IntoStaticStr, VariantArray};

/// What a candidate is to one GPU's orphaned memory: the `role` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, VariantArray)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Role {
    /// It holds a context on the GPU: its end frees the memory.
    Culprit,
    /// It holds the device file without a context on the GPU (an NVML client, another
    /// GPU's job), or it is the MPS control daemon or server: never blamed.
    Bystander,
    /// Its mappings cannot be read: whether it holds a context cannot be told.
    Undetermined,
}

impl Role {
    /// The label value used in metrics (the serde name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One fact found for or against a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// It maps this GPU's device file shared and read-write: it holds a context here
    /// (strong).
    MapsGpu,
    /// It maps this GPU's device file, but never read-write: the driver is initialised in
    /// it, without a context (measured: the MPS control daemon maps it write-only).
    MapsGpuWithoutContext {
        /// How it maps it.
        access: NarrowAccess,
    },
    /// NVML lists it as an owner on no GPU, so the context it maps was inherited.
    Inherited,
    /// Its parent is the gone owner (not yet reaped).
    ChildOf {
        /// The gone owner.
        pid: u32,
    },
    /// It is in the process group the gone owner led.
    ProcessGroupOf {
        /// The gone owner.
        pid: u32,
    },
    /// It is in the session the gone owner led.
    SessionOf {
        /// The gone owner.
        pid: u32,
    },
    /// Its parent is the gone owner's parent: orphaned by the owner's death, it was
    /// adopted by the subreaper that was the owner's parent.
    AdoptedByOwnersParent {
        /// The gone owner.
        pid: u32,
        /// The parent they share.
        parent: u32,
    },
    /// It holds this GPU's device file open but maps nothing of it: an NVML client (a
    /// monitoring agent, a device plugin) or a job that only opened the node.
    NoContext,
    /// It is a live owner of other GPUs, without a context on this one.
    OwnerOfOtherGpus {
        /// NVML indices of those GPUs.
        gpus: Vec<u32>,
    },
    /// Its command name is a known NVML client's (the built-in list or
    /// `--holders.ignore-comm`); a label only, never a reason to blame or clear.
    KnownAgent,
    /// It is the MPS control daemon: the parent of the GPU's MPS server, listed by NVML on
    /// no GPU, leading its own session. Never blamed for a client's memory: killing it
    /// frees no client's orphan and ends MPS for every client (measured on an H200).
    MpsControlDaemon {
        /// The MPS server's PID.
        server: u32,
    },
    /// It is the MPS server: a live owner on the GPU's compute list and not its MPS list,
    /// while the MPS list names the clients, and the control daemon's child. It holds
    /// every client's context; never blamed for one client's memory: ending it ends MPS
    /// for every client.
    MpsServer {
        /// The control daemon's PID.
        daemon: u32,
    },
    /// Its command name is MPS's (`nvidia-cuda-mps`); a label only, never a reason.
    MpsCommandName,
    /// Its mappings could not be read (root, or CAP_SYS_PTRACE, is needed).
    MappingsUnreadable,
    /// It maps the GPU, but which MIG instance its context is in cannot be told: the
    /// driver's table of instance capabilities could not be read.
    InstanceUnknown,
}

/// What a verdict covers: a whole GPU, or one MIG instance of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Within {
    /// The whole GPU.
    Gpu,
    /// One MIG instance, whose contexts hold its capability nodes (these minors) open.
    Instance(Vec<u32>),
    /// One MIG instance whose capability nodes are not known.
    UnknownInstance,
}

/// A process holding a GPU's device file, with its role and the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suspect {
    /// The process.
    #[serde(flatten)]
    pub process: Process,
    /// What it is to the GPU's orphaned memory.
    pub role: Role,
    /// Why: for a culprit the evidence against it, for the others why it is not blamed.
    pub evidence: Vec<Evidence>,
}

impl Suspect {
    /// Whether it is the MPS control daemon or server, set apart from other bystanders.
    pub fn is_mps_part(&self) -> bool {
        self.evidence.iter().any(|evidence| {
            matches!(
                evidence,
                Evidence::MpsControlDaemon { .. } | Evidence::MpsServer { .. }
            )
        })
    }
}

/// One GPU's search for the holders of its orphaned memory: the GPU (or MIG instance),
/// who owns what on every GPU, and its MPS parts.
pub(super) struct HolderSearch<'a> {
    /// Minor number of the GPU's device node.
    pub minor: u32,
    /// Its NVML index.
    pub index: u32,
    /// The whole GPU or one of its MIG instances.
    pub within: &'a Within,
    /// Its owners, judged.
    pub owners: &'a [Owner],
    /// NVML index of every GPU each PID (ours) is a live owner of.
    pub live_owner_gpus: &'a BTreeMap<u32, Vec<u32>>,
    /// The MPS control daemon and server of the GPU, by PID of the procfs.
    pub mps: &'a BTreeMap<u32, MpsPart>,
}

/// The candidates of one GPU with orphaned memory: every scanned process holding or
/// mapping its device file, other than its own live owners (but for the MPS server, a live
/// owner listed apart). Culprits come first.
pub(super) fn suspects(
    holders: &[ProcessFacts],
    search: &HolderSearch<'_>,
    settings: &Settings,
    lens: &ProcessLens,
) -> Vec<Suspect> {
    let mut found: Vec<Suspect> = holders
        .iter()
        .filter(|holder| holder.touches_gpu(search.minor))
        .filter(|holder| in_instance(holder, search.within))
        .filter(|holder| {
            !is_live_owner_here(holder, search) || search.mps.contains_key(&holder.pid)
        })
        .map(|holder| judge(holder, search, settings, lens))
        .collect();
    found.sort_by_key(|suspect| (suspect.role != Role::Culprit, suspect.process.pid));
    found
}

/// Whether a holder may be in the instance judged: a context in a MIG instance holds the
/// instance's capability nodes open.
fn in_instance(holder: &ProcessFacts, within: &Within) -> bool {
    match within {
        Within::Gpu | Within::UnknownInstance => true,
        Within::Instance(capabilities) => holder.descriptors.nodes().is_some_and(|nodes| {
            nodes
                .capabilities
                .iter()
                .any(|minor| capabilities.contains(minor))
        }),
    }
}

fn is_live_owner_here(holder: &ProcessFacts, search: &HolderSearch<'_>) -> bool {
    holder.local_pid.is_some_and(|pid| {
        search
            .live_owner_gpus
            .get(&pid)
            .is_some_and(|gpus| gpus.contains(&search.index))
    })
}

fn judge(
    holder: &ProcessFacts,
    search: &HolderSearch<'_>,
    settings: &Settings,
    lens: &ProcessLens,
) -> Suspect {
    let mut evidence = Vec::new();
    let other_gpus: Vec<u32> = holder
        .local_pid
        .and_then(|pid| search.live_owner_gpus.get(&pid))
        .cloned()
        .unwrap_or_default();
    let narrow = holder
        .mappings
        .nodes()
        .and_then(|nodes| nodes.gpu_without_read_write(search.minor));
    let role = if let Some(part) = search.mps.get(&holder.pid) {
        // Never a culprit of a client's orphan, whatever it maps.
        evidence.push(match *part {
            MpsPart::ControlDaemon { server } => Evidence::MpsControlDaemon { server },
            MpsPart::Server { daemon } => Evidence::MpsServer { daemon },
        });
        evidence.extend(narrow.map(|access| Evidence::MapsGpuWithoutContext { access }));
        Role::Bystander
    } else {
        match &holder.mappings {
            References::Read(nodes)
                if nodes.maps_gpu_read_write(search.minor)
                    && *search.within == Within::UnknownInstance =>
            {
                evidence.push(Evidence::MapsGpu);
                evidence.push(Evidence::InstanceUnknown);
                Role::Undetermined
            }
            References::Read(nodes) if nodes.maps_gpu_read_write(search.minor) => {
                evidence.push(Evidence::MapsGpu);
                if other_gpus.is_empty() {
                    evidence.push(Evidence::Inherited);
                }
                evidence.extend(kinship(holder, search, lens));
                Role::Culprit
            }
            References::Read(_) => {
                match narrow {
                    Some(access) => evidence.push(Evidence::MapsGpuWithoutContext { access }),
                    None if other_gpus.is_empty() => evidence.push(Evidence::NoContext),
                    None => {}
                }
                if !other_gpus.is_empty() {
                    evidence.push(Evidence::OwnerOfOtherGpus { gpus: other_gpus });
                }
                Role::Bystander
            }
            References::Unreadable | References::NotRead => {
                evidence.push(Evidence::MappingsUnreadable);
                evidence.extend(kinship(holder, search, lens));
                Role::Undetermined
            }
        }
    };
    if holder.comm.starts_with(MPS_COMM) {
        evidence.push(Evidence::MpsCommandName);
    }
    if settings.is_known_agent(&holder.comm) {
        evidence.push(Evidence::KnownAgent);
    }
    Suspect {
        process: Process::new(holder, lens),
        role,
        evidence,
    }
}

/// Ties between a holder and the GPU's gone owners: the signs that it inherited their
/// context rather than opened the device itself.
fn kinship(holder: &ProcessFacts, search: &HolderSearch<'_>, lens: &ProcessLens) -> Vec<Evidence> {
    // Parents, groups and sessions are the procfs's PIDs, owners' PIDs are ours.
    if lens.procfs_view != ProcfsView::Own {
        return Vec::new();
    }
    let gone: Vec<&Owner> = search
        .owners
        .iter()
        .filter(|owner| owner.gone().is_some())
        .collect();
    let mut ties = Vec::new();
    for owner in gone {
        let pid = owner.pid;
        if holder.ppid == pid {
            ties.push(Evidence::ChildOf { pid });
        }
        if holder.pgid == pid {
            ties.push(Evidence::ProcessGroupOf { pid });
        }
        if holder.sid == pid {
            ties.push(Evidence::SessionOf { pid });
        }
        if let Some(parent) = owner.first_seen.as_ref().map(|first| first.ppid) {
            // Everything orphaned ends up under init: only a subreaper's adoption says more.
            if parent > 1 && holder.ppid == parent {
                ties.push(Evidence::AdoptedByOwnersParent { pid, parent });
            }
        }
    }
    ties
}
