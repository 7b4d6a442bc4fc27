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
//!
//! Finding them takes a walk over every process, so the ones found are remembered
//! ([`Slurmstepds`]) and only checked again (one read each) while the steps asked about
//! are among them; a step a complete walk found no slurmstepd for is taken as ended for
//! [`ENDED_FOR`] before the next walk looks again (a requeued job runs its steps anew).

use super::reading::{RunningStep, SlurmReading};
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a step a complete walk found no slurmstepd for counts as ended without
/// another walk.
pub(crate) const ENDED_FOR: Duration = Duration::from_secs(10);

/// The command name every slurmstepd has, whatever title it gives itself.
const SLURMSTEPD: &str = "slurmstepd";

/// The slurmstepds found so far, and the steps found ended, kept from one look to the next.
#[derive(Debug, Default)]
pub(crate) struct Slurmstepds {
    /// Each slurmstepd seen running, by PID, with the step its title names.
    known: Vec<(u32, RunningStep)>,
    /// Wanted steps (a step `None`: any step of the job) a complete walk found no
    /// slurmstepd for, and when.
    ended: HashMap<WantedStep, Instant>,
}

impl Slurmstepds {
    /// Which of the `wanted` steps run (a step `None`: any step of the job): from the
    /// slurmstepds known to run still, walking over every process of the procfs mounted
    /// at `procfs` (until `deadline`) only when a wanted step is neither among them nor
    /// recently found ended.
    pub(crate) fn look(
        &mut self,
        procfs: &Path,
        wanted: &[WantedStep],
        deadline: Instant,
    ) -> SlurmReading {
        let now = Instant::now();
        self.known
            .retain(|(pid, step)| still_runs(&pid_dir(procfs, *pid), step));
        self.ended
            .retain(|_, found| now.duration_since(*found) < ENDED_FOR);
        let settled =
            |step: &WantedStep| is_among(step, &self.known) || self.ended.contains_key(step);
        if !wanted.iter().all(settled) {
            let walk = walk(procfs, deadline);
            if walk.complete {
                for step in wanted {
                    if !is_among(step, &walk.found) {
                        self.ended.insert(step.clone(), now);
                    }
                }
                self.known = walk.found;
            } else {
                for found in walk.found {
                    if !self.known.contains(&found) {
                        self.known.push(found);
                    }
                }
                return self.reading(false);
            }
        }
        self.reading(true)
    }

    fn reading(&self, complete: bool) -> SlurmReading {
        let mut running_steps: Vec<RunningStep> =
            self.known.iter().map(|(_, step)| step.clone()).collect();
        running_steps.sort();
        running_steps.dedup();
        SlurmReading {
            running_steps,
            complete,
        }
    }
}

/// A step a look asks about: a job, and its step (`None`: any step of the job).
type WantedStep = (u64, Option<String>);

/// Whether `wanted` is among the `running` slurmstepds' steps.
fn is_among((job_id, step): &WantedStep, running: &[(u32, RunningStep)]) -> bool {
    running.iter().any(|(_, running)| {
        running.job_id == *job_id && step.as_ref().is_none_or(|step| running.step == *step)
    })
}

/// What one walk over the processes found.
struct Walk {
    found: Vec<(u32, RunningStep)>,
    complete: bool,
}

/// Every slurmstepd of the procfs at `procfs`, looking until `deadline`.
fn walk(procfs: &Path, deadline: Instant) -> Walk {
    let Ok(pids) = pids(procfs) else {
        return Walk {
            found: Vec::new(),
            complete: false,
        };
    };
    let mut found = Vec::new();
    for pid in pids {
        if Instant::now() >= deadline {
            return Walk {
                found,
                complete: false,
            };
        }
        if let Some(step) = slurmstepd_at(&pid_dir(procfs, pid)) {
            found.push((pid, step));
        }
    }
    Walk {
        found,
        complete: true,
    }
}

/// Every PID the procfs at `procfs` lists. Read here rather than through `procfs`'s
/// reader: a source folder imports no other, and a walk needs only the numbered names.
fn pids(procfs: &Path) -> std::io::Result<Vec<u32>> {
    Ok(fs::read_dir(procfs)?
        .flatten()
        .filter_map(|entry| pid_name(entry.file_name().to_str()?))
        .collect())
}

/// The PID a procfs entry named `name` is the directory of: digits, never 0 (`self`,
/// `stat` and the other files are not processes).
fn pid_name(name: &str) -> Option<u32> {
    if name.is_empty() || !name.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    name.parse().ok().filter(|&pid| pid != 0)
}

/// The process directory of `pid`.
fn pid_dir(procfs: &Path, pid: u32) -> PathBuf {
    procfs.join(pid.to_string())
}

/// The step of the slurmstepd whose process directory is `dir`, if it is one.
fn slurmstepd_at(dir: &Path) -> Option<RunningStep> {
    // A process that exits meanwhile is simply not a running step.
    let comm = fs::read(dir.join("comm")).ok()?;
    if comm.strip_suffix(b"\n").unwrap_or(&comm) != SLURMSTEPD.as_bytes() {
        return None;
    }
    // Any user can call a process slurmstepd; Slurm's runs as root.
    if fs::metadata(dir).ok()?.uid() != 0 {
        return None;
    }
    step_in_title(&fs::read(dir.join("cmdline")).ok()?)
}

/// Whether the slurmstepd once found at `dir` is there still, for the same step.
fn still_runs(dir: &Path, step: &RunningStep) -> bool {
    slurmstepd_at(dir).as_ref() == Some(step)
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

    fn root(dir: &tempfile::TempDir) -> &Path {
        dir.path()
    }

    fn wanted(steps: &[(u64, &str)]) -> Vec<(u64, Option<String>)> {
        steps
            .iter()
            .map(|(job_id, step)| (*job_id, Some((*step).to_string())))
            .collect()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn every_root_slurmstepd_is_a_running_step() {
        // The tests run as root, so the folders made here are root's, as /proc's are.
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the tests run as root");
        let dir = procfs_with(&[
            (10, "slurmstepd", b"slurmstepd: [7.batch]\0"),
            (11, "slurmstepd", b"slurmstepd: [7.0]\0"),
            (12, "slurmstepd", b"slurmstepd infinity\0"),
            (13, "python3", b"python3\0train.py\0"),
            (14, "slurmstepd", b"slurmstepd: [7.0]\0"),
        ]);
        let reading = Slurmstepds::default().look(root(&dir), &wanted(&[(7, "0")]), soon());
        assert_eq!(
            reading.running_steps,
            [running(7, "0"), running(7, "batch")]
        );
        assert!(reading.complete);
        assert!(reading.runs(7, Some("0")));
        assert!(reading.runs(7, None));
        assert!(!reading.runs(7, Some("1")));
        assert!(!reading.runs(8, None));
        // One that belongs to another user is not Slurm's.
        let process = dir.path().join("15");
        fs::create_dir(&process).unwrap();
        fs::write(process.join("comm"), "slurmstepd\n").unwrap();
        fs::write(process.join("cmdline"), b"slurmstepd: [9.0]\0").unwrap();
        std::os::unix::fs::chown(&process, Some(1000), None).unwrap();
        let reading = Slurmstepds::default().look(root(&dir), &wanted(&[(9, "0")]), soon());
        assert!(!reading.runs(9, None));
    }

    #[test]
    fn known_slurmstepds_spare_the_walk_and_ended_steps_are_remembered() {
        let dir = procfs_with(&[(10, "slurmstepd", b"slurmstepd: [7.0]\0")]);
        let mut stepds = Slurmstepds::default();
        assert!(stepds
            .look(root(&dir), &wanted(&[(7, "0"), (8, "0")]), soon())
            .runs(7, Some("0")));
        // Known, and 8.0 found ended: a look past its deadline needs no walk.
        let reading = stepds.look(root(&dir), &wanted(&[(7, "0"), (8, "0")]), Instant::now());
        assert!(reading.complete && reading.runs(7, Some("0")) && !reading.runs(8, None));
        // The slurmstepd ends: checked again, it is gone, and its step with it.
        fs::write(dir.path().join("10/cmdline"), b"").unwrap();
        let reading = stepds.look(root(&dir), &wanted(&[(7, "0")]), soon());
        assert!(reading.complete && !reading.runs(7, None));
        // A job whose cgroup names no step, found without a slurmstepd, is remembered as
        // ended too: the next look past its deadline needs no walk.
        assert!(stepds.look(root(&dir), &[(11, None)], soon()).complete);
        let reading = stepds.look(root(&dir), &[(11, None)], Instant::now());
        assert!(reading.complete && !reading.runs(11, None));
        // A step never seen needs a walk: one past its deadline is incomplete.
        let reading = stepds.look(root(&dir), &wanted(&[(9, "batch")]), Instant::now());
        assert!(!reading.complete);
    }

    #[test]
    fn a_missing_procfs_is_incomplete() {
        let reading = Slurmstepds::default().look(
            Path::new("/nonexistent/proc"),
            &wanted(&[(7, "0")]),
            soon(),
        );
        assert!(!reading.complete);
    }
}
