//! Which Slurm job steps still run on this node, from Slurm's own processes: every step
//! has a `slurmstepd` (owned by root, named `slurmstepd: [<job>.<step>]`) for as long as
//! Slurm runs it, and it is gone once the step has ended, whether its tasks ended with it
//! or not. Read from `/proc` alone: no credentials (`squeue` and `scontrol` need munge),
//! no command run, no spool directory to mount.
//!
//! Measured with Debian's Slurm 22.05 (cgroup v1, proctrack/cgroup and linuxproc): a
//! batch job has `slurmstepd: [2.batch]` and, with `PrologFlags=Contain`,
//! `slurmstepd: [2.extern]`; each `srun` step `slurmstepd: [2.0]`; each is adopted by
//! PID 1 and lives until its step ends. cgroup v2 names them the same (Slurm's
//! `doc/html/cgroup_v2.shtml`), beside `slurmstepd infinity`, which belongs to no job.

use super::root::ProcRoot;
use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

/// The command name every slurmstepd has, whatever title it gives itself.
const SLURMSTEPD: &str = "slurmstepd";

/// The job steps whose slurmstepd was seen running.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmReading {
    /// Each running step, once, in order.
    pub running_steps: Vec<RunningStep>,
    /// Whether every process was looked at: when not, a step not listed may still run.
    pub complete: bool,
}

/// One job step whose slurmstepd runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// Every slurmstepd under `root`, looking until `deadline`.
pub(crate) fn look_for_slurmstepds(root: &ProcRoot, deadline: Instant) -> SlurmReading {
    let Ok(entries) = fs::read_dir(&root.root) else {
        return SlurmReading::default();
    };
    let mut running_steps = Vec::new();
    for entry in entries.flatten() {
        if Instant::now() >= deadline {
            running_steps.sort();
            running_steps.dedup();
            return SlurmReading {
                running_steps,
                complete: false,
            };
        }
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let dir = entry.path();
        // A process that exits meanwhile is simply not a running step.
        let Ok(comm) = fs::read(dir.join("comm")) else {
            continue;
        };
        if comm.strip_suffix(b"\n").unwrap_or(&comm) != SLURMSTEPD.as_bytes() {
            continue;
        }
        // Any user can call a process slurmstepd; Slurm's runs as root.
        if fs::metadata(&dir).map_or(true, |metadata| metadata.uid() != 0) {
            continue;
        }
        if let Some(step) = fs::read(dir.join("cmdline"))
            .ok()
            .and_then(|cmdline| step_in_title(&cmdline))
        {
            running_steps.push(step);
        }
    }
    running_steps.sort();
    running_steps.dedup();
    SlurmReading {
        running_steps,
        complete: true,
    }
}

/// The step a slurmstepd's title names: `slurmstepd: [4242.0]`, `[4242.batch]`.
fn step_in_title(cmdline: &[u8]) -> Option<RunningStep> {
    let text = String::from_utf8_lossy(cmdline);
    let inside = text.split_once('[')?.1.split_once(']')?.0;
    let (job, step) = inside.split_once('.')?;
    if job.is_empty() || !job.bytes().all(|byte| byte.is_ascii_digit()) || step.is_empty() {
        return None;
    }
    Some(RunningStep {
        job_id: job.parse().ok()?,
        step: step.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn running(job_id: u64, step: &str) -> RunningStep {
        RunningStep {
            job_id,
            step: step.into(),
        }
    }

    #[test]
    fn titles_name_the_step() {
        // As Slurm 22.05 pads it, with the NUL that ends argv[0].
        assert_eq!(
            step_in_title(b"slurmstepd: [2.0]    \0"),
            Some(running(2, "0"))
        );
        assert_eq!(
            step_in_title(b"slurmstepd: [4242.batch]\0"),
            Some(running(4242, "batch"))
        );
        assert_eq!(
            step_in_title(b"slurmstepd: [3385.extern]"),
            Some(running(3385, "extern"))
        );
        for title in [
            &b"slurmstepd infinity\0"[..],
            b"slurmstepd: [x.0]",
            b"slurmstepd: [12.]",
            b"slurmstepd: [12]",
            b"",
        ] {
            assert_eq!(step_in_title(title), None, "{title:?}");
        }
    }

    fn procfs_with(processes: &[(u32, &str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm, cmdline) in processes {
            let process = dir.path().join(pid.to_string());
            fs::create_dir(&process).unwrap();
            fs::write(process.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(process.join("cmdline"), cmdline).unwrap();
        }
        fs::create_dir(dir.path().join("self")).unwrap();
        dir
    }

    fn root(dir: &tempfile::TempDir) -> ProcRoot {
        ProcRoot {
            root: dir.path().to_path_buf(),
            device_prefix: b"/dev/nvidia".to_vec(),
        }
    }

    #[test]
    fn every_root_slurmstepd_is_a_running_step() {
        // The tests run as root, so the folders made here are root's, as /proc's are.
        let dir = procfs_with(&[
            (10, "slurmstepd", b"slurmstepd: [7.batch]\0"),
            (11, "slurmstepd", b"slurmstepd: [7.0]\0"),
            (12, "slurmstepd", b"slurmstepd infinity\0"),
            (13, "python3", b"python3\0train.py\0"),
            (14, "slurmstepd", b"slurmstepd: [7.0]\0"),
        ]);
        let reading = look_for_slurmstepds(&root(&dir), Instant::now() + Duration::from_secs(5));
        let owned_by_root = fs::metadata(dir.path()).unwrap().uid() == 0;
        if owned_by_root {
            assert_eq!(
                reading.running_steps,
                [running(7, "0"), running(7, "batch")]
            );
            assert!(reading.runs(7, Some("0")));
            assert!(reading.runs(7, None));
            assert!(!reading.runs(7, Some("1")));
            assert!(!reading.runs(8, None));
        } else {
            // A look-alike owned by another user is not Slurm's.
            assert!(reading.running_steps.is_empty());
        }
        assert!(reading.complete);
    }

    #[test]
    fn a_look_past_its_deadline_is_incomplete() {
        let dir = procfs_with(&[(10, "slurmstepd", b"slurmstepd: [7.0]\0")]);
        let reading = look_for_slurmstepds(&root(&dir), Instant::now());
        assert!(!reading.complete);
    }

    #[test]
    fn a_missing_procfs_is_incomplete() {
        let reading = look_for_slurmstepds(
            &ProcRoot {
                root: "/nonexistent/proc".into(),
                device_prefix: Vec::new(),
            },
            Instant::now() + Duration::from_secs(1),
        );
        assert!(!reading.complete);
    }
}
