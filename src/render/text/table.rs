//! The table for one GPU, nvidia-smi style: its memory, its MIG instances, its owners
//! and the holders of its device file.

use crate::classify::{
    short_container_id, GpuOutcome, GpuVerdict, JobState, Owner, Process, StateQualifier, Suspect,
};
use crate::render::words::{plural, seconds_words, size_words, thousands};
use std::fmt::Write;

/// Most processes a table lists; `check --json` has all.
const MAX_ROWS: usize = 32;

/// The table for one GPU, nvidia-smi style, without the verdict.
pub fn gpu_table(gpu: &GpuVerdict) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPU {}  {}  {}  {}",
        gpu.index,
        or_dash(&gpu.name),
        or_dash(&gpu.pci_bus_id),
        or_dash(&gpu.uuid)
    );
    if !gpu.assigned_to.is_empty() {
        let pods: Vec<String> = gpu
            .assigned_to
            .iter()
            .map(|assigned| format!("{} (container {})", assigned.pod, assigned.container))
            .collect();
        let _ = writeln!(out, "  assigned to {}", pods.join(", "));
    }
    let account = match &gpu.outcome {
        GpuOutcome::Measured(judged) => &judged.account,
        GpuOutcome::NotAnswering {
            call,
            stuck_seconds,
        } => {
            let _ = writeln!(
                out,
                "  (no readings: stuck {} in {call})",
                seconds_words(*stuck_seconds)
            );
            return out;
        }
        GpuOutcome::Failed { .. } => {
            let _ = writeln!(out, "  (no readings)");
            return out;
        }
    };
    let memory = account.memory;
    let _ = writeln!(
        out,
        "  used {}   reserved {}   free {}   total {}",
        size_words(memory.used),
        size_words(memory.reserved),
        size_words(memory.free),
        size_words(memory.total)
    );
    for instance in &gpu.instances {
        let _ = match instance.account() {
            Some(instance_account) => writeln!(
                out,
                "  MIG {}: used {} of {}, {} owner{}",
                instance.label(),
                size_words(instance_account.memory.used),
                size_words(instance_account.memory.total),
                instance_account.owners.len(),
                plural(instance_account.owners.len() as u64, "s")
            ),
            None => writeln!(out, "  MIG {}: (no readings)", instance.label()),
        };
    }
    if account.owners.is_empty() {
        let _ = writeln!(out, "  no processes listed by NVML");
    } else {
        let rows: Vec<Row> = account.owners.iter().map(owner_row).collect();
        table(
            &mut out,
            ["PID", "COMMAND", "STATE", "MEMORY"],
            &rows,
            "owners",
        );
    }
    for (title, suspects) in [
        (
            "holding it with a context (the culprits):",
            account.culprits.iter().collect::<Vec<_>>(),
        ),
        (
            "holding the device file without a context here (not blamed):",
            account.bystanders_apart(false).collect(),
        ),
        (
            "the MPS control daemon and server (not blamed):",
            account.bystanders_apart(true).collect(),
        ),
        (
            "holding the device file, mappings unreadable:",
            account.undetermined.iter().collect(),
        ),
    ] {
        if suspects.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {title}");
        let rows: Vec<Row> = suspects
            .iter()
            .map(|suspect| suspect_row(suspect))
            .collect();
        table(
            &mut out,
            ["PID", "COMMAND", "STATE", "PARENT"],
            &rows,
            "holders",
        );
    }
    out
}

/// One row of a process table: PID, command, state, a figure, the container, and the
/// Slurm job step.
struct Row {
    cells: [String; 4],
    container: Option<String>,
    job: Option<String>,
}

fn owner_row(owner: &Owner) -> Row {
    // The series' word first, then what it does not say: `running (sleeping)`.
    let state = owner.state().as_str();
    let state = match owner.state_qualifier() {
        None => state.to_string(),
        Some(StateQualifier::Process(process)) => format!("{state} ({})", process.words()),
        Some(StateQualifier::Reused) => format!("{state} (reused)"),
    };
    Row {
        cells: [
            owner.pid.to_string(),
            owner
                .process()
                .or(owner.exiting())
                .map_or("-", |process| process.comm.as_str())
                .to_string(),
            state,
            owner.used_bytes.map_or_else(
                || "n/a".to_string(),
                |bytes| format!("{} MiB", thousands(bytes >> 20)),
            ),
        ],
        container: owner.process().map(container_cell),
        job: owner.process().and_then(job_cell),
    }
}

fn suspect_row(suspect: &Suspect) -> Row {
    let process = &suspect.process;
    Row {
        cells: [
            process.pid.to_string(),
            process.comm.clone(),
            process.state.words().to_string(),
            process.ppid.to_string(),
        ],
        container: Some(container_cell(process)),
        job: job_cell(process),
    }
}

/// Header and rows, with a CONTAINER column when any row has a container and a JOB column
/// when any runs in a Slurm job.
fn table(out: &mut String, header: [&str; 4], rows: &[Row], what: &str) {
    let containers = rows
        .iter()
        .any(|row| row.container.as_deref().is_some_and(|cell| cell != "-"));
    let jobs = rows.iter().any(|row| row.job.is_some());
    let width = rows
        .iter()
        .filter_map(|row| row.container.as_deref())
        .map(str::len)
        .chain(["CONTAINER".len()])
        .max()
        .unwrap_or_default();
    let line = |cells: [&str; 4], container: Option<&str>, job: Option<&str>| {
        let mut line = format!(
            "  {:>8}  {:<16}  {:<28}  {:>12}",
            cells[0], cells[1], cells[2], cells[3]
        );
        if let (true, Some(container)) = (containers, container) {
            let _ = write!(line, "  {container:<width$}");
        }
        if jobs {
            let _ = write!(line, "  {}", job.unwrap_or("-"));
        }
        line.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(header, Some("CONTAINER"), Some("JOB")));
    for row in rows.iter().take(MAX_ROWS) {
        let cells = [
            row.cells[0].as_str(),
            row.cells[1].as_str(),
            row.cells[2].as_str(),
            row.cells[3].as_str(),
        ];
        let _ = writeln!(
            out,
            "{}",
            line(
                cells,
                Some(row.container.as_deref().unwrap_or("-")),
                row.job.as_deref()
            )
        );
    }
    if rows.len() > MAX_ROWS {
        let _ = writeln!(
            out,
            "  ... and {} more {what}; vram-exporter check --json lists them all",
            rows.len() - MAX_ROWS
        );
    }
}

/// A process's container by name where its engine named it, else its short id;
/// `(ended)` when it outlived it; `-` on the host.
fn container_cell(process: &Process) -> String {
    let Some(id) = process.cgroup.container_id.as_deref() else {
        return "-".to_string();
    };
    let shown = process
        .container
        .as_ref()
        .map_or_else(|| short_container_id(id), |named| named.name.as_str());
    if process.container_ended() {
        format!("{shown} (ended)")
    } else {
        shown.to_string()
    }
}

/// A process's Slurm job step as Slurm writes it, `4242.0`, `(ended)` when Slurm no
/// longer runs it.
fn job_cell(process: &Process) -> Option<String> {
    let job = process.slurm_job.as_ref()?;
    Some(match job.state {
        JobState::Running | JobState::Unknown => job.step_id(),
        JobState::StepEnded | JobState::Ended => format!("{} (ended)", job.step_id()),
    })
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}
