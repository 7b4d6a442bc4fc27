//! `check --summary`: the verdict in one line of at most [`SUMMARY_BYTES`] bytes, what a
//! Slurm drain reason, a node-problem-detector condition message (its
//! `max_output_length` is 80 in every sample config) or a Nagios status line can carry:
//! which GPU, how much, why, and what would free it. The GPU it names and its status
//! are classify's ([`Selection::headline`]); this only words them, shortly.

use crate::classify::{CheckStatus, GpuOutcome, Headed, Headline, NvmlStatus, Selection};
use crate::render::words::{finding_shortly, pids_shortly};
use crate::units::format_bytes;

/// The longest summary, in bytes.
pub const SUMMARY_BYTES: usize = 80;

/// The verdict on the GPUs chosen in one line of at most [`SUMMARY_BYTES`] bytes (ASCII),
/// without a line end. With `foreign`, live processes in no running job make a GPU in
/// use.
pub fn summary_line(selection: &Selection, foreign: bool) -> String {
    summary_line_where(selection, foreign, |status| status == selection.status)
}

/// As [`summary_line`], naming the first GPU whose status is `wanted` when there is one:
/// the line of a rule about one verdict.
pub fn summary_line_where(
    selection: &Selection,
    foreign: bool,
    wanted: impl Fn(CheckStatus) -> bool,
) -> String {
    if let NvmlStatus::Down { error, stuck, .. } = &selection.report.nvml {
        let line = match stuck {
            Some(stuck) => format!(
                "NVML not answering: stuck {:.0} s in {}",
                stuck.stuck_seconds, stuck.call
            ),
            // The cause alone: the library's path would take the room.
            None => format!("NVML down: {}", error.rsplit(": ").next().unwrap_or(error)),
        };
        return fit(&line, "");
    }
    let Some(headline) = selection.headline_where(foreign, wanted) else {
        return "no GPUs".into();
    };
    let more = match headline.others {
        0 => String::new(),
        1 => " (+1 GPU)".into(),
        others => format!(" (+{others} GPUs)"),
    };
    if headline.status == Headed::Status(CheckStatus::Clear) {
        return fit(&clear_line(selection, foreign), "");
    }
    fit(&problem_line(&headline, selection), &more)
}

/// Every GPU chosen is clear: say so of all of them.
fn clear_line(selection: &Selection, foreign: bool) -> String {
    let indices: Vec<String> = selection
        .gpus
        .iter()
        .map(|gpu| gpu.index.to_string())
        .collect();
    let how = if selection.all_idle() {
        "idle"
    } else if foreign {
        "no memory held outside running jobs"
    } else {
        "no memory held without a live owner"
    };
    format!("GPU {} clear: {how}", indices.join(","))
}

/// The headline GPU's problem: `GPU 1 orphaned: 8.6 GiB, owner 503 exited; kill 524`.
fn problem_line(headline: &Headline, selection: &Selection) -> String {
    let gpu = headline.gpu;
    let name = match headline.instance {
        Some(instance) => format!("GPU {} MIG {}", gpu.index, instance.label()),
        None => format!("GPU {}", gpu.index),
    };
    let outcome = headline
        .instance
        .map_or(&gpu.outcome, |instance| &instance.outcome);
    match outcome {
        GpuOutcome::NotAnswering {
            call,
            stuck_seconds,
        } => return format!("{name} not answering: stuck {stuck_seconds:.0} s in {call}"),
        GpuOutcome::Failed { error, .. } => {
            return format!("{name} cannot tell: NVML error {}", error.as_str())
        }
        GpuOutcome::Measured(_) => {}
    }
    let Some(judged) = headline.judged else {
        return format!("{name} cannot tell");
    };
    let (account, verdict) = (&judged.account, &judged.verdict);
    if headline.status == Headed::InUse {
        let pids: Vec<u32> = selection
            .foreign_owners()
            .iter()
            .filter(|foreign| std::ptr::eq(foreign.gpu, gpu))
            .map(|foreign| foreign.owner.pid)
            .collect();
        let bytes = account.live_owned_bytes();
        return format!(
            "{name} in use: {}, by PID {} in no running job",
            format_bytes(bytes),
            pids_shortly(&pids)
        );
    }
    let held = format_bytes(gpu.to_free_bytes().max(account.orphaned_bytes()));
    finding_shortly(&name, &held, gpu.index, account, verdict)
}

/// With `--foreign`, a line per live owner in no running Slurm job, for the report
/// beside the summary: `GPU 0: PID 600 (python3) holds 8.6 GiB and is in no running
/// Slurm job`.
pub fn foreign_lines(selection: &Selection) -> Vec<String> {
    selection
        .foreign_owners()
        .iter()
        .map(|foreign| {
            let process = foreign.owner.process();
            let comm = process.map_or("?", |process| process.comm.as_str());
            let held = foreign
                .owner
                .used_bytes
                .map_or_else(|| "memory".to_string(), format_bytes);
            let outside = match process.and_then(|process| process.slurm_job.as_ref()) {
                Some(job) => format!("is of Slurm job {}, which has ended", job.job_id),
                None => "is in no Slurm job".to_string(),
            };
            format!(
                "GPU {}: PID {} ({comm}) holds {held} and {outside}: to a job on this GPU it is a process outside the job.",
                foreign.gpu.index, foreign.owner.pid
            )
        })
        .collect()
}

/// `line` then `tail`, within [`SUMMARY_BYTES`]: `line` is cut (ending in `...`) to leave
/// room for `tail`, which says how many other GPUs need a look. Only ASCII goes out, so
/// that a cut never splits a character and every reader counts the same bytes.
fn fit(line: &str, tail: &str) -> String {
    let ascii: String = line
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .collect();
    let room = SUMMARY_BYTES - tail.len();
    if ascii.len() <= room {
        return format!("{ascii}{tail}");
    }
    format!("{}...{tail}", &ascii[..room - 3])
}

#[cfg(test)]
mod tests {
    use super::{fit, summary_line};
    use crate::classify::tests::fixtures::*;
    use crate::classify::*;

    fn line(report: &Report, foreign: bool) -> String {
        let line = summary_line(&report.select(&[]).unwrap(), foreign);
        assert!(line.len() <= 80 && line.is_ascii(), "{line:?}");
        line
    }

    #[test]
    fn each_verdict_says_the_gpu_how_much_why_and_what_frees_it() {
        assert_eq!(
            line(&fork_orphan().report(), false),
            "GPU 0 orphaned: 8.6 GiB, held by PID 524; kill 524"
        );
        assert_eq!(
            line(
                &slurm_fork_orphan().slurm_running(&[(4242, "0")]).report(),
                false
            ),
            "GPU 0 orphaned: 8.6 GiB, held by PID 524; scancel 4242"
        );
        let no_holder = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
            .scanned();
        assert_eq!(
            line(&no_holder.report(), false),
            "GPU 0 orphaned: 8.6 GiB, owner 503 exited; reset GPU 0"
        );
        let mut exiting = cuda(432, &[]).state('D');
        exiting.exiting = true;
        let being_freed = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(432, Some(CHARGED_ONE_OWNER), present(exiting))
            .scanned();
        assert_eq!(
            line(&being_freed.report(), false),
            "GPU 0 being freed: 8.6 GiB, PID 432 exiting"
        );
        assert_eq!(
            line(&Host::idle().gpu(1).report(), false),
            "GPU 0,1 clear: idle"
        );
        let owned = Host::idle()
            .used(USED_ONE_OWNER)
            .owner(600, Some(CHARGED_ONE_OWNER), present(cuda(600, &[0])))
            .slurm_running(&[]);
        assert_eq!(
            line(&owned.report(), false),
            "GPU 0 clear: no memory held without a live owner"
        );
        assert_eq!(
            line(&owned.report(), true),
            "GPU 0 in use: 8.6 GiB, by PID 600 in no running job"
        );
        assert_eq!(
            super::foreign_lines(&owned.report().select(&[]).unwrap()),
            ["GPU 0: PID 600 (python3) holds 8.6 GiB and is in no Slurm job: to a job on this GPU it is a process outside the job."]
        );
        let hung = fork_orphan().gpu(1).not_answering(1, 12.0).report();
        assert_eq!(
            line(&hung, false),
            "GPU 1 not answering: stuck 12 s in nvmlDeviceGetMemoryInfo_v2 (+1 GPU)"
        );
    }

    #[test]
    fn nvml_down_is_said_with_its_cause() {
        let mut observation = Host::idle().observation();
        observation.nvml = nvml_down(
            "cannot load NVML from /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: NVIDIA driver is not loaded",
        );
        let report = classify(&observation, &Settings::default());
        assert_eq!(
            line(&report, false),
            "NVML down: NVIDIA driver is not loaded"
        );
        observation.nvml = nvml_not_answering(31.0);
        let report = classify(&observation, &Settings::default());
        assert_eq!(
            line(&report, false),
            "NVML not answering: stuck 31 s in nvmlInit_v2"
        );
    }

    #[test]
    fn a_long_line_is_cut_to_eighty_bytes_and_keeps_its_tail() {
        let long = "x".repeat(200);
        let cut = fit(&long, " (+2 GPUs)");
        assert_eq!(cut.len(), 80);
        assert!(cut.ends_with("... (+2 GPUs)"), "{cut}");
        assert_eq!(fit("GPU 0 clear: idle", ""), "GPU 0 clear: idle");
        // Whatever a process or NVML names itself, the line stays ASCII.
        assert_eq!(fit("NVML down: caf\u{e9}\n", ""), "NVML down: caf??");
    }
}
