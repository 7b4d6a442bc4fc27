//! Slurm: the job a process runs in, and whether Slurm still runs its step. Pure: a
//! function of the process's cgroup and of the slurmstepds the observation found. What
//! that makes of the remedy is decided in `remedy.rs` (cancel the job) and `notes.rs`
//! (which culprits Slurm left behind).
//!
//! A step runs while its slurmstepd lives. A process whose step has ended was left behind
//! by Slurm (proctrack/linuxproc and proctrack/pgid lose a forked process that left its
//! parent; proctrack/cgroup kills the rest of a step, so what survives is stuck in the
//! driver): cancelling its job would not end it, killing it may. A process of a step that
//! runs is Slurm's to end: `scancel` ends the job the way its user and Slurm's
//! accounting expect.

use crate::observe::{ProcessFacts, SlurmReading};
use serde::Serialize;

/// The Slurm job a process runs in, as the verdict names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlurmJob {
    /// The job id.
    pub job_id: u64,
    /// The step: a number, `batch`, `extern`, `interactive`; `None` when the cgroup names
    /// only the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The job's user: the uid its cgroup names (cgroup v1), else the process's own, by
    /// name where the host knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Whether Slurm still runs it.
    pub state: JobState,
}

/// Whether Slurm still runs a process's job and step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its step's slurmstepd runs.
    Running,
    /// The job runs (some slurmstepd of it does), but the process's step has ended.
    StepEnded,
    /// No slurmstepd of the job runs: the job has ended on this node.
    Ended,
    /// Not known: the look for slurmstepds was cut short or not made.
    Unknown,
}

impl SlurmJob {
    /// The job of a process read from `/proc`, judged against the slurmstepds `running`.
    pub fn of(facts: &ProcessFacts, running: Option<&SlurmReading>) -> Option<SlurmJob> {
        let step = facts.cgroup.slurm.as_ref()?;
        let user = match step.uid {
            Some(uid) if Some(uid) != facts.uid => Some(uid.to_string()),
            _ => facts
                .user
                .clone()
                .or_else(|| facts.uid.map(|uid| uid.to_string())),
        };
        let state = match running {
            Some(reading) if reading.runs(step.job_id, step.step.as_deref()) => JobState::Running,
            // A step not seen may still run where the look did not reach.
            Some(reading) if !reading.complete => JobState::Unknown,
            Some(reading) if reading.runs(step.job_id, None) => JobState::StepEnded,
            Some(_) => JobState::Ended,
            None => JobState::Unknown,
        };
        Some(SlurmJob {
            job_id: step.job_id,
            step: step.step.clone(),
            user,
            state,
        })
    }

    /// `4242.0`, `4242.batch`: Slurm's own way to write a step, or the job alone.
    pub fn step_id(&self) -> String {
        match &self.step {
            Some(step) => format!("{}.{step}", self.job_id),
            None => self.job_id.to_string(),
        }
    }
}

/// What of a Slurm job has ended, where Slurm will no longer end a process of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmEnded {
    /// The whole job, on this node.
    Job,
    /// The process's step, while the job runs on.
    Step,
}

/// Why Slurm will not end a process of its job, where it may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftBySlurm {
    /// Its job or step has ended: Slurm no longer tracks it.
    Ended(SlurmEnded),
    /// Whether Slurm still runs its step cannot be told.
    Unknown,
}

impl SlurmJob {
    /// Why Slurm will not end this job's process; `None` while its step runs, when
    /// cancelling the job ends it.
    pub fn left_by_slurm(&self) -> Option<LeftBySlurm> {
        match self.state {
            JobState::Running => None,
            JobState::StepEnded => Some(LeftBySlurm::Ended(SlurmEnded::Step)),
            JobState::Ended => Some(LeftBySlurm::Ended(SlurmEnded::Job)),
            JobState::Unknown => Some(LeftBySlurm::Unknown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{RunningStep, SlurmStep};

    fn facts_in(job_id: u64, step: Option<&str>, uid_in_path: Option<u32>) -> ProcessFacts {
        let mut facts = crate::classify::tests::fixtures::cuda(795, &[0]);
        facts.uid = Some(1000);
        facts.user = Some("alice".into());
        facts.cgroup.slurm = Some(SlurmStep {
            job_id,
            step: step.map(str::to_string),
            uid: uid_in_path,
        });
        facts
    }

    fn reading(steps: &[(u64, &str)], complete: bool) -> SlurmReading {
        SlurmReading {
            running_steps: steps
                .iter()
                .map(|(job_id, step)| RunningStep {
                    job_id: *job_id,
                    step: (*step).into(),
                })
                .collect(),
            complete,
        }
    }

    fn state(facts: &ProcessFacts, running: Option<&SlurmReading>) -> JobState {
        SlurmJob::of(facts, running).unwrap().state
    }

    #[test]
    fn a_step_runs_while_its_slurmstepd_does() {
        let facts = facts_in(4242, Some("0"), None);
        let both = reading(&[(4242, "0"), (4242, "batch")], true);
        assert_eq!(state(&facts, Some(&both)), JobState::Running);
        let batch_only = reading(&[(4242, "batch")], true);
        assert_eq!(state(&facts, Some(&batch_only)), JobState::StepEnded);
        let other_job = reading(&[(17, "0")], true);
        assert_eq!(state(&facts, Some(&other_job)), JobState::Ended);
        // An incomplete look proves no absence; nor does none at all.
        assert_eq!(state(&facts, Some(&reading(&[], false))), JobState::Unknown);
        assert_eq!(state(&facts, None), JobState::Unknown);
        // A process in the job's own cgroup belongs to any of its steps.
        let job_only = facts_in(4242, None, Some(1000));
        assert_eq!(state(&job_only, Some(&batch_only)), JobState::Running);
    }

    #[test]
    fn the_jobs_user_is_the_paths_uid_or_the_processs() {
        let job = |uid| SlurmJob::of(&facts_in(1, Some("0"), uid), None).unwrap();
        assert_eq!(job(None).user.as_deref(), Some("alice"));
        assert_eq!(job(Some(1000)).user.as_deref(), Some("alice"));
        // A process of another user in alice's job (setuid): the job's uid, by number.
        assert_eq!(job(Some(1001)).user.as_deref(), Some("1001"));
        assert_eq!(job(None).step_id(), "1.0");
    }

    #[test]
    fn a_process_outside_slurm_has_no_job() {
        let facts = crate::classify::tests::fixtures::cuda(795, &[0]);
        assert_eq!(SlurmJob::of(&facts, Some(&reading(&[], true))), None);
    }
}
