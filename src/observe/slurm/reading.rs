//! Which Slurm job steps run: plain data, serialisable, so a snapshot taken on one
//! machine replays to the same verdict on another.

use serde::{Deserialize, Serialize};

/// The job steps whose slurmstepd was seen running.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmReading {
    /// Each running step, once, in order.
    pub running_steps: Vec<RunningStep>,
    /// Whether every process was looked at: when not, a step not listed may still run.
    pub complete: bool,
}

/// One job step whose slurmstepd runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunningStep {
    /// The job.
    pub job_id: u64,
    /// The step: a number, `batch`, `extern`, `interactive`.
    pub step: String,
}

impl SlurmReading {
    /// Whether step `step` of job `job_id` runs; `None` for any step of the job.
    pub fn runs(&self, job_id: u64, step: Option<&str>) -> bool {
        self.running_steps
            .iter()
            .any(|running| running.job_id == job_id && step.is_none_or(|step| running.step == step))
    }
}
