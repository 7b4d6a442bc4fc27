//! Snapshots: what `snapshot` writes replays to the verdict the live host gets, the
//! examples under `examples/` replay to the verdicts they were made for, and
//! `examples/README.md` quotes what `check` prints for each of them.

use crate::helpers::repository;
use crate::helpers::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn example(name: &str) -> PathBuf {
    repository().join("examples").join(name)
}

fn replay(rig: &Rig, file: &std::path::Path, extra: &[&str]) -> Outcome {
    let mut args = vec!["check", "--replay", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    rig.run(&args)
}

#[test]
fn story_example_replays_to_gpu_2_needing_a_reset() {
    let rig = Rig::new();
    let outcome = replay(&rig, &example("story-gpu2-orphaned.json"), &[]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 2),
        "GPU 2: 74.3 GiB (76,104 MiB) held but charged to no process; no process holds GPU 2's device file: only a GPU reset can free it."
    );
    assert!(outcome.stdout.contains(
        "\n  suggested: nvidia-smi --gpu-reset -i 2   # as root, once no process uses the GPU (stop vram-exporter itself, nvidia-persistenced, DCGM and other agents holding it); it ends every MIG instance, and on NVSwitch systems the GPUs reset together\n"
    ));
    for gpu in [0, 1, 3, 4, 5, 6, 7] {
        assert_eq!(
            verdict_line(&outcome.stdout, gpu),
            format!("GPU {gpu}: idle; nothing orphaned.")
        );
    }
    assert!(!outcome.stdout.contains("GPU 8"));

    let document = replay(&rig, &example("story-gpu2-orphaned.json"), &["--json"]).json();
    // nvidia-smi's 76,107 MiB counts the driver's 3 MiB reservation; v2 used does not.
    assert_eq!(document["orphaned_bytes"], 76_104u64 << 20);
    assert_eq!(
        document["gpus"][2]["orphaned_unattributed_bytes"],
        76_104u64 << 20
    );
    assert_eq!(document["holder_scan"]["complete"], true);
    for gpu in document["gpus"].as_array().unwrap() {
        assert_eq!(
            gpu["name"], "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "{gpu:#}"
        );
    }

    // Narrowed to a healthy GPU, the same file says nothing is orphaned.
    assert_eq!(
        replay(&rig, &example("story-gpu2-orphaned.json"), &["--gpu", "3"]).status,
        Some(0)
    );
}

#[test]
fn fork_orphan_example_replays_to_killing_the_child() {
    let rig = Rig::new();
    let outcome = replay(&rig, &example("fork-orphan-held-by-child.json"), &[]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    // The child started 48,213 ticks (482 s) after a boot at 13:30:00 UTC.
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 8.6 GiB (8,802 MiB) held for exited PID 503; still held by PID 524 (python3, sleeping, started 2026-12-02 13:38:02 UTC, user root, parent 1, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group of exited PID 503) - killing 524 should free it."
    );
    assert!(outcome.stdout.contains(
        "\n  suggested: kill 524   # 524 is python3, started 2026-12-02 13:38:02 UTC; then: vram-exporter check --gpu 0 --wait 30s\n"
    ));

    // The same snapshot without the boot time, as it was first recorded: the start is
    // given in seconds after boot, never in the kernel's clock ticks.
    let mut snapshot: Value =
        serde_json::from_slice(&std::fs::read(example("fork-orphan-held-by-child.json")).unwrap())
            .unwrap();
    snapshot["observation"]
        .as_object_mut()
        .unwrap()
        .remove("boot_time_unix_seconds")
        .expect("the example records a boot time");
    let without_boot_time = rig.dir.path().join("without-boot-time.json");
    std::fs::write(&without_boot_time, snapshot.to_string()).unwrap();
    let outcome = replay(&rig, &without_boot_time, &[]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    assert!(
        verdict_line(&outcome.stdout, 0)
            .contains("(python3, sleeping, started 482 s after boot, user root, parent 1,"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stdout
            .contains("kill 524   # 524 is python3, started 482 s after boot; then:"),
        "{}",
        outcome.stdout
    );
    assert!(!outcome.stdout.contains("ticks"), "{}", outcome.stdout);
}

/// The shipped snapshots, relative to the repository root.
fn shipped_snapshots() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repository().join("examples"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".json"))
        .map(|name| format!("examples/{name}"))
        .collect();
    names.sort();
    names
}

#[test]
fn examples_readme_shows_what_check_prints_for_every_shipped_snapshot() {
    // Each `console` block of examples/README.md is run as a person would run it from the
    // repository root, with the binary these tests built as `vram-exporter`; what it
    // prints (standard output and error, as a terminal shows them) and its exit status
    // must be what the block shows. Every shipped snapshot is shown at least once.
    let readme = std::fs::read_to_string(example("README.md")).unwrap();
    let blocks = console_blocks(&readme, "examples/README.md");
    let mut replayed = BTreeSet::new();
    for block in &blocks {
        let args: Vec<&str> = block
            .command
            .strip_prefix("vram-exporter ")
            .unwrap_or_else(|| {
                panic!(
                    "examples/README.md runs `vram-exporter ...`: {}",
                    block.command
                )
            })
            .split_whitespace()
            .collect();
        let snapshot = args
            .iter()
            .skip_while(|arg| **arg != "--replay")
            .nth(1)
            .unwrap_or_else(|| panic!("`{}` replays no snapshot", block.command));
        replayed.insert(snapshot.to_string());
        let (printed, status) = run_as_in_a_terminal(&exporter_binary(), &args, &repository());
        assert_block_matches(block, &printed, status, "examples/README.md");
    }
    let shipped: BTreeSet<String> = shipped_snapshots().into_iter().collect();
    assert_eq!(
        replayed, shipped,
        "examples/README.md shows `check` on every shipped snapshot, and on no other"
    );
}

#[test]
fn snapshot_replays_to_the_verdict_of_the_live_host() {
    let rig = Rig::new();
    let (dead_owner, _child) = Holder::fork_orphan(&rig.device(0));
    let live_owner = Holder::spawn(&rig.device(1));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, live_owner.pid))
            .gpu(Gpu::idle(2).error("nvmlDeviceGetMemoryInfo_v2", "GpuLost"))
            .into_json(),
    );
    let file = rig.dir.path().join("bug-report.json");
    let written = rig.run(&["snapshot", "--output", file.to_str().unwrap()]);
    assert_eq!(written.status, Some(0), "{written:?}");
    assert_eq!(written.stdout, "", "the snapshot goes to the file only");

    let snapshot: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(snapshot["format"], 2);
    assert_eq!(snapshot["exporter_version"], env!("CARGO_PKG_VERSION"));
    assert!(snapshot["observation"]["holder_scan"].is_object());

    let live = rig.run(&["check", "--json"]);
    let replayed = replay(&rig, &file, &["--json"]);
    assert_eq!(live.status, Some(1), "{live:?}");
    assert_eq!(replayed.status, live.status);
    // Only the time the scan took differs between two looks at the same host.
    let without_duration = |outcome: &Outcome| {
        let mut document = outcome.json();
        let duration = document["holder_scan"]["duration_seconds"].take();
        assert!(duration.as_f64().unwrap() > 0.0);
        document
    };
    let replayed_document = without_duration(&replayed);
    assert_eq!(replayed_document, without_duration(&live));
    assert_eq!(replayed_document["gpus"][0]["finding"], "orphaned");
    assert_eq!(replayed_document["gpus"][0]["remedy"]["action"], "kill");

    // The table and verdicts a person reads are the same text.
    let live_text = rig.run(&["check"]);
    let replayed_text = replay(&rig, &file, &[]);
    assert_eq!(replayed_text.stdout, live_text.stdout);
    assert_eq!(replayed_text.status, live_text.status);
}

#[test]
fn snapshot_of_another_format_is_a_clear_error() {
    let rig = Rig::new();
    let file = rig.dir.path().join("snapshot.json");
    let written = rig.run(&["snapshot", "--output", file.to_str().unwrap()]);
    assert_eq!(written.status, Some(0), "{written:?}");
    let mut snapshot: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    snapshot["format"] = 1.into();
    std::fs::write(&file, serde_json::to_vec(&snapshot).unwrap()).unwrap();

    let outcome = replay(&rig, &file, &[]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert_eq!(outcome.stdout, "");
    assert!(
        outcome.stderr.contains(&format!(
            "{} has snapshot format 1; this build reads format 2",
            file.display()
        )),
        "{}",
        outcome.stderr
    );
    assert!(!outcome.stderr.contains("panicked"), "{}", outcome.stderr);
}

#[test]
fn a_snapshot_with_two_gpus_at_one_index_or_uuid_is_refused_in_one_line() {
    // Hand-edited: a GPU copied, or renumbered onto another's index. Replayed, either
    // would serve two GPUs under one label set, or say "GPU 0" of two GPUs.
    let rig = Rig::new();
    let story: Value =
        serde_json::from_slice(&std::fs::read(example("story-gpu2-orphaned.json")).unwrap())
            .unwrap();
    // GPU 3 given GPU 2's index, or GPU 2's UUID.
    let cases = [
        ("index", "index 2"),
        ("uuid", "UUID GPU-5ca1ab20-6000-4b1a-9c2e-0000b1ac3e13"),
    ];
    let file = rig.dir.path().join("edited.json");
    for (field, shared) in cases {
        let mut snapshot = story.clone();
        let gpus = &mut snapshot["observation"]["nvml"]["gpus"];
        gpus[3][field] = gpus[2][field].clone();
        std::fs::write(&file, snapshot.to_string()).unwrap();
        let expected = format!(
            "vram-exporter: {} lists two GPUs with {shared}; a GPU's index and UUID are its own\n",
            file.display()
        );
        for mode in [&["check"][..], &["textfile", "-o", "vram.prom"], &[]] {
            let mut args = mode.to_vec();
            args.extend(["--replay", file.to_str().unwrap()]);
            let outcome = rig.run(&args);
            assert_eq!(outcome.status, Some(2), "{args:?}: {outcome:?}");
            assert_eq!(outcome.stderr, expected, "{args:?}");
            assert_eq!(outcome.stdout, "", "{args:?}");
        }
    }
    // The file as shipped replays.
    let outcome = replay(&rig, &example("story-gpu2-orphaned.json"), &[]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
}

#[test]
fn check_its_json_and_the_metrics_agree_on_one_snapshot() {
    // One observation, three renderings: the culprits, the amounts and the verdict must
    // be the same in each, since the classifier alone decides them.
    let rig = Rig::new();
    let (dead_owner, children) =
        Model::cuda("trainer", &rig.device(0)).fork_orphan(2, "dataloader");
    let agent = Model::agent("gpu-health", &rig.device(0)).spawn();
    let live_owner = Holder::spawn(&rig.device(1));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, live_owner.pid))
            .gpu(Gpu::idle(2).used(4 << 30))
            .into_json(),
    );
    let file = rig.dir.path().join("one-look.json");
    let written = rig.run(&["snapshot", "--output", file.to_str().unwrap()]);
    assert_eq!(written.status, Some(0), "{written:?}");
    drop((children, agent, live_owner));

    let text = replay(&rig, &file, &[]);
    let json = replay(&rig, &file, &["--json"]);
    let metrics = rig.start(&["--replay", file.to_str().unwrap()]).scrape();
    let document = json.json();

    // The verdict: the exit status, the document's status and the orphaned series.
    assert_eq!(text.status, Some(1));
    assert_eq!(json.status, text.status);
    assert_eq!(document["status"], "orphaned");
    for gpu in 0..3u32 {
        let label = gpu.to_string();
        let in_json = &document["gpus"][gpu as usize];
        let orphaned: f64 = metrics
            .find("vram_orphaned_bytes", &[("gpu", &label)])
            .iter()
            .map(|(_, _, value)| value)
            .sum();
        assert_eq!(
            orphaned,
            in_json["orphaned_bytes"].as_f64().unwrap(),
            "GPU {gpu}"
        );
        // The culprits: the document's, the holder series' and the kill line's.
        let culprits: Vec<String> = in_json["culprits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|culprit| culprit["pid"].to_string())
            .collect();
        let mut series: Vec<String> = metrics
            .find("vram_holder_info", &[("gpu", &label)])
            .iter()
            .map(|(_, labels, _)| labels["pid"].clone())
            .collect();
        series.sort();
        assert_eq!(series, culprits, "GPU {gpu}");
        let bystanders = in_json["bystanders"].as_array().unwrap().len() as f64;
        assert_eq!(
            metrics.value(
                "vram_holder_processes",
                &[("gpu", &label), ("role", "bystander")]
            ),
            bystanders
        );
        let sentence = verdict_line(&text.stdout, gpu);
        assert_eq!(sentence, in_json["verdict"]["sentence"]);
        let kill = format!("  suggested: kill {}", culprits.join(" "));
        assert_eq!(
            text.stdout.contains(&format!("{kill}   #")),
            !culprits.is_empty(),
            "GPU {gpu}: {}",
            text.stdout
        );
    }
    // GPU 0: the two children, never the agent; GPU 1: a live owner; GPU 2: no holder.
    assert_eq!(document["gpus"][0]["culprits"].as_array().unwrap().len(), 2);
    assert_eq!(
        document["gpus"][0]["bystanders"].as_array().unwrap().len(),
        1
    );
    assert_eq!(document["gpus"][1]["finding"], "owned");
    assert_eq!(document["gpus"][2]["remedy"]["action"], "reset_gpu");
}
