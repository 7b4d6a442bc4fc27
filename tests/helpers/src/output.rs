//! Reading what the exporter prints: Prometheus text (parsed, and checked by promtool) and
//! `check`'s table and verdict lines.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Parsed Prometheus text: every sample with its labels.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub text: String,
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(parse_sample)
            .collect();
        Metrics {
            text: text.to_string(),
            samples,
        }
    }

    /// Samples of `name` whose labels include all of `labels`.
    pub fn find(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Vec<&(String, BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|(sample, sample_labels, _)| {
                sample == name
                    && labels.iter().all(|(key, value)| {
                        sample_labels.get(*key).map(String::as_str) == Some(*value)
                    })
            })
            .collect()
    }

    /// The value of the one sample of `name` with `labels`; fails if there is not exactly
    /// one, except in a sparse family, where a missing member is 0 and a written one must
    /// not be 0.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.find(name, labels);
        if SPARSE_FAMILIES.contains(&name) {
            assert!(
                found.len() <= 1 && found.iter().all(|sample| sample.2 != 0.0),
                "{name}{labels:?} writes its non-zero members once each, found {found:?}:\n{}",
                self.text
            );
            return found.first().map_or(0.0, |sample| sample.2);
        }
        assert_eq!(
            found.len(),
            1,
            "expected one sample {name}{labels:?}, found {}:\n{}",
            found.len(),
            self.text
        );
        found[0].2
    }

    /// Whether any sample of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(sample, _, _)| sample == name)
    }
}

/// Families that write only their non-zero members (docs/reference.md): counts by kind
/// and the one active kind of a state set.
pub const SPARSE_FAMILIES: &[&str] = &[
    "vram_nvml_error",
    "vram_gpu_error",
    "vram_gpu_recovery_action",
    "vram_owner_processes",
    "vram_owned_bytes",
    "vram_gone_owner_processes",
    "vram_owner_processes_usage_unavailable",
    "vram_exited_container_processes",
    "vram_holder_processes",
    "vram_mig_owner_processes",
    "vram_mig_holder_processes",
    "vram_kubelet_error",
    "vram_container_engine_error",
];

fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (name_and_labels, value) = line.rsplit_once(' ').expect("sample value");
    let value: f64 = value.parse().expect("numeric value");
    let Some((name, labels)) = name_and_labels.split_once('{') else {
        return (name_and_labels.to_string(), BTreeMap::new(), value);
    };
    let labels = labels.strip_suffix('}').expect("closing brace");
    let mut parsed = BTreeMap::new();
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").expect("label");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = 0;
        while let Some((index, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, escaped) = chars.next().expect("escape");
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => {
                    end = index + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        parsed.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end..].trim_start_matches(',');
    }
    (name.to_string(), parsed, value)
}

/// The series that name a process, the only ones that may carry its workload (container,
/// pod, Slurm job): on any other series such labels would multiply it by the workloads
/// that come and go.
pub const PER_PROCESS_SERIES: &[&str] = &[
    "vram_holder_info",
    "vram_left_behind_since_timestamp_seconds",
    "vram_process_used_bytes",
];

/// Labels that name a process's workload: its Slurm job, its container's name and image.
const WORKLOAD_LABELS: &[&str] = &[
    "slurm_job_id",
    "slurm_step",
    "slurm_user",
    "container_name",
    "container_image",
];

/// Fail if any series but the per-process ones carries a workload label.
pub fn assert_per_gpu_series_carry_no_workload_labels(metrics: &Metrics) {
    for (name, labels, _) in &metrics.samples {
        if PER_PROCESS_SERIES.contains(&name.as_str()) {
            continue;
        }
        let workload: Vec<&String> = labels
            .keys()
            .filter(|key| WORKLOAD_LABELS.contains(&key.as_str()))
            .collect();
        assert!(
            workload.is_empty(),
            "{name} carries workload labels {workload:?}: only {PER_PROCESS_SERIES:?} may"
        );
    }
}

/// The line that installs promtool (Debian's `prometheus` package ships it).
const INSTALL_PROMTOOL: &str = "apt-get install -y prometheus";

/// promtool: `$PROMTOOL` if set, else the first `promtool` on `PATH`, else
/// `/usr/bin/promtool`. Panics (the test fails) with the install line when there is none.
pub fn promtool() -> PathBuf {
    if let Some(explicit) = std::env::var_os("PROMTOOL") {
        let explicit = PathBuf::from(explicit);
        assert!(
            explicit.is_file(),
            "PROMTOOL={} does not exist; unset it or install promtool with:\n{INSTALL_PROMTOOL}",
            explicit.display()
        );
        return explicit;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("promtool"))
            .find(|candidate| candidate.is_file())
    });
    let found = on_path.or_else(|| {
        let fallback = PathBuf::from("/usr/bin/promtool");
        fallback.is_file().then_some(fallback)
    });
    found.unwrap_or_else(|| {
        panic!(
            "promtool is not installed; these tests need it and do not skip. Install it with:\n{INSTALL_PROMTOOL}"
        )
    })
}

/// Run `promtool check metrics` on `text` and fail with its complaints.
pub fn assert_promtool_clean(text: &str) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics complained:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The cells of a row of `check`'s table: columns are separated by at least two spaces.
pub fn columns(row: &str) -> Vec<&str> {
    row.split("  ")
        .map(str::trim)
        .filter(|cell| !cell.is_empty())
        .collect()
}

/// The verdict sentence `check` prints for `gpu` (the line that starts `GPU N: `).
pub fn verdict_line(stdout: &str, gpu: u32) -> &str {
    let prefix = format!("GPU {gpu}: ");
    stdout
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no verdict for GPU {gpu}:\n{stdout}"))
}

/// The command `check` suggests under `gpu`'s verdict (what follows `suggested: `), if any.
pub fn suggestion(stdout: &str, gpu: u32) -> Option<&str> {
    let verdict = verdict_line(stdout, gpu);
    let after = stdout.split_once(verdict).unwrap().1;
    after
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .find_map(|line| line.trim().strip_prefix("suggested: "))
}

/// The `kill` line `check` suggests for `gpu`, if any: its PIDs, before the comment.
pub fn kill_line(stdout: &str, gpu: u32) -> Option<String> {
    suggestion(stdout, gpu)
        .and_then(|command| command.strip_prefix("kill "))
        .map(|rest| rest.split("   #").next().unwrap().to_string())
}

/// The PIDs of a `check --json` list of processes.
pub fn pids_of(list: &Value) -> Vec<u64> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|process| process["pid"].as_u64().unwrap())
        .collect()
}

/// What a command said: its exit status, standard output and standard error, for the
/// message of an assertion about it.
pub fn said(output: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
