//! Bad input: an NVML that answers garbage, a `/proc` that changes under the scan, and
//! a command line or a file that is wrong. Each answer must stay bounded and true: no
//! panic, no figure beyond the GPU, no process called gone or unknown because it exited
//! while we looked, and a mistake said in one line that names it, once.
//!
//! What the exporter does with each, and why, is in docs/how-it-decides.md ("When NVML
//! answers garbage").

use crate::helpers::*;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const CAPACITY: u64 = TOTAL - RESERVED;

fn gpu0(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut all = vec![("gpu", "0")];
    all.extend_from_slice(labels);
    metrics.value(name, &all)
}

#[test]
fn ten_thousand_listed_processes_give_a_bounded_answer() {
    let rig = Rig::new();
    // PIDs no process has, each charged 1 GiB: 10,000 GiB on a GPU of 140.
    let first = nonexistent_pid();
    let mut gpu = Gpu::idle(0).used(USED);
    for pid in first..first + 10_000 {
        gpu = gpu.process(pid, Some(GIB));
    }
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());

    // The scrape must finish within the exporter's own --web.collection-timeout: one that
    // does not gets 503, which `scrape` refuses. How long it takes is a benchmark's
    // business (docs/benchmarks.md), not this test's.
    let exporter = rig.start(&["--collector.processes", "--web.collection-timeout", "10s"]);
    let metrics = exporter.scrape();
    assert_eq!(
        gpu0(&metrics, "vram_owner_processes", &[("state", "gone")]),
        10_000.0
    );
    // Owned bytes keep to the GPU; orphaned bytes to the memory NVML calls used.
    assert_eq!(
        gpu0(&metrics, "vram_owned_bytes", &[("state", "gone")]),
        CAPACITY as f64
    );
    assert_eq!(
        gpu0(&metrics, "vram_orphaned_bytes", &[("reason", "owner_gone")]),
        USED as f64
    );
    assert_eq!(
        gpu0(
            &metrics,
            "vram_orphaned_bytes",
            &[("reason", "unattributed")]
        ),
        0.0
    );
    assert_eq!(gpu0(&metrics, "vram_memory_inconsistent", &[]), 1.0);
    // The per-process series stop at their limit (256 by default).
    assert_eq!(metrics.find("vram_process_used_bytes", &[]).len(), 256);
    assert_promtool_clean(&metrics.text);

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1), "{}", text.stderr);
    assert!(text.stdout.len() < 16 * 1024, "{} bytes", text.stdout.len());
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.starts_with(&format!(
            "GPU 0: 8.6 GiB (8,810 MiB) held for exited PIDs {}, {}, ",
            first,
            first + 1
        )) && sentence.contains(&format!(", {}, and 9992 more;", first + 7)),
        "{sentence}"
    );
    assert!(
        text.stdout
            .contains("  ... and 9968 more owners; vram-exporter check --json lists them all"),
        "{}",
        text.stdout
    );
    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(
        document["gpus"][0]["owners"].as_array().unwrap().len(),
        10_000
    );
    assert_eq!(document["gpus"][0]["orphaned_bytes"], USED);
    assert_eq!(document["gpus"][0]["memory_inconsistent"], true);
}

#[test]
fn memory_figures_beyond_the_total_are_clamped_and_flagged() {
    let rig = Rig::new();
    let mut reserved_too_big = Gpu::idle(1);
    reserved_too_big.0["memory"]["reserved"] = json!(2 * TOTAL);
    let mut free_too_big = Gpu::idle(2);
    free_too_big.0["memory"]["free"] = json!(u64::MAX);
    rig.write_scenario(
        &Gpus::new()
            // used > total, and no process to charge it to.
            .gpu(Gpu::idle(0).used(3 * TOTAL))
            .gpu(reserved_too_big)
            .gpu(free_too_big)
            .gpu(Gpu::idle(3).used(USED))
            .into_json(),
    );

    let metrics = rig.start(&[]).scrape();
    let figures = |gpu: &str| {
        [
            "vram_total_bytes",
            "vram_reserved_bytes",
            "vram_used_bytes",
            "vram_free_bytes",
            "vram_memory_inconsistent",
        ]
        .map(|name| metrics.value(name, &[("gpu", gpu)]))
    };
    let total = TOTAL as f64;
    let reserved = RESERVED as f64;
    assert_eq!(figures("0"), [total, reserved, CAPACITY as f64, 0.0, 1.0]);
    assert_eq!(figures("1"), [total, total, 0.0, 0.0, 1.0]);
    assert_eq!(figures("2"), [total, reserved, 0.0, CAPACITY as f64, 1.0]);
    assert_eq!(
        figures("3"),
        [total, reserved, USED as f64, (CAPACITY - USED) as f64, 0.0]
    );
    // Memory charged to no process, from a reading that contradicts itself, is not
    // called orphaned: no page for a driver bug.
    assert_eq!(
        metrics.value("vram_unattributed_bytes", &[("gpu", "0")]),
        CAPACITY as f64
    );
    for gpu in ["0", "1", "2"] {
        for reason in ["owner_gone", "unattributed"] {
            assert_eq!(
                metrics.value("vram_orphaned_bytes", &[("gpu", gpu), ("reason", reason)]),
                0.0
            );
        }
    }
    // The same kind of remainder from a reading that holds together is orphaned.
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "3"), ("reason", "unattributed")]
        ),
        USED as f64
    );
    assert_promtool_clean(&metrics.text);

    let text = rig.run(&["check", "--gpu", "0"]);
    // Figures that contradict each other cannot be judged: neither orphaned nor fine.
    assert_eq!(text.status, Some(3), "{}{}", text.stdout, text.stderr);
    assert!(
        text.stdout.contains(
            "  note: NVML's memory figures for this GPU contradict each other (reserved, used or free beyond the total): they are clamped to the total, and memory charged to no process is not called orphaned."
        ),
        "{}",
        text.stdout
    );
}

#[test]
fn duplicate_pids_across_and_within_lists_count_once() {
    let rig = Rig::new();
    let a = nonexistent_pid();
    let b = a + 1;
    let mut gpu = Gpu::idle(0)
        .used(4 * GIB)
        .process(a, Some(GIB))
        .process(a, Some(GIB))
        .process(b, Some(2 * GIB));
    gpu.0["graphics_processes"] = json!([
        { "pid": a, "used_bytes": GIB },
        { "pid": b, "used_bytes": null },
    ]);
    gpu.0["mps_processes"] = json!([{ "pid": b, "used_bytes": 2 * GIB }]);
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());

    let metrics = rig.start(&["--collector.processes"]).scrape();
    assert_eq!(
        gpu0(&metrics, "vram_owner_processes", &[("state", "gone")]),
        2.0
    );
    assert_eq!(
        gpu0(&metrics, "vram_owned_bytes", &[("state", "gone")]),
        (3 * GIB) as f64
    );
    assert_eq!(
        gpu0(&metrics, "vram_orphaned_bytes", &[("reason", "owner_gone")]),
        (3 * GIB) as f64
    );
    assert_eq!(
        gpu0(&metrics, "vram_owner_processes_usage_unavailable", &[]),
        0.0
    );
    assert_eq!(gpu0(&metrics, "vram_memory_inconsistent", &[]), 0.0);
    assert_eq!(metrics.find("vram_process_used_bytes", &[]).len(), 2);
    let document = rig.run(&["check", "--json"]).json();
    let owners: Vec<(u64, u64)> = document["gpus"][0]["owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|owner| {
            (
                owner["pid"].as_u64().unwrap(),
                owner["used_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(owners, [(u64::from(a), GIB), (u64::from(b), 2 * GIB)]);
}

#[test]
fn a_gpu_name_that_is_not_utf8_is_kept_with_replacement_characters() {
    let rig = Rig::new();
    let mut gpu = Gpu::idle(0);
    gpu.0["name_bytes"] = json!([b'H', 0xff, b'2', 0xc3, b'0', b'0']);
    rig.write_scenario(&Gpus::new().gpu(gpu).gpu(Gpu::idle(1)).into_json());

    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_gpu_info",
            &[("gpu", "0"), ("name", "H\u{fffd}2\u{fffd}00")]
        ),
        1.0,
        "{}",
        metrics.text
    );
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "0")]), 1.0);
    assert_eq!(
        metrics.value("vram_gpu_info", &[("gpu", "1"), ("name", "NVIDIA H200")]),
        1.0
    );
    assert_promtool_clean(&metrics.text);
    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(document["gpus"][0]["name"], "H\u{fffd}2\u{fffd}00");
}

/// Processes that open the device and exit within a few milliseconds, started without
/// pause until dropped: the `/proc` entries the scan reads vanish while it reads them.
struct Churn {
    stop: Arc<AtomicBool>,
    pids: Arc<Mutex<Vec<u32>>>,
    spawner: Option<std::thread::JoinHandle<u64>>,
}

impl Churn {
    fn start(device: &std::path::Path) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let device = device.to_path_buf();
        let spawner = {
            let stop = Arc::clone(&stop);
            let pids = Arc::clone(&pids);
            std::thread::spawn(move || {
                let mut running: Vec<Child> = Vec::new();
                let mut started = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Up to 32 at a time: some exit at once, some after a short sleep.
                    running.retain_mut(|child| child.try_wait().ok().flatten().is_none());
                    if running.len() < 32 {
                        let script = if started % 2 == 0 {
                            "exec 3<\"$1\"; exit 0"
                        } else {
                            "exec 3<\"$1\"; exec sleep 0.02"
                        };
                        let child = Command::new("sh")
                            .args(["-c", script, "sh"])
                            .arg(&device)
                            .stdin(Stdio::null())
                            .spawn()
                            .expect("spawn a short-lived holder");
                        let mut recent = pids.lock().unwrap();
                        recent.push(child.id());
                        let excess = recent.len().saturating_sub(64);
                        recent.drain(..excess);
                        running.push(child);
                        started += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
                for mut child in running {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                started
            })
        };
        Churn {
            stop,
            pids,
            spawner: Some(spawner),
        }
    }

    /// PIDs of the latest short-lived processes, most of them already gone.
    fn recent(&self) -> Vec<u32> {
        self.pids.lock().unwrap().clone()
    }

    /// Stop, reap everything, and say how many processes were started.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.spawner.take().unwrap().join().unwrap()
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(spawner) = self.spawner.take() {
            let _ = spawner.join();
        }
    }
}

#[test]
fn processes_that_exit_during_the_scan_are_neither_errors_nor_missed_holders() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    // They hold GPU 1's node, so GPU 0's holder list stays the one lasting holder.
    let churn = Churn::start(&rig.device(1));
    let scenario = |listed: &[u32]| {
        let mut racing = Gpu::idle(1).used(USED);
        for &pid in listed {
            racing = racing.process(pid, Some(GIB / 64));
        }
        Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(racing)
            .into_json()
    };
    rig.write_scenario(&scenario(&[]));
    let exporter = rig.start(&[]);
    let holder = child.pid.to_string();

    for round in 0..40 {
        // NVML lists processes that are exiting, as it would for a crash loop.
        rig.write_scenario(&scenario(&churn.recent()));
        let metrics = exporter.scrape();
        let context = || format!("round {round}:\n{}", metrics.text);
        // Always a full scan that finds the one lasting holder.
        assert_eq!(
            metrics.value("vram_holder_scan_complete", &[]),
            1.0,
            "{}",
            context()
        );
        assert_eq!(
            metrics.value("vram_holder_info", &[("gpu", "0"), ("pid", &holder)]),
            1.0,
            "{}",
            context()
        );
        assert_eq!(
            metrics.value(
                "vram_orphaned_bytes",
                &[("gpu", "0"), ("reason", "owner_gone")]
            ),
            CHARGED as f64
        );
        // A process that exits while we read it is gone, never unreadable or unknown.
        assert_eq!(
            metrics.value("vram_scrape_procfs_unreadable_entries", &[]),
            0.0,
            "{}",
            context()
        );
        assert_eq!(
            metrics.value(
                "vram_owner_processes",
                &[("gpu", "1"), ("state", "unknown")]
            ),
            0.0,
            "{}",
            context()
        );
        let listed: f64 = metrics
            .find("vram_owner_processes", &[("gpu", "1")])
            .iter()
            .map(|(_, _, count)| *count)
            .sum();
        assert!(listed <= 64.0, "{}", context());
    }
    let started = churn.finish();
    assert!(started >= 100, "only {started} short-lived processes ran");
}

// ---------------------------------------------------------------------------------------
// Mistakes on the command line and in the files it names

/// The binary run with `args` alone: no NVML is needed to refuse a command line.
fn run_plain(args: &[&str]) -> Outcome {
    let output = std::process::Command::new(exporter_binary())
        .args(args)
        .output()
        .expect("run the exporter");
    Outcome {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Exit status 2, nothing on standard output, and exactly one line on standard error,
/// which is returned.
fn one_line_and_status_2(args: &[&str]) -> String {
    let outcome = run_plain(args);
    assert_eq!(outcome.status, Some(2), "{args:?}: {outcome:?}");
    assert_eq!(outcome.stdout, "", "{args:?}");
    let lines: Vec<&str> = outcome.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?} must say one line: {:?}",
        outcome.stderr
    );
    lines[0].to_string()
}

#[test]
fn a_bad_flag_is_one_line_that_names_it_and_exit_status_2() {
    assert_eq!(
        one_line_and_status_2(&["--bogus"]),
        "vram-exporter: unexpected argument '--bogus' found; see vram-exporter --help"
    );
    assert_eq!(
        one_line_and_status_2(&["check", "--wait", "soon"]),
        "vram-exporter: invalid value 'soon' for '--wait <DURATION>': 'soon' is not a duration such as 500ms, 30s or 1m30s; see vram-exporter check --help"
    );
    assert_eq!(
        one_line_and_status_2(&["--collector.processes", "check"]),
        "vram-exporter: --collector.processes does nothing for `check`; see vram-exporter check --help"
    );
    let line = one_line_and_status_2(&["snapshot", "--collector.processes"]);
    assert!(line.contains("'--collector.processes'"), "{line}");
    let line = one_line_and_status_2(&["--web.max-connections", "0"]);
    assert_eq!(
        line,
        "vram-exporter: --web.max-connections must be at least 1"
    );
}

#[test]
fn a_replayed_snapshot_is_not_waited_on_and_its_gpus_are_counted_as_its_own() {
    let story = crate::helpers::repository().join("examples/story-gpu2-orphaned.json");
    let story = story.to_str().unwrap();
    // A snapshot cannot change: waiting on it could only run out, so its answer is given
    // at once, before or after the subcommand, rather than polled for 30 s (a Slurm
    // epilog, which always waits, answers from a snapshot too), and one line says why.
    for args in [
        &["check", "--wait", "30s", "--replay", story][..],
        &["--replay", story, "check", "--wait", "30s"],
    ] {
        let started = std::time::Instant::now();
        let outcome = run_plain(args);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(outcome.status, Some(1), "{outcome:?}");
        assert_eq!(
            outcome.stderr,
            "vram-exporter: warning: --wait does not wait on a replay: a snapshot does not change, so its answer is final\n"
        );
        assert!(outcome
            .stdout
            .ends_with("exit status 1: orphaned memory found\n"));
    }
    // The story's snapshot has eight GPUs, whatever this host has.
    assert_eq!(
        one_line_and_status_2(&["check", "--gpu", "99", "--replay", story]),
        "vram-exporter: there is no GPU 99; the snapshot has 8 (indices 0 to 7)"
    );
}

#[test]
fn help_and_version_go_to_standard_output_with_exit_status_0() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["check", "--help"],
        &["--version"],
    ] {
        let outcome = run_plain(args);
        assert_eq!(outcome.status, Some(0), "{args:?}: {outcome:?}");
        assert_eq!(outcome.stderr, "", "{args:?}");
        assert!(!outcome.stdout.is_empty(), "{args:?}");
    }
    let check = run_plain(&["check", "--help"]).stdout;
    assert!(check.contains("Exit status:"), "{check}");
    assert!(!check.contains("--collector.processes"), "{check}");
    assert!(!check.contains("--web."), "{check}");
    let version = run_plain(&["--version"]).stdout;
    assert_eq!(
        version,
        format!(
            "vram-exporter {} (revision {})\n",
            env!("CARGO_PKG_VERSION"),
            env!("VRAM_EXPORTER_REVISION")
        )
    );
}

#[test]
fn an_error_says_its_cause_once() {
    let rig = Rig::new();
    let missing = rig.dir.path().join("missing.json");
    let line = one_line_and_status_2(&["check", "--replay", missing.to_str().unwrap()]);
    assert_eq!(
        line,
        format!(
            "vram-exporter: cannot read snapshot {}: No such file or directory (os error 2)",
            missing.display()
        )
    );

    let config = rig.dir.path().join("web.yml");
    std::fs::write(
        &config,
        "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
    )
    .unwrap();
    let line = one_line_and_status_2(&[
        "--web.config.file",
        config.to_str().unwrap(),
        "--web.listen-address",
        "127.0.0.1:0",
    ]);
    assert_eq!(
        line,
        format!(
            "vram-exporter: web config file {}: tls_server_config: cannot read cert_file {}: No such file or directory (os error 2)",
            config.display(),
            rig.dir.path().join("missing.crt").display()
        )
    );
}
