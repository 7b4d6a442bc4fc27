//! The GPUs `check` looks at (those asked about, or all) and what it reports of them,
//! resolved once per look so that the text, the JSON, the exit status and a wait all
//! read the same.

use super::owners::Owner;
use super::processes::slurm::JobState;
use super::report::{orphaned_bytes_of, GpuVerdict, InstanceVerdict, Judged, Report};
use super::verdict::finding::{CheckStatus, FindingKind};

/// A GPU as a person or a scheduler names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuName {
    /// NVML's index, as nvidia-smi numbers the GPUs (and CUDA with
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    Index(u32),
    /// The minor number of its device file, `/dev/nvidia<minor>`: what Slurm's GPU IDs
    /// are where gres.conf lists `/dev/nvidia0` to `/dev/nvidia<N-1>` in order.
    Minor(u32),
    /// Its UUID, `GPU-...`, as NVML and `CUDA_VISIBLE_DEVICES` give it; compared without
    /// regard to case.
    Uuid(String),
}

impl std::fmt::Display for GpuName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuName::Index(index) => write!(f, "GPU {index}"),
            GpuName::Minor(minor) => {
                write!(f, "GPU with device minor {minor} (/dev/nvidia{minor})")
            }
            GpuName::Uuid(uuid) => write!(f, "GPU with UUID {uuid}"),
        }
    }
}

impl GpuName {
    fn names(&self, gpu: &GpuVerdict) -> bool {
        match self {
            GpuName::Index(index) => gpu.index == *index,
            GpuName::Minor(minor) => gpu.minor == Some(*minor),
            GpuName::Uuid(uuid) => !gpu.uuid.is_empty() && gpu.uuid.eq_ignore_ascii_case(uuid),
        }
    }
}

/// A GPU this host does not have.
#[derive(Debug, thiserror::Error)]
#[error("there is no {name}; {place} has {count} (indices 0 to {last})")]
pub struct NoSuchGpu {
    name: GpuName,
    count: usize,
    last: usize,
    /// Whose GPUs were counted: "this host", or "the snapshot".
    place: &'static str,
}

impl NoSuchGpu {
    /// The same, said of the snapshot replayed rather than of the host it runs on.
    pub fn in_snapshot(self) -> Self {
        NoSuchGpu {
            place: "the snapshot",
            ..self
        }
    }
}

/// How a wait names the memory it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldAs {
    /// Some of it is orphaned.
    Orphaned,
    /// None is orphaned: it is left behind, held by owners killed and stuck, or being
    /// freed.
    Held,
}

/// The GPUs chosen of one report, and what `check` reports of them.
#[derive(Debug, Clone)]
pub struct Selection<'a> {
    /// The whole report (NVML's status, the holder scan, the `/proc` reader).
    pub report: &'a Report,
    /// The GPUs chosen, in the report's order.
    pub gpus: Vec<&'a GpuVerdict>,
    /// What `check` reports of them, as its exit status says it.
    pub status: CheckStatus,
}

impl Report {
    /// The GPUs with these indices, or all when none is named; with NVML down there are
    /// none to choose from, and every index is let through.
    pub fn select(&self, indices: &[u32]) -> Result<Selection<'_>, NoSuchGpu> {
        let names: Vec<GpuName> = indices.iter().copied().map(GpuName::Index).collect();
        self.select_named(&names)
    }

    /// The GPUs these names name, or all when none is named; with NVML down there are
    /// none to choose from, and every name is let through.
    pub fn select_named(&self, names: &[GpuName]) -> Result<Selection<'_>, NoSuchGpu> {
        if names.is_empty() || !self.nvml.is_up() {
            return Ok(self.selection(self.gpus.iter().collect()));
        }
        if let Some(name) = names
            .iter()
            .find(|name| !self.gpus.iter().any(|gpu| name.names(gpu)))
        {
            return Err(NoSuchGpu {
                name: name.clone(),
                count: self.gpus.len(),
                last: self.gpus.len().saturating_sub(1),
                place: "this host",
            });
        }
        Ok(self.selection(
            self.gpus
                .iter()
                .filter(|gpu| names.iter().any(|name| name.names(gpu)))
                .collect(),
        ))
    }

    fn selection<'a>(&'a self, gpus: Vec<&'a GpuVerdict>) -> Selection<'a> {
        Selection {
            report: self,
            status: self.check_status(&gpus),
            gpus,
        }
    }
}

impl Selection<'_> {
    /// Whether some GPU chosen, or one of its MIG instances, holds memory that
    /// `check --wait` waits for.
    pub fn awaits_freeing(&self) -> bool {
        self.gpus.iter().any(|gpu| gpu.awaits_freeing())
    }

    /// Memory still to be freed on the GPUs chosen.
    pub fn to_free_bytes(&self) -> u64 {
        self.gpus
            .iter()
            .map(|gpu| gpu.to_free_bytes())
            .fold(0, u64::saturating_add)
    }

    /// Whether some GPU chosen could not be seen this time (NVML down, or the GPU not
    /// answering): memory there is not freed, it is unseen.
    pub fn unseen(&self) -> bool {
        !self.report.nvml.is_up() || self.gpus.iter().any(|gpu| gpu.outcome.stuck().is_some())
    }

    /// How a wait names the memory it waits for.
    pub fn held_as(&self) -> HeldAs {
        if self.gpus.iter().any(|gpu| gpu.has_orphan()) {
            HeldAs::Orphaned
        } else {
            HeldAs::Held
        }
    }

    /// Whether every GPU chosen answered and uses nothing.
    pub fn all_idle(&self) -> bool {
        self.gpus
            .iter()
            .all(|gpu| gpu.outcome.finding() == Some(FindingKind::Idle))
    }

    /// Orphaned bytes over the GPUs chosen.
    pub fn orphaned_bytes(&self) -> u64 {
        orphaned_bytes_of(self.gpus.iter().copied())
    }
}

/// A live owner in no running Slurm job: to a job about to start on its GPU, a process
/// outside the job holds memory there.
#[derive(Debug, Clone, Copy)]
pub struct ForeignOwner<'a> {
    /// The GPU it holds memory on.
    pub gpu: &'a GpuVerdict,
    /// The owner, live.
    pub owner: &'a Owner,
}

/// The one GPU (or MIG instance) a line of at most 80 bytes speaks of, and how many
/// others of those chosen need a look too.
#[derive(Debug, Clone, Copy)]
pub struct Headline<'a> {
    /// The GPU.
    pub gpu: &'a GpuVerdict,
    /// Its MIG instance, when the finding is the instance's.
    pub instance: Option<&'a InstanceVerdict>,
    /// The account and verdict the finding is of (the GPU's or the instance's), when it
    /// answered.
    pub judged: Option<&'a Judged>,
    /// What the line says of it.
    pub status: Headed,
    /// Other GPUs chosen whose status is not clear.
    pub others: usize,
}

/// What a headline says of its GPU: `check`'s status, or that live processes in no
/// running Slurm job hold its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headed {
    /// The GPU's status.
    Status(CheckStatus),
    /// Held by processes in no running job, and nothing worse.
    InUse,
}

impl<'a> Selection<'a> {
    /// Live owners in no running Slurm job (not in one, or in one that has ended), on
    /// the GPUs chosen and their MIG instances. An owner whose job's state could not be
    /// read is not one: it is not known to be outside.
    pub fn foreign_owners(&self) -> Vec<ForeignOwner<'a>> {
        let mut foreign = Vec::new();
        for gpu in &self.gpus {
            for account in gpu.outcomes().filter_map(|(_, outcome)| outcome.account()) {
                for owner in &account.owners {
                    let outside = owner.process().is_some_and(|process| {
                        process
                            .slurm_job
                            .as_ref()
                            .is_none_or(|job| job.state == JobState::Ended)
                    });
                    if outside {
                        foreign.push(ForeignOwner { gpu, owner });
                    }
                }
            }
        }
        foreign
    }

    /// Whether `--foreign` makes the GPUs in use: live owners in no running job hold
    /// memory, and the status says nothing worse (orphaned, left behind, a look that
    /// did not complete).
    pub fn in_use(&self) -> bool {
        matches!(self.status, CheckStatus::Clear | CheckStatus::CannotTell)
            && !self.foreign_owners().is_empty()
    }

    /// The GPU a one-line summary names: with `foreign`, the first in use when they are;
    /// else the first whose status is the selection's, with the instance whose finding
    /// it is. `None` when no GPU is chosen (none, or NVML down).
    pub fn headline(&self, foreign: bool) -> Option<Headline<'a>> {
        let status = self.status;
        self.headline_where(foreign, |gpu| gpu == status)
    }

    /// The headline of the first GPU whose status is `wanted` (else as [`Self::headline`]
    /// would choose): what a rule about one verdict names.
    pub fn headline_where(
        &self,
        foreign: bool,
        wanted: impl Fn(CheckStatus) -> bool,
    ) -> Option<Headline<'a>> {
        if foreign && self.in_use() {
            let owners = self.foreign_owners();
            let first = *owners.first()?;
            let gpu = first.gpu;
            let (instance, judged) = judged_of(gpu)
                .find(|(_, judged)| {
                    judged.is_some_and(|judged| {
                        judged
                            .account
                            .owners
                            .iter()
                            .any(|owner| std::ptr::eq(owner, first.owner))
                    })
                })
                .unwrap_or((None, gpu.outcome.judged()));
            let others = self
                .gpus
                .iter()
                .filter(|other| {
                    !std::ptr::eq(**other, gpu)
                        && (other.status() != CheckStatus::Clear
                            || owners
                                .iter()
                                .any(|foreign| std::ptr::eq(foreign.gpu, **other)))
                })
                .count();
            return Some(Headline {
                gpu,
                instance,
                judged,
                status: Headed::InUse,
                others,
            });
        }
        let gpu = *self
            .gpus
            .iter()
            .find(|gpu| wanted(gpu.status()))
            .or_else(|| self.gpus.iter().find(|gpu| gpu.status() == self.status))
            .or_else(|| self.gpus.first())?;
        // The instance whose finding it is: the GPU's own account unless that is fine
        // and an instance's is not.
        let (instance, judged) = judged_of(gpu)
            .find(|(_, judged)| !judged.is_some_and(|judged| fine(judged.verdict.finding.kind())))
            .unwrap_or((None, gpu.outcome.judged()));
        let others = self
            .gpus
            .iter()
            .filter(|other| !std::ptr::eq(**other, gpu) && other.status() != CheckStatus::Clear)
            .count();
        Some(Headline {
            gpu,
            instance,
            judged,
            status: Headed::Status(gpu.status()),
            others,
        })
    }
}

/// Nothing to say of an account with this finding.
fn fine(finding: FindingKind) -> bool {
    matches!(finding, FindingKind::Idle | FindingKind::Owned)
}

/// A GPU's own account and verdict, then each MIG instance's, with the instance it is of.
fn judged_of(
    gpu: &GpuVerdict,
) -> impl Iterator<Item = (Option<&InstanceVerdict>, Option<&Judged>)> {
    gpu.outcomes()
        .map(|(instance, outcome)| (instance, outcome.judged()))
}

#[cfg(test)]
mod tests {
    use crate::classify::tests::fixtures::*;
    use crate::classify::*;

    #[test]
    fn gpus_are_chosen_by_index_device_minor_or_uuid() {
        // NVML numbers GPU 1 of this host 1, its device file is /dev/nvidia3.
        let mut host = fork_orphan().gpu(1);
        host.gpus[1].minor = Some(3);
        let report = host.report();
        let by = |names: &[GpuName]| -> Vec<u32> {
            let selection = report.select_named(names).unwrap();
            selection.gpus.iter().map(|gpu| gpu.index).collect()
        };
        assert_eq!(by(&[GpuName::Index(1)]), [1]);
        assert_eq!(by(&[GpuName::Minor(3)]), [1]);
        assert_eq!(by(&[GpuName::Uuid("gpu-1".into())]), [1]);
        assert_eq!(by(&[GpuName::Minor(3), GpuName::Index(0)]), [0, 1]);
        assert_eq!(by(&[]), [0, 1]);
        for (name, said) in [
            (
                GpuName::Minor(1),
                "there is no GPU with device minor 1 (/dev/nvidia1)",
            ),
            (
                GpuName::Uuid("GPU-7".into()),
                "there is no GPU with UUID GPU-7",
            ),
            (GpuName::Index(2), "there is no GPU 2"),
        ] {
            let error = report.select_named(&[name]).unwrap_err().to_string();
            assert_eq!(error, format!("{said}; this host has 2 (indices 0 to 1)"));
        }
        // The selection's status is of the GPUs chosen alone.
        let clear = report.select_named(&[GpuName::Minor(3)]).unwrap();
        assert_eq!(clear.status, CheckStatus::Clear);
    }

    #[test]
    fn live_owners_outside_running_slurm_jobs_are_foreign() {
        let owner = |facts| {
            Host::idle()
                .used(USED_ONE_OWNER)
                .owner(600, Some(CHARGED_ONE_OWNER), present(facts))
        };
        let outside = owner(cuda(600, &[0])).slurm_running(&[]).report();
        let running = owner(in_slurm_job(cuda(600, &[0]), 4242, "0"))
            .slurm_running(&[(4242, "0")])
            .report();
        let ended = owner(in_slurm_job(cuda(600, &[0]), 4242, "0"))
            .slurm_running(&[])
            .report();
        // Without a complete look at the slurmstepds, nobody is known to be outside a job.
        let unknown = owner(in_slurm_job(cuda(600, &[0]), 4242, "0")).report();
        for (report, foreign) in [
            (&outside, true),
            (&running, false),
            (&ended, true),
            (&unknown, false),
        ] {
            let selection = report.select(&[]).unwrap();
            assert_eq!(selection.status, CheckStatus::Clear);
            assert_eq!(selection.in_use(), foreign, "{report:?}");
            let pids: Vec<u32> = selection
                .foreign_owners()
                .iter()
                .map(|foreign| foreign.owner.pid)
                .collect();
            assert_eq!(pids, if foreign { vec![600] } else { vec![] });
        }
        let headline = outside.select(&[]).unwrap().headline(true).unwrap();
        assert_eq!(headline.status, Headed::InUse);
        assert_eq!(headline.gpu.index, 0);
        // Orphaned memory says more than a foreign owner beside it.
        let orphaned = fork_orphan().report();
        let selection = orphaned.select(&[]).unwrap();
        assert!(!selection.in_use());
        let headline = selection.headline(true).unwrap();
        assert_eq!(headline.status, Headed::Status(CheckStatus::Orphaned));
    }

    #[test]
    fn a_headline_names_the_first_gpu_of_the_worst_status_and_counts_the_others() {
        let report = Host::idle().gpu(1).gpu(2).gpu(3).report();
        let clear = report.select(&[]).unwrap().headline(false).unwrap();
        assert_eq!(
            (clear.gpu.index, clear.status, clear.others),
            (0, Headed::Status(CheckStatus::Clear), 0)
        );
        let mut host = fork_orphan().gpu(1).gpu(2).not_answering(2, 12.0);
        *host.readings(1).0 = memory(USED_ONE_OWNER);
        let report = host.report();
        let selection = report.select(&[]).unwrap();
        assert_eq!(selection.status, CheckStatus::NotAnswering);
        let headline = selection.headline(false).unwrap();
        // GPU 2 does not answer: that is the status; GPUs 0 (orphaned) and 1 (memory
        // with no owner) need a look too.
        assert_eq!(headline.gpu.index, 2);
        assert_eq!(headline.others, 2);
        assert!(headline.judged.is_none());
    }
}
