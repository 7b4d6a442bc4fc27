//! The three renderers on reports the classifier makes from fixed hosts: what each says,
//! and that all three say the same of one report.

use super::json::check_document;
use super::prometheus::{encode_report, BuildInfo, RenderOptions, ScrapeTiming};
use super::text::{check_text, gpu_table, verdict, Verdict};
use crate::classify::fixtures::*;
use crate::classify::{
    classify, NamespaceInit, RecoveryAction, References, Report, Settings, XidReading,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::collections::BTreeMap;

// Helpers.

/// `check --json` of every GPU of `report`.
fn json_of(report: &Report) -> Value {
    serde_json::to_value(check_document(&report.select(&[]).unwrap())).unwrap()
}

/// `check`'s text of every GPU of `report`.
fn text_of(report: &Report) -> String {
    check_text(&report.select(&[]).unwrap())
}

#[derive(Debug)]
struct Encoded(Report);

impl Collector for Encoded {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let options = RenderOptions {
            per_process_limit: Some(64),
        };
        let timing = ScrapeTiming {
            total_seconds: 0.25,
            scan_seconds: None,
        };
        let build = BuildInfo {
            version: "1.2.3",
            revision: "abc",
        };
        encode_report(&mut encoder, &self.0, &build, &options, timing)
    }
}

/// The Prometheus text of `report`.
fn metrics_of(report: &Report) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Encoded(report.clone())));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    text
}

/// One sample: family, labels in order, value.
type Sample = (String, Vec<(String, String)>, f64);

/// The samples of a Prometheus text (label values here hold no quote or backslash).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once("=\"").unwrap();
                    (key.to_string(), value.trim_end_matches('"').to_string())
                })
                .collect();
            (name.to_string(), labels, value.parse().unwrap())
        })
        .collect()
}

/// The samples of `family` whose labels include `with`.
fn find<'a>(samples: &'a [Sample], family: &str, with: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|(name, labels, _)| {
            name == family
                && with
                    .iter()
                    .all(|(key, value)| labels.iter().any(|(k, v)| k == key && v == value))
        })
        .collect()
}

/// Families that write only their non-zero members: counts by kind and the one active
/// kind of a state set. A missing member reads as 0, and a written one must not be 0.
const SPARSE_FAMILIES: &[&str] = &[
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

/// The one value of `family` with `with` (0 for a missing member of a sparse family).
fn value(samples: &[Sample], family: &str, with: &[(&str, &str)]) -> f64 {
    match find(samples, family, with).as_slice() {
        [one] if SPARSE_FAMILIES.contains(&family) => {
            assert_ne!(one.2, 0.0, "{family} {with:?} writes no zeros");
            one.2
        }
        [one] => one.2,
        [] if SPARSE_FAMILIES.contains(&family) => 0.0,
        other => panic!("{family} {with:?}: {other:?}"),
    }
}

/// The PIDs a text names as `PID 524 (...)`, in order.
fn pids_named(text: &str) -> Vec<u32> {
    text.match_indices("PID ")
        .filter_map(|(at, _)| {
            let rest = &text[at + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[digits.len()..]
                .starts_with(" (")
                .then(|| digits.parse().ok())?
        })
        .collect()
}

/// The PIDs a JSON list of holders names.
fn json_pids(holders: &Value) -> Vec<u32> {
    holders
        .as_array()
        .unwrap()
        .iter()
        .map(|holder| holder["pid"].as_u64().unwrap() as u32)
        .collect()
}

/// The fork-inherited orphan, its child 524 in a container that has ended, an NVML client
/// 467 beside it, the driver asking for a reset, and an idle GPU 1.
fn stuck_in_an_ended_container() -> Host {
    Host::idle()
        .gpu(1)
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(contained(
            cuda(524, &[0]).child_of(503).started(150_000),
            Some(NamespaceInit::Exited { pid: 9 }),
        ))
        .holder(nvml_client(467, "nvidia-smi", &[0]))
        .health(recovery(RecoveryAction::GpuReset))
}

// Text.

#[test]
fn text_names_the_culprit_of_a_fork_orphan_and_suggests_killing_it() {
    let report = fork_orphan().report();
    let words = verdict(&report.gpus[0]);
    assert_eq!(
        words.sentence,
        "GPU 0: 8.6 GiB (8,802 MiB) held for exited PID 503; still held by PID 524 (python3, sleeping, started 2026-12-03 00:25:00 UTC, user root, parent 503, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, child of exited PID 503, in the process group and session of exited PID 503) - killing 524 should free it."
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("kill 524   # 524 is python3, started 2026-12-03 00:25:00 UTC; then: vram-exporter check --gpu 0 --wait 30s")
    );
    assert_eq!(words.notes, Vec::<String>::new());
}

/// The Slurm fork orphan of the fixtures, with slurmstepds running the steps `running`.
fn slurm_orphan(running: &[(u64, &str)]) -> Host {
    slurm_fork_orphan().slurm_running(running)
}

#[test]
fn text_suggests_scancel_for_a_culprit_whose_step_runs() {
    let report = slurm_orphan(&[(4242, "0")]).report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.contains(", user alice, parent 503, Slurm job 4242 step 0 of user alice, running, holds a context on GPU 0")
            && words.sentence.ends_with(" - cancelling Slurm job 4242 should free it."),
        "{}",
        words.sentence
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("scancel 4242   # job 4242 of user alice still runs the step that holds it: 524 is python3, started 2026-12-03 00:25:00 UTC; then: vram-exporter check --gpu 0 --wait 30s")
    );
    assert_eq!(words.notes, Vec::<String>::new());
    let table = gpu_table(&report.gpus[0]);
    let header = table.lines().find(|line| line.contains("PARENT")).unwrap();
    assert!(header.ends_with("PARENT  JOB"), "{table}");
    assert!(
        table
            .lines()
            .any(|line| line.trim_start().starts_with("524 ") && line.ends_with("  4242.0")),
        "{table}"
    );
}

#[test]
fn text_suggests_kill_and_says_why_when_the_job_has_ended() {
    let report = slurm_orphan(&[]).report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words
            .sentence
            .contains("Slurm job 4242 step 0 of user alice, a job that has ended, holds")
            && words.sentence.ends_with(" - killing 524 should free it."),
        "{}",
        words.sentence
    );
    assert!(words
        .suggestion
        .as_deref()
        .unwrap()
        .starts_with("kill 524   # "));
    assert_eq!(
        words.notes,
        ["PID 524 is of Slurm job 4242 (step 0), which has ended: the process survived its job, so Slurm no longer tracks it and scancel cannot end it; kill it (a process that leaves its parent escapes proctrack/linuxproc and proctrack/pgid; under proctrack/cgroup only one stuck in the driver survives)."]
    );
    let table = gpu_table(&report.gpus[0]);
    assert!(table.contains("  4242.0 (ended)"), "{table}");
    // The step ended, the job runs on.
    let words = verdict(&slurm_orphan(&[(4242, "batch")]).report().gpus[0]);
    assert!(words
        .suggestion
        .as_deref()
        .unwrap()
        .starts_with("kill 524 "));
    assert!(
        words.notes[0]
            .contains("cancelling the job would stop its work without ending this process"),
        "{:?}",
        words.notes
    );
}

#[test]
fn json_and_metrics_carry_the_slurm_job_on_per_process_series_only() {
    let report = slurm_orphan(&[(4242, "0")]).report();
    let document = json_of(&report);
    let culprit = &document["gpus"][0]["culprits"][0];
    assert_eq!(
        culprit["slurm_job"],
        json!({"job_id": 4242, "step": "0", "user": "alice", "state": "running"})
    );
    assert_eq!(
        culprit["slurm"],
        json!({"job_id": 4242, "step": "0", "uid": 1000})
    );
    assert_eq!(document["gpus"][0]["remedy"]["action"], "cancel_jobs");
    assert_eq!(document["gpus"][0]["remedy"]["jobs"][0]["job_id"], 4242);
    let samples = samples(&metrics_of(&report));
    assert_eq!(
        value(
            &samples,
            "vram_holder_info",
            &[
                ("pid", "524"),
                ("slurm_job_id", "4242"),
                ("slurm_step", "0"),
                ("slurm_user", "alice")
            ]
        ),
        1.0
    );
    let per_process = ["vram_holder_info", "vram_process_used_bytes"];
    for (family, labels, _) in &samples {
        if per_process.contains(&family.as_str()) {
            continue;
        }
        assert!(
            labels.iter().all(|(key, _)| !key.starts_with("slurm_")),
            "{family} {labels:?}"
        );
    }
}

#[test]
fn a_container_its_engine_named_is_shown_by_name_and_image() {
    let report = stuck_in_an_ended_container().containers_named().report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.contains(&format!(
            ", container trainer ({}, image localhost/model:1, podman pod lab), ",
            &CONTAINER[..12]
        )),
        "{}",
        words.sentence
    );
    let table = gpu_table(&report.gpus[0]);
    assert!(table.contains("  trainer (ended)"), "{table}");
    let document = json_of(&report);
    assert_eq!(
        document["gpus"][0]["culprits"][0]["container"],
        json!({"engine": "podman", "name": "trainer", "image": "localhost/model:1", "pod": "lab"})
    );
    let samples = samples(&metrics_of(&report));
    assert_eq!(
        value(
            &samples,
            "vram_holder_info",
            &[
                ("pid", "524"),
                ("container_name", "trainer"),
                ("container_image", "localhost/model:1")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "vram_container_engine_up",
            &[("engine", "podman")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "vram_container_engine_error",
            &[("engine", "docker"), ("error", "absent")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "vram_container_engine_last_success_timestamp_seconds",
            &[("engine", "podman")]
        ),
        1_764_800_000.5
    );
    for (family, labels, _) in &samples {
        if ["vram_holder_info", "vram_process_used_bytes"].contains(&family.as_str()) {
            continue;
        }
        assert!(
            labels
                .iter()
                .all(|(key, _)| !key.starts_with("container_") || key == "container_id"),
            "{family} {labels:?}"
        );
    }
}

#[test]
fn without_a_boot_time_a_start_is_said_in_seconds_after_boot() {
    // A snapshot recorded without the host's boot time: 150,000 ticks at 100 a second.
    let mut observation = fork_orphan().observation();
    observation.boot_time_unix_seconds = None;
    let report = classify(&observation, &Settings::default());
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.contains(
            "still held by PID 524 (python3, sleeping, started 1500 s after boot, user root,"
        ),
        "{}",
        words.sentence
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("kill 524   # 524 is python3, started 1500 s after boot; then: vram-exporter check --gpu 0 --wait 30s")
    );
    assert!(!text_of(&report).contains("ticks"), "{}", text_of(&report));
}

#[test]
fn text_says_how_gone_owners_went_as_the_classifier_decided() {
    let mut exiting = cuda(432, &[]).state('Z');
    exiting.threads = 1;
    let report = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(exiting))
        .scanned()
        .report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.starts_with(
            "GPU 0: 8.6 GiB (8,802 MiB) being freed: owner PID 432 is exiting and the driver is freeing its memory"
        ),
        "{}",
        words.sentence
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("vram-exporter check --gpu 0 --wait 5s")
    );

    // One exited, one whose PID names an NVML client now: together they are gone.
    let two = |second: ProcessLookup| {
        let report = Host::idle()
            .used(2 * USED_ONE_OWNER)
            .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
            .owner(504, Some(CHARGED_ONE_OWNER), second)
            .scanned()
            .report();
        verdict(&report.gpus[0]).sentence
    };
    let mixed = two(present(nvml_client(504, "gpu-health", &[0])));
    assert!(mixed.contains(" held for gone PIDs 503, 504;"), "{mixed}");
    let exited = two(ProcessLookup::Missing);
    assert!(
        exited.contains(" held for exited PIDs 503, 504;"),
        "{exited}"
    );
}

#[test]
fn text_suggests_sudo_only_where_a_privilege_would_show_more() {
    let suggestion = |host: Host| verdict(&host.report().gpus[0]).suggestion;
    let mut unreadable = cuda(600, &[0]);
    unreadable.mappings = References::Unreadable;
    assert_eq!(
        suggestion(
            Host::idle()
                .used(USED_ONE_OWNER)
                .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
                .holder(unreadable)
        )
        .as_deref(),
        Some("sudo vram-exporter check --gpu 0")
    );
    let mut cut_short = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .scanned();
    cut_short.scan_cut_short = true;
    assert_eq!(
        suggestion(cut_short).as_deref(),
        Some("vram-exporter check --gpu 0")
    );
    // Culprits in another PID namespace: no command from here reaches them.
    let mut hidden = cuda(524, &[0]).child_of(503);
    hidden.local_pid = None;
    assert_eq!(suggestion(fork_orphan().holder(hidden)), None);
}

#[test]
fn text_gives_the_live_owners_bytes_or_the_overhead_when_there_are_none() {
    let owned = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .report();
    assert_eq!(
        verdict(&owned.gpus[0]).sentence,
        "GPU 0: 8.6 GiB (8,802 MiB) owned by 1 live process; nothing orphaned."
    );
    // A gone owner charged nothing, and its context's overhead not yet freed.
    let overhead = Host::idle()
        .used(9 * MIB)
        .owner(503, Some(0), ProcessLookup::Missing)
        .report();
    assert_eq!(
        verdict(&overhead.gpus[0]).sentence,
        "GPU 0: 9.0 MiB used, within the driver's overhead; nothing orphaned."
    );
}

#[test]
fn text_table_adds_what_the_state_word_does_not_say() {
    let report = Host::idle()
        .used(3 * USED_ONE_OWNER)
        .owner(432, Some(CHARGED_ONE_OWNER), present(cuda(432, &[0])))
        .owner(
            433,
            Some(CHARGED_ONE_OWNER),
            present(cuda(433, &[0]).state('T')),
        )
        .owner(
            503,
            Some(CHARGED_ONE_OWNER),
            present(nvml_client(503, "gpu-health", &[0])),
        )
        .scanned()
        .report();
    let table = gpu_table(&report.gpus[0]);
    let state_of = |pid: &str| {
        let row = table
            .lines()
            .find(|line| line.split_whitespace().next() == Some(pid))
            .unwrap_or_else(|| panic!("no row for {pid}: {table}"));
        row[30..58].trim().to_string()
    };
    assert_eq!(state_of("432"), "running (sleeping)");
    assert_eq!(state_of("433"), "stopped");
    assert_eq!(state_of("503"), "gone (reused)");
}

#[test]
fn text_names_eight_bystanders_then_how_many_more() {
    let mut host = fork_orphan();
    for pid in 700..710 {
        host = host.holder(nvml_client(pid, "dcgmi", &[0]));
    }
    let report = host.report();
    let Verdict { notes, .. } = verdict(&report.gpus[0]);
    let note = notes
        .iter()
        .find(|note| note.starts_with("Not blamed"))
        .expect("the bystanders' note");
    assert_eq!(pids_named(note), (700..708).collect::<Vec<_>>());
    assert!(note.ends_with(" and 2 more."), "{note}");
}

#[test]
fn text_says_why_nvml_is_down_and_nothing_else() {
    let mut observation = Host::idle().observation();
    observation.nvml = nvml_down("cannot load NVML");
    let report = classify(&observation, &Settings::default());
    assert_eq!(
        text_of(&report),
        "NVML is not available: cannot load NVML\n"
    );
}

#[test]
fn a_gpu_that_does_not_answer_says_which_call_in_text_json_and_prometheus() {
    let report = Host::idle().gpu(1).not_answering(1, 25.4).report();
    let sentence =
        "GPU 1 does not answer NVML (stuck 25 s in nvmlDeviceGetMemoryInfo_v2): cannot tell.";
    assert_eq!(verdict(&report.gpus[1]).sentence, sentence);
    assert!(gpu_table(&report.gpus[1])
        .ends_with("\n  (no readings: stuck 25 s in nvmlDeviceGetMemoryInfo_v2)\n"));
    let json = json_of(&report);
    assert_eq!(json["status"], "not_answering");
    assert_eq!(json["gpus"][1]["status"], "not_answering");
    assert_eq!(json["gpus"][1]["error"], "timeout");
    assert_eq!(
        json["gpus"][1]["not_answering"],
        json!({ "call": "nvmlDeviceGetMemoryInfo_v2", "stuck_seconds": 25.4 })
    );
    assert_eq!(json["gpus"][1]["verdict"]["sentence"], sentence);
    // A GPU that answers has no such key.
    assert!(json["gpus"][0].get("not_answering").is_none());
    let text = metrics_of(&report);
    let written = samples(&text);
    let gpu1 = [("gpu", "1")];
    assert_eq!(value(&written, "vram_gpu_up", &gpu1), 0.0);
    assert_eq!(
        value(
            &written,
            "vram_gpu_error",
            &[("gpu", "1"), ("error", "timeout")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &written,
            "vram_gpu_error",
            &[("gpu", "0"), ("error", "timeout")]
        ),
        0.0
    );
    assert!(text.lines().any(|line| line
        == "vram_gpu_stuck_seconds{gpu=\"1\",uuid=\"GPU-1\",call=\"nvmlDeviceGetMemoryInfo_v2\"} 25.4"));
    assert!(find(&written, "vram_gpu_stuck_seconds", &[("gpu", "0")]).is_empty());
    assert!(find(&written, "vram_used_bytes", &gpu1).is_empty());
    assert_eq!(value(&written, "vram_gpu_up", &[("gpu", "0")]), 1.0);
    assert_eq!(value(&written, "vram_nvml_up", &[]), 1.0);
    assert_eq!(value(&written, "vram_procfs_stuck_seconds", &[]), 0.0);
}

#[test]
fn nvml_that_does_not_answer_is_said_with_its_call() {
    let mut observation = Host::idle().observation();
    observation.nvml = nvml_not_answering(12.0);
    let report = classify(&observation, &Settings::default());
    assert!(text_of(&report)
        .starts_with("NVML does not answer (stuck 12 s in nvmlInit_v2): cannot tell.\n"));
    let written = samples(&metrics_of(&report));
    assert_eq!(value(&written, "vram_nvml_up", &[]), 0.0);
    for (reason, expected) in [
        ("missing", 0.0),
        ("init_failed", 0.0),
        ("not_answering", 1.0),
        ("failed", 0.0),
    ] {
        assert_eq!(
            value(&written, "vram_nvml_error", &[("error", reason)]),
            expected,
            "{reason}"
        );
    }
    assert_eq!(
        value(
            &written,
            "vram_nvml_stuck_seconds",
            &[("call", "nvmlInit_v2")]
        ),
        12.0
    );
    let json = json_of(&report);
    assert_eq!(json["status"], "not_answering");
    assert_eq!(json["nvml_failure"], "not_answering");
    assert_eq!(json["nvml_stuck"]["call"], "nvmlInit_v2");
    // NVML that answers writes every reason 0 and no stuck call.
    let healthy = samples(&metrics_of(&Host::idle().report()));
    assert_eq!(
        value(&healthy, "vram_nvml_error", &[("error", "missing")]),
        0.0
    );
    assert!(find(&healthy, "vram_nvml_stuck_seconds", &[]).is_empty());
}

// JSON.

#[test]
fn json_owners_say_state_and_detail_as_scripts_read_them() {
    let report = Host::idle()
        .used(3 * USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .owner(
            504,
            None,
            ProcessLookup::Unreadable {
                error: "permission denied".into(),
            },
        )
        .owner(
            432,
            Some(CHARGED_ONE_OWNER),
            present(contained(
                cuda(432, &[0]).state('D'),
                Some(NamespaceInit::Exited { pid: 9 }),
            )),
        )
        .scanned()
        .report();
    let owners = &json_of(&report)["gpus"][0]["owners"];
    assert_eq!(
        owners[0],
        json!({ "pid": 503, "state": "gone", "detail": { "reason": "exited" }, "used_bytes": CHARGED_ONE_OWNER })
    );
    assert_eq!(
        owners[1],
        json!({
            "pid": 504,
            "state": "unknown",
            "detail": { "reason": "unreadable", "error": "permission denied" },
            "used_bytes": null,
        })
    );
    let live = &owners[2];
    assert_eq!(live["state"], "uninterruptible");
    assert!(live.get("detail").is_none(), "{live}");
    assert_eq!(live["container_exited"], true);
    assert_eq!(live["process"]["container_ended"], true);
    assert_eq!(
        live["process"]["pid_namespace_init"],
        json!({ "state": "exited", "pid": 9 })
    );
    assert_eq!(live["first_seen"]["comm"], "python3");
}

#[test]
fn json_keeps_nvml_and_the_scan_in_the_keys_scripts_read() {
    let report = fork_orphan().report();
    let document = json_of(&report);
    assert_eq!(document["nvml_up"], true);
    assert_eq!(document["nvml_error"], Value::Null);
    assert_eq!(document["driver_version"], "580.159.04");
    assert_eq!(
        document["holder_scan"],
        json!({ "complete": true, "cut_short": false, "permission_errors": 0, "duration_seconds": 0.001 })
    );
    let mut denied = fork_orphan();
    denied.scan_denied = 3;
    assert_eq!(json_of(&denied.report())["holder_scan"]["complete"], false);

    let mut observation = Host::idle().observation();
    observation.nvml = nvml_down("no driver");
    let document = json_of(&classify(&observation, &Settings::default()));
    assert_eq!(document["status"], "nvml_down");
    assert_eq!(document["nvml_up"], false);
    assert_eq!(document["nvml_error"], "no driver");
    assert_eq!(document["driver_version"], Value::Null);
}

#[test]
fn json_notes_name_the_bystanders_the_text_sets_apart() {
    let report = stuck_in_an_ended_container().report();
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(
        gpu["notes"],
        json!([
            { "note": "driver_asks", "action": "gpu_reset" },
            { "note": "culprits_container_ended", "pids": [524] },
            { "note": "bystanders_not_blamed", "pids": [467] },
        ])
    );
    assert_eq!(gpu["verdict"]["notes"].as_array().unwrap().len(), 3);
}

#[test]
fn json_instances_are_the_classifiers_with_their_words() {
    let report = mig_host(true)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let instances = json_of(&report)["gpus"][0]["instances"].clone();
    let orphaned = &instances[1];
    assert_eq!(orphaned["uuid"], "MIG-2");
    assert_eq!(orphaned["name"], "NVIDIA H200 MIG 1g.18gb");
    assert_eq!(orphaned["profile"], "1g.18gb");
    assert_eq!(orphaned["gpu_instance_id"], 2);
    assert_eq!(orphaned["status"], "measured");
    assert_eq!(orphaned["finding"], "orphaned");
    assert_eq!(json_pids(&orphaned["culprits"]), [524]);
    assert_eq!(orphaned["orphaned_bytes"], CHARGED_ONE_OWNER);
    assert!(orphaned["verdict"]["sentence"]
        .as_str()
        .unwrap()
        .starts_with(
            "GPU 0 MIG (GI 2, CI 0, 1g.18gb): 8.6 GiB (8,802 MiB) held for exited PID 503"
        ));
    assert_eq!(instances[0]["finding"], "idle");
}

// Prometheus.

#[test]
fn the_exporters_own_process_is_rendered_only_when_the_report_carries_it() {
    let mut report = fork_orphan().report();
    let families = |text: &str| -> Vec<String> {
        samples(text)
            .into_iter()
            .map(|(family, _, _)| family)
            .filter(|family| family.starts_with("process_"))
            .collect()
    };
    assert_eq!(families(&metrics_of(&report)), Vec::<String>::new());

    report.exporter_process = Some(crate::classify::ExporterProcess {
        cpu_seconds: 1.75,
        resident_bytes: 20_480_000,
        virtual_bytes: 1 << 30,
        open_fds: Some(12),
        max_fds: Some(1024),
        start_time_seconds: Some(1_796_218_682.13),
    });
    let text = metrics_of(&report);
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter\n"),
        "{text}"
    );
    let all = samples(&text);
    for (family, expected) in [
        ("process_cpu_seconds_total", 1.75),
        ("process_resident_memory_bytes", 20_480_000.0),
        ("process_virtual_memory_bytes", 1_073_741_824.0),
        ("process_open_fds", 12.0),
        ("process_max_fds", 1024.0),
        ("process_start_time_seconds", 1_796_218_682.13),
    ] {
        assert_eq!(value(&all, family, &[]), expected, "{family}");
    }

    // What could not be read is left out, not written as 0.
    report.exporter_process = Some(crate::classify::ExporterProcess {
        open_fds: None,
        max_fds: None,
        start_time_seconds: None,
        ..report.exporter_process.unwrap()
    });
    assert_eq!(
        families(&metrics_of(&report)),
        [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes"
        ]
    );
}

#[test]
fn prometheus_writes_each_label_set_in_its_order() {
    let text = metrics_of(&stuck_in_an_ended_container().report());
    for line in [
        "vram_build_info{version=\"1.2.3\",revision=\"abc\",driver_version=\"580.159.04\"} 1",
        "vram_gpu_info{gpu=\"0\",uuid=\"GPU-0\",name=\"NVIDIA H200\",pci_bus_id=\"00000000:19:00.0\",minor=\"0\"} 1",
        "vram_orphaned_bytes{gpu=\"0\",uuid=\"GPU-0\",reason=\"owner_gone\"} 9229565952",
        "vram_orphaned_bytes{gpu=\"0\",uuid=\"GPU-0\",reason=\"unattributed\"} 0",
        "vram_owner_processes{gpu=\"0\",uuid=\"GPU-0\",state=\"gone\"} 1",
        "vram_gone_owner_processes{gpu=\"0\",uuid=\"GPU-0\",reason=\"exited\"} 1",
        "vram_holder_processes{gpu=\"0\",uuid=\"GPU-0\",role=\"bystander\"} 1",
        &format!("vram_holder_info{{gpu=\"0\",uuid=\"GPU-0\",pid=\"524\",start_time=\"{}\",comm=\"python3\",state=\"running\",container_id=\"{CONTAINER}\",pod_uid=\"{POD}\",namespace=\"\",pod=\"\",container_name=\"\",container_image=\"\",slurm_job_id=\"\",slurm_step=\"\",slurm_user=\"\"}} 1", BOOT + 1_500),
        "vram_process_used_bytes{gpu=\"0\",uuid=\"GPU-0\",pid=\"503\",comm=\"\",state=\"gone\",container_id=\"\",pod_uid=\"\",namespace=\"\",pod=\"\",container_name=\"\",container_image=\"\",slurm_job_id=\"\",slurm_step=\"\",slurm_user=\"\"} 9229565952",
        "vram_exited_container_processes{gpu=\"0\",uuid=\"GPU-0\"} 1",
        "vram_gpu_recovery_action{gpu=\"0\",uuid=\"GPU-0\",action=\"gpu_reset\"} 1",
    ] {
        assert!(
            text.lines().any(|written| written == line),
            "{line} not in:\n{text}"
        );
    }
    // The sparse families write their active members only: no zeros.
    for family in SPARSE_FAMILIES {
        let zero = text
            .lines()
            .find(|line| line.starts_with(&format!("{family}{{")) && line.ends_with(" 0"));
        assert_eq!(zero, None, "{family} writes a zero");
    }
}

#[test]
fn prometheus_holder_scan_is_complete_unless_cut_short_or_denied() {
    let complete = |host: &Host| {
        value(
            &samples(&metrics_of(&host.report())),
            "vram_holder_scan_complete",
            &[],
        )
    };
    // No scan made: none was needed, nothing was missed.
    assert_eq!(complete(&Host::idle()), 1.0);
    assert_eq!(complete(&fork_orphan()), 1.0);
    let mut cut_short = fork_orphan();
    cut_short.scan_cut_short = true;
    assert_eq!(complete(&cut_short), 0.0);
}

#[test]
fn prometheus_counts_any_unrecognised_recovery_action_as_unknown() {
    let mut host = Host::idle().health(recovery(RecoveryAction::Unrecognised(42)));
    host.gpus[0].health.xid = Some(XidReading {
        watched: true,
        counts: BTreeMap::from([(79, 2)]),
    });
    let samples = samples(&metrics_of(&host.report()));
    let actions = find(&samples, "vram_gpu_recovery_action", &[("gpu", "0")]);
    assert_eq!(
        actions.len(),
        1,
        "one series, the action asked for: {actions:?}"
    );
    let on: Vec<&str> = actions
        .iter()
        .filter(|(_, _, value)| *value == 1.0)
        .map(|(_, labels, _)| labels[2].1.as_str())
        .collect();
    assert_eq!(on, ["unknown"]);
    assert_eq!(
        value(&samples, "vram_xid_errors_total", &[("xid", "79")]),
        2.0
    );
    assert_eq!(value(&samples, "vram_xid_watched", &[("gpu", "0")]), 1.0);
}

#[test]
fn prometheus_mig_series_come_from_the_instance_verdicts() {
    let report = mig_host(true)
        .holder(instance_child(524, &[21, 22]))
        .report();
    let text = metrics_of(&report);
    assert!(text.lines().any(|line| line
        == "vram_mig_info{gpu=\"0\",uuid=\"GPU-0\",GPU_I_ID=\"2\",GPU_CI_ID=\"0\",GPU_I_PROFILE=\"1g.18gb\",mig_uuid=\"MIG-2\",name=\"NVIDIA H200 MIG 1g.18gb\"} 1"));
    let samples = samples(&text);
    let instance = |gi: &'static str| [("gpu", "0"), ("GPU_I_ID", gi)];
    assert_eq!(value(&samples, "vram_gpu_mig_mode", &[("gpu", "0")]), 1.0);
    assert_eq!(
        value(&samples, "vram_gpu_mig_mode_pending", &[("gpu", "0")]),
        1.0
    );
    assert_eq!(value(&samples, "vram_mig_up", &instance("2")), 1.0);
    assert_eq!(
        value(&samples, "vram_mig_used_bytes", &instance("2")),
        USED_ONE_OWNER as f64
    );
    assert_eq!(value(&samples, "vram_mig_processes", &instance("2")), 1.0);
    assert_eq!(value(&samples, "vram_mig_processes", &instance("1")), 0.0);
    assert_eq!(
        value(
            &samples,
            "vram_mig_orphaned_bytes",
            &[("GPU_I_ID", "2"), ("reason", "owner_gone")]
        ),
        CHARGED_ONE_OWNER as f64
    );
    assert_eq!(
        value(
            &samples,
            "vram_mig_holder_processes",
            &[("GPU_I_ID", "2"), ("role", "culprit")]
        ),
        1.0
    );
    // GPU 1 has no MIG: no mode, no devices.
    assert!(find(&samples, "vram_gpu_mig_mode", &[("gpu", "1")]).is_empty());
}

// All three.

/// What `check` ends with for what each output says: `status` in the document; in the
/// text, the worst sentence; in the metrics, the figures.
fn status_of_text(text: &str) -> &'static str {
    let sentences: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("GPU ") && line.contains(": "))
        .collect();
    if text.starts_with("NVML is not available") {
        "nvml_down"
    } else if sentences.iter().any(|line| line.contains(" held ")) {
        "orphaned"
    } else if sentences
        .iter()
        .any(|line| line.contains(": cannot tell: "))
    {
        "cannot_tell"
    } else {
        "clear"
    }
}

fn status_of_metrics(samples: &[Sample]) -> &'static str {
    let total = |family: &str| -> f64 {
        find(samples, family, &[])
            .iter()
            .map(|(_, _, value)| value)
            .sum()
    };
    if total("vram_nvml_up") == 0.0 {
        "nvml_down"
    } else if total("vram_orphaned_bytes") > 0.0 {
        "orphaned"
    } else if find(samples, "vram_gpu_up", &[])
        .iter()
        .any(|(_, _, up)| *up == 0.0)
        || value(samples, "vram_host_pid_namespace", &[]) == 0.0
        || find(samples, "vram_owner_processes", &[("state", "unknown")])
            .iter()
            .any(|(_, _, count)| *count > 0.0)
    {
        "cannot_tell"
    } else {
        "clear"
    }
}

/// The figure in MiB a sentence gives before `then`: `8,802` of `8.6 GiB (8,802 MiB)
/// held`.
fn mib_before(sentence: &str, then: &str) -> u64 {
    let before = sentence.split(&format!(" MiB) {then}")).next().unwrap();
    let figure = before.rsplit('(').next().unwrap().replace(',', "");
    figure.parse().unwrap()
}

#[test]
fn one_report_says_the_same_in_text_json_and_prometheus() {
    let mut cut_short = fork_orphan().holder(nvml_client(467, "nvidia-smi", &[0]));
    cut_short.scan_cut_short = true;
    let mut blind = Host::idle().used(4 * GIB);
    blind.host_pid_namespace = Some(false);
    let hosts = [
        ("stuck", stuck_in_an_ended_container()),
        ("cut short", cut_short),
        ("unheld", Host::idle().used(4 * GIB).scanned()),
        ("blind", blind),
        (
            "owned",
            Host::idle().gpu(1).used(USED_ONE_OWNER).owner(
                432,
                Some(CHARGED_ONE_OWNER),
                present(cuda(432, &[0])),
            ),
        ),
    ];
    for (name, host) in hosts {
        let report = host.report();
        let text = text_of(&report);
        let document = json_of(&report);
        let samples = samples(&metrics_of(&report));
        let status = document["status"].as_str().unwrap();

        // Exit status.
        assert_eq!(status_of_text(&text), status, "{name}: {text}");
        assert_eq!(status_of_metrics(&samples), status, "{name}");
        let gpus: Vec<_> = report.gpus.iter().collect();
        let check = report.check_status(&gpus);
        assert_eq!(json!(check), json!(status), "{name}");
        assert_eq!(
            crate::exit_codes::of(check),
            match status {
                "clear" => 0,
                "orphaned" => 1,
                "cannot_tell" => 3,
                _ => 2,
            },
            "{name}"
        );

        for (index, gpu) in report.gpus.iter().enumerate() {
            let label = index.to_string();
            let gpu_labels = [("gpu", label.as_str())];
            let json = &document["gpus"][index];
            let words = verdict(gpu);

            // Amounts.
            let orphaned = json["orphaned_bytes"].as_u64().unwrap();
            let metric: f64 = find(&samples, "vram_orphaned_bytes", &gpu_labels)
                .iter()
                .map(|(_, _, value)| value)
                .sum();
            assert_eq!(metric as u64, orphaned, "{name} GPU {index}");
            if orphaned > 0 {
                assert_eq!(
                    mib_before(&words.sentence, "held"),
                    orphaned >> 20,
                    "{name}"
                );
            }
            if words.sentence.contains(" owned by ") {
                let live = ["running", "stopped", "uninterruptible", "zombie"];
                let metric: f64 = live
                    .iter()
                    .map(|state| {
                        value(
                            &samples,
                            "vram_owned_bytes",
                            &[gpu_labels[0], ("state", state)],
                        )
                    })
                    .sum();
                let data: u64 = live
                    .iter()
                    .map(|state| json["owners_by_state"][state]["bytes"].as_u64().unwrap())
                    .sum();
                assert_eq!(metric as u64, data, "{name}");
                assert_eq!(
                    mib_before(&words.sentence, "owned by"),
                    data >> 20,
                    "{name}"
                );
            }
            assert_eq!(
                value(&samples, "vram_used_bytes", &gpu_labels) as u64,
                json["memory"]["used"].as_u64().unwrap()
            );

            // Culprits: the kill the text suggests, the document's, the series'.
            let culprits = json_pids(&json["culprits"]);
            let killed: Vec<u32> = words
                .suggestion
                .as_deref()
                .and_then(|command| command.strip_prefix("kill "))
                .map(|rest| {
                    rest.split("   #")
                        .next()
                        .unwrap()
                        .split(' ')
                        .map(|pid| pid.parse().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            let held_by = words
                .sentence
                .split("; still held by ")
                .nth(1)
                .map(pids_named)
                .unwrap_or_default();
            let series: Vec<u32> = find(&samples, "vram_holder_info", &gpu_labels)
                .iter()
                .map(|(_, labels, _)| labels[2].1.parse().unwrap())
                .collect();
            if json["remedy"]["action"] == "kill" {
                assert_eq!(killed, culprits, "{name}");
            }
            assert_eq!(
                held_by,
                if killed.is_empty() {
                    vec![]
                } else {
                    culprits.clone()
                }
            );
            assert_eq!(series, culprits, "{name}");
            let holders = |role: &str| {
                let labels = [gpu_labels[0], ("role", role)];
                value(&samples, "vram_holder_processes", &labels) as usize
            };
            assert_eq!(holders("culprit"), culprits.len(), "{name}");

            // Bystanders.
            let bystanders = json_pids(&json["bystanders"]);
            let noted: Vec<u32> = words
                .notes
                .iter()
                .filter(|note| note.starts_with("Not blamed"))
                .flat_map(|note| pids_named(note))
                .collect();
            assert_eq!(noted, bystanders, "{name}");
            assert_eq!(holders("bystander"), bystanders.len(), "{name}");

            // Notes: one line each in words, one object each in data, and the series
            // that carry the same facts.
            let notes = json["notes"].as_array().unwrap();
            assert_eq!(words.notes.len(), notes.len(), "{name}: {:#?}", words.notes);
            assert_eq!(json["verdict"]["notes"], json!(words.notes));
            let kinds: Vec<&str> = notes
                .iter()
                .map(|note| note["note"].as_str().unwrap())
                .collect();
            assert_eq!(
                kinds.contains(&"bystanders_not_blamed"),
                !bystanders.is_empty(),
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"culprits_container_ended")
                    || kinds.contains(&"owner_container_ended"),
                value(&samples, "vram_exited_container_processes", &gpu_labels) > 0.0,
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"driver_asks"),
                find(&samples, "vram_gpu_recovery_action", &gpu_labels)
                    .iter()
                    .any(|(_, labels, value)| *value == 1.0 && labels[2].1 != "none"),
                "{name}"
            );
            assert_eq!(
                kinds.contains(&"unattributed_not_counted"),
                value(&samples, "vram_unattributed_bytes", &gpu_labels) > 0.0
                    && find(
                        &samples,
                        "vram_orphaned_bytes",
                        &[gpu_labels[0], ("reason", "unattributed")]
                    )[0]
                    .2 == 0.0,
                "{name}"
            );
        }
    }
}

// MPS.

#[test]
fn under_mps_the_text_kills_the_child_alone_and_sets_the_daemon_and_server_apart() {
    let report = mps_fork_orphan().report();
    let words = verdict(&report.gpus[0]);
    assert_eq!(
        words.sentence,
        "GPU 0: 4.6 GiB (4,706 MiB) held for exited PID 479; still held by PID 500 (python3, sleeping, started 2026-12-03 00:00:34 UTC, user root, parent 1, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group and session of exited PID 479) - killing 500 should free it."
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("kill 500   # 500 is python3, started 2026-12-03 00:00:34 UTC; then: vram-exporter check --gpu 0 --wait 30s")
    );
    let [note] = words.notes.as_slice() else {
        panic!("{:#?}", words.notes)
    };
    assert!(
        note.starts_with(
            "Not blamed, the MPS control daemon and server, which serve every MPS client of GPU 0: PID 447 (nvidia-cuda-mps, sleeping, "
        ),
        "{note}"
    );
    assert_eq!(pids_named(note), [447, 466]);
    for reason in [
        "the MPS control daemon: parent of MPS server PID 466, listed by NVML on no GPU, leading its own session; killing it frees no client's memory and ends MPS for every client",
        "maps GPU 0's device file write-only: the driver is initialised but it holds no context",
        "the MPS server: on GPU 0's compute list and not its MPS list, which names the clients, child of MPS control daemon PID 447; it holds every client's context, and ending it ends MPS for every client",
    ] {
        assert!(note.contains(reason), "{reason}: {note}");
    }
    let table = gpu_table(&report.gpus[0]);
    let section = table
        .split("  the MPS control daemon and server (not blamed):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{table}"));
    let rows: Vec<&str> = section
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(rows, ["447", "466"]);
    assert!(!table.contains("without a context here"), "{table}");
}

#[test]
fn under_mps_a_dead_clients_memory_the_server_alone_holds_asks_for_an_mps_restart() {
    let report = mps_dead_client_without_heir().report();
    let words = verdict(&report.gpus[0]);
    assert_eq!(
        words.sentence,
        "GPU 0: 4.6 GiB (4,706 MiB) held for exited PID 479; no client process holds it, but the MPS server (PID 466) does: only restarting MPS frees it, which ends every client of MPS (on GPU 0: PID 449)."
    );
    assert_eq!(
        words.suggestion.as_deref(),
        Some("echo quit | nvidia-cuda-mps-control   # as the user of MPS control daemon PID 447, with its CUDA_MPS_PIPE_DIRECTORY; ends MPS server PID 466 and every client of MPS (on GPU 0: PID 449); then start the daemon again (nvidia-cuda-mps-control -d) and: vram-exporter check --gpu 0 --wait 30s")
    );
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(
        gpu["remedy"],
        json!({ "action": "restart_mps", "servers": [466], "daemons": [447], "clients": [449] })
    );
    assert_eq!(
        gpu["notes"],
        json!([{ "note": "mps_not_blamed", "pids": [447, 466] }])
    );
}

#[test]
fn under_mps_json_and_prometheus_say_what_the_text_says() {
    let report = mps_fork_orphan().report();
    let gpu = &json_of(&report)["gpus"][0];
    assert_eq!(json_pids(&gpu["culprits"]), [500]);
    assert_eq!(json_pids(&gpu["bystanders"]), [447, 466]);
    assert_eq!(json_pids(&gpu["remedy"]["targets"]), [500]);
    let daemon = &gpu["bystanders"][0];
    assert_eq!(
        daemon["evidence"],
        json!([
            { "kind": "mps_control_daemon", "server": 466 },
            { "kind": "maps_gpu_without_context", "access": "write_only" },
            { "kind": "mps_command_name" },
        ])
    );
    assert_eq!(
        daemon["mappings"]["gpus_without_read_write"],
        json!({ "0": "write_only" })
    );
    assert_eq!(
        daemon["mappings"]["control_without_read_write"],
        "read_only"
    );
    assert_eq!(
        gpu["bystanders"][1]["evidence"],
        json!([{ "kind": "mps_server", "daemon": 447 }, { "kind": "mps_command_name" }])
    );
    let samples = samples(&metrics_of(&report));
    let gpu_labels = [("gpu", "0"), ("uuid", "GPU-0")];
    for (role, count) in [("culprit", 1.0), ("bystander", 2.0), ("undetermined", 0.0)] {
        assert_eq!(
            value(
                &samples,
                "vram_holder_processes",
                &[gpu_labels[0], gpu_labels[1], ("role", role)]
            ),
            count,
            "{role}"
        );
    }
    let named: Vec<String> = find(&samples, "vram_holder_info", &gpu_labels)
        .iter()
        .map(|(_, labels, _)| labels[2].1.clone())
        .collect();
    assert_eq!(named, ["500"]);
}

#[test]
fn left_behind_workers_are_named_at_most_sixteen_per_gpu_and_counted_in_full() {
    use crate::classify::{Leader, Lineage, Relative};
    // Twenty workers of a server that the exporter saw exit.
    let mut host = Host::idle().used(20 * USED_ONE_OWNER / 4);
    for pid in 1000..1020 {
        let mut facts = cuda(pid, &[0]);
        facts.pgid = 900;
        facts.sid = 900;
        facts.lineage = Some(Lineage {
            parent: Relative {
                pid: 900,
                start_time_ticks: Some(90_000),
                comm: Some("api-server".into()),
                pgid: Some(900),
            },
            parent_exit_seen_unix_seconds: Some(1_764_930_000),
            group_leader: Leader::Alive,
            session_leader: Leader::Alive,
            spawned_worker: false,
        });
        host = host.owner(pid, Some(CHARGED_ONE_OWNER / 4), present(facts));
    }
    let report = host.scanned().report();
    let samples = samples(&metrics_of(&report));
    let named: Vec<_> = samples
        .iter()
        .filter(|(family, _, _)| family == "vram_left_behind_since_timestamp_seconds")
        .collect();
    assert_eq!(named.len(), super::prometheus::MAX_HOLDER_SERIES_PER_GPU);
    assert!(named.iter().all(|(_, labels, seen)| {
        labels.contains(&("parent_pid".to_string(), "900".to_string())) && *seen == 1_764_930_000.0
    }));
    assert_eq!(
        value(&samples, "vram_left_behind_bytes", &[("gpu", "0")]),
        (20 * (CHARGED_ONE_OWNER / 4)) as f64
    );
}

#[test]
fn a_left_behind_worker_kill_cannot_reach_gets_no_kill_line() {
    use crate::classify::{Leader, Lineage, Relative};
    let mut facts = cuda(4242, &[0]);
    facts.local_pid = None;
    facts.pgid = 4200;
    facts.sid = 4200;
    facts.lineage = Some(Lineage {
        parent: Relative {
            pid: 1,
            start_time_ticks: Some(100),
            comm: Some("systemd".into()),
            pgid: Some(1),
        },
        parent_exit_seen_unix_seconds: None,
        group_leader: Leader::Gone,
        session_leader: Leader::Gone,
        spawned_worker: true,
    });
    let report = Host::idle()
        .used(USED_ONE_OWNER)
        .owner(4242, Some(CHARGED_ONE_OWNER), present(facts))
        .scanned()
        .report();
    let words = verdict(&report.gpus[0]);
    assert!(
        words.sentence.ends_with("; no kill is suggested: they live in another PID namespace than this one, where kill cannot reach them: run check on the host."),
        "{}",
        words.sentence
    );
    assert_eq!(words.suggestion, None);
}

#[test]
fn json_gives_the_suggested_commands_as_data_beside_the_line_check_prints() {
    let report = fork_orphan().report();
    let verdict = &json_of(&report)["gpus"][0]["verdict"];
    assert_eq!(
        verdict["suggestion"],
        "kill 524   # 524 is python3, started 2026-12-03 00:25:00 UTC; then: vram-exporter check --gpu 0 --wait 30s"
    );
    assert_eq!(
        verdict["commands"],
        json!([{ "program": "kill", "args": ["524"] }])
    );
    assert_eq!(
        verdict["then"],
        json!({ "program": "vram-exporter", "args": ["check", "--gpu", "0", "--wait", "30s"] })
    );
    assert_eq!(verdict["wait_seconds"], 30);

    // Where nothing is suggested, the verdict keeps its three keys.
    let idle = json_of(&Host::idle().report());
    assert_eq!(
        idle["gpus"][0]["verdict"],
        json!({ "sentence": "GPU 0: idle; nothing orphaned.", "notes": [], "suggestion": null })
    );
}
