//! `check`'s text: the tables, the sentences and the suggested commands.

use super::*;

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
