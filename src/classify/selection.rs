//! The GPUs `check` looks at (those asked about, or all) and what it reports of them,
//! resolved once per look so that the text, the JSON, the exit status and a wait all
//! read the same.

use super::report::{orphaned_bytes_of, CheckStatus, GpuVerdict, Report};

/// A GPU index this host (or the snapshot replayed) does not have.
#[derive(Debug, thiserror::Error)]
#[error("there is no GPU {index}; {place} has {count} (indices 0 to {last})")]
pub struct NoSuchGpu {
    index: u32,
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
        if indices.is_empty() || !self.nvml.is_up() {
            return Ok(self.selection(self.gpus.iter().collect()));
        }
        if let Some(&index) = indices
            .iter()
            .find(|index| !self.gpus.iter().any(|gpu| gpu.index == **index))
        {
            return Err(NoSuchGpu {
                index,
                count: self.gpus.len(),
                last: self.gpus.len().saturating_sub(1),
                place: "this host",
            });
        }
        Ok(self.selection(
            self.gpus
                .iter()
                .filter(|gpu| indices.contains(&gpu.index))
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

    /// Orphaned bytes over the GPUs chosen.
    pub fn orphaned_bytes(&self) -> u64 {
        orphaned_bytes_of(self.gpus.iter().copied())
    }
}
