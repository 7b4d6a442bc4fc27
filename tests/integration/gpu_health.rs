//! What the driver says a GPU needs: the recovery action, row remapping, retired pages,
//! OS-managed memory, and critical Xid events counted by a background thread while
//! scrapes go on.

use crate::helpers::*;
use serde_json::Value;
use std::fs;
use std::path::Path;
use std::time::Duration;

/// The value of `vram_gpu_recovery_action` for `gpu` and `action`.
fn action(metrics: &Metrics, gpu: &str, action: &str) -> f64 {
    metrics.value(
        "vram_gpu_recovery_action",
        &[("gpu", gpu), ("action", action)],
    )
}

#[test]
fn the_recovery_action_is_one_hot_and_absent_where_the_driver_cannot_say() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).recovery_action(0))
            .gpu(Gpu::idle(1).recovery_action(1))
            .gpu(Gpu::idle(2).recovery_action(2))
            // A driver before 565: the field answers NotSupported.
            .gpu(Gpu::idle(3))
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    assert_promtool_clean(&metrics.text);
    for (gpu, expected) in [("0", "none"), ("1", "gpu_reset"), ("2", "node_reboot")] {
        assert_eq!(action(&metrics, gpu, expected), 1.0, "GPU {gpu}");
        let series = metrics.find("vram_gpu_recovery_action", &[("gpu", gpu)]);
        assert_eq!(
            series.len(),
            1,
            "one series, the action asked for: {series:?}"
        );
        // The GPU itself is fine: the action is a reading, not an error.
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", gpu)]), 1.0);
    }
    assert!(metrics
        .find("vram_gpu_recovery_action", &[("gpu", "3")])
        .is_empty());
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "3")]), 1.0);
}

#[test]
fn a_failing_gpu_still_says_what_it_needs() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .error("nvmlDeviceGetMemoryInfo_v2", "ResetRequired")
                    .recovery_action(1)
                    .remapped_rows(0, 2, true, false),
            )
            // A value this exporter does not know yet.
            .gpu(Gpu::idle(1).recovery_action(42))
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    assert_promtool_clean(&metrics.text);
    let gpu0 = [("gpu", "0")];
    assert_eq!(metrics.value("vram_gpu_up", &gpu0), 0.0);
    assert_eq!(action(&metrics, "0", "gpu_reset"), 1.0);
    assert_eq!(metrics.value("vram_gpu_row_remap_pending", &gpu0), 1.0);
    assert_eq!(action(&metrics, "1", "unknown"), 1.0);
    assert_eq!(action(&metrics, "1", "none"), 0.0);
}

#[test]
fn row_remapping_retired_pages_and_os_managed_memory_are_published() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            // An H200 after an uncorrectable error: a remapping waits for a reset.
            .gpu(
                Gpu::idle(0)
                    .recovery_action(0)
                    .remapped_rows(3, 1, true, false),
            )
            // Out of spare rows.
            .gpu(Gpu::idle(1).remapped_rows(0, 512, false, true))
            // A GPU before Ampere retires pages instead.
            .gpu(Gpu::idle(2).retired_pages(2, 1, true))
            // A GH200 in NUMA mode.
            .gpu(Gpu::idle(3).numa_node(1))
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    assert_promtool_clean(&metrics.text);
    let rows =
        |gpu, cause| metrics.value("vram_gpu_remapped_rows", &[("gpu", gpu), ("cause", cause)]);
    assert_eq!(rows("0", "correctable"), 3.0);
    assert_eq!(rows("0", "uncorrectable"), 1.0);
    assert_eq!(rows("1", "uncorrectable"), 512.0);
    for (gpu, pending, failure) in [("0", 1.0, 0.0), ("1", 0.0, 1.0)] {
        let labels = [("gpu", gpu)];
        assert_eq!(
            metrics.value("vram_gpu_row_remap_pending", &labels),
            pending
        );
        assert_eq!(
            metrics.value("vram_gpu_row_remap_failure", &labels),
            failure
        );
    }
    // Absent, not zero, where the GPU has no row remapping.
    assert!(metrics
        .find("vram_gpu_row_remap_pending", &[("gpu", "2")])
        .is_empty());
    let pages = |cause| metrics.value("vram_gpu_retired_pages", &[("gpu", "2"), ("cause", cause)]);
    assert_eq!(pages("multiple_single_bit_ecc"), 2.0);
    assert_eq!(pages("double_bit_ecc"), 1.0);
    assert_eq!(
        metrics.value("vram_gpu_retired_pages_pending", &[("gpu", "2")]),
        1.0
    );
    assert!(metrics
        .find("vram_gpu_retired_pages_pending", &[("gpu", "0")])
        .is_empty());
    for (gpu, managed) in [("0", 0.0), ("3", 1.0)] {
        assert_eq!(
            metrics.value("vram_gpu_memory_os_managed", &[("gpu", gpu)]),
            managed
        );
    }
}

/// The scrape's value of `vram_xid_errors_total` for `gpu` and `xid`, 0 when absent.
fn xid_count(metrics: &Metrics, gpu: &str, xid: &str) -> f64 {
    metrics
        .find("vram_xid_errors_total", &[("gpu", gpu), ("xid", xid)])
        .first()
        .map_or(0.0, |sample| sample.2)
}

/// Scrape until `condition` holds on a scrape; returns that scrape.
fn scrape_until(exporter: &Exporter, what: &str, condition: impl Fn(&Metrics) -> bool) -> Metrics {
    let mut last = None;
    wait_until(what, Duration::from_secs(20), || {
        let metrics = exporter.scrape();
        let done = condition(&metrics);
        last = Some(metrics);
        done
    });
    last.unwrap()
}

#[test]
fn xid_79_events_are_counted_while_scrapes_go_on() {
    let rig = Rig::new();
    let gpus = || Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json();
    rig.write_scenario(&gpus());
    let exporter = rig.start(&[]);
    scrape_until(
        &exporter,
        "both GPUs are watched for Xid events",
        |metrics| {
            ["0", "1"].iter().all(|gpu| {
                metrics
                    .find("vram_xid_watched", &[("gpu", gpu)])
                    .first()
                    .is_some_and(|s| s.2 == 1.0)
            })
        },
    );
    let metrics = exporter.scrape();
    assert!(!metrics.has("vram_xid_errors_total"), "{}", metrics.text);

    // GPU 0 falls off the bus; the counter appears while scrapes keep answering.
    rig.write_scenario(&with_xid_events(gpus(), &[(1, 0, 79)]));
    let metrics = scrape_until(&exporter, "Xid 79 is counted", |metrics| {
        xid_count(metrics, "0", "79") == 1.0
    });
    assert_promtool_clean(&metrics.text);
    assert!(
        metrics
            .text
            .contains("# TYPE vram_xid_errors_total counter"),
        "{}",
        metrics.text
    );
    assert_eq!(xid_count(&metrics, "1", "79"), 0.0);

    rig.write_scenario(&with_xid_events(
        gpus(),
        &[(1, 0, 79), (2, 0, 79), (3, 1, 48), (4, 0, 79)],
    ));
    let metrics = scrape_until(&exporter, "all four events are counted", |metrics| {
        xid_count(metrics, "0", "79") == 3.0 && xid_count(metrics, "1", "48") == 1.0
    });
    assert_eq!(metrics.find("vram_xid_errors_total", &[]).len(), 2);
    assert!(
        exporter.log().contains("critical Xid error"),
        "each event is logged:\n{}",
        exporter.log()
    );
}

#[test]
fn a_scrape_answers_while_the_event_thread_is_stuck_in_the_driver() {
    let rig = Rig::new();
    // The event wait hangs for a minute: a driver stuck inside nvmlEventSetWait.
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).delay("nvmlEventSetWait_v2", 60_000))
            .into_json(),
    );
    let (exporter, calls) = start_logging_calls(&rig);
    exporter.scrape();
    wait_until(
        "the event thread is inside the hung wait",
        Duration::from_secs(20),
        || waits_entered(&calls) >= 1,
    );
    for _ in 0..3 {
        let metrics = exporter.scrape();
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "0")]), 1.0);
        assert_eq!(
            metrics.value("vram_used_bytes", &[("gpu", "0")]),
            USED as f64
        );
        assert_eq!(metrics.value("vram_xid_watched", &[("gpu", "0")]), 1.0);
    }
    // Still the same single wait: the scrapes did not wait for it to end.
    assert_eq!(waits_entered(&calls), 1);
}

#[test]
fn a_fresh_exporter_says_its_gpus_are_watched_from_the_first_scrape() {
    // Registering a GPU for Xid events takes the driver a while (here 300 ms each): the
    // first scrape must read the watched state the exporter then keeps, not flap 0 -> 1.
    const REGISTER: &str = "nvmlDeviceRegisterEvents";
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).delay(REGISTER, 300))
            .gpu(Gpu::idle(1).delay(REGISTER, 300))
            .into_json(),
    );
    let exporter = rig.start(&[]);
    let first = exporter.scrape();
    for gpu in ["0", "1"] {
        assert_eq!(
            first.value("vram_xid_watched", &[("gpu", gpu)]),
            1.0,
            "GPU {gpu} on the first scrape"
        );
    }
    let second = exporter.scrape();
    for gpu in ["0", "1"] {
        assert_eq!(second.value("vram_xid_watched", &[("gpu", gpu)]), 1.0);
    }
}

#[test]
fn a_registration_that_hangs_holds_up_the_first_scrape_no_longer_than_its_bound() {
    // The driver takes 6 s to register the GPU: the first scrape waits 2 s at most, says
    // the GPU is not watched yet, and the log says why; once registered, it is watched.
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).delay("nvmlDeviceRegisterEvents", 6_000))
            .into_json(),
    );
    let exporter = rig.start(&[]);
    let started = std::time::Instant::now();
    let first = exporter.scrape();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "the first scrape took {waited:?}"
    );
    assert_eq!(first.value("vram_xid_watched", &[("gpu", "0")]), 0.0);
    assert!(
        exporter
            .log()
            .contains("has not finished registering the GPUs for critical Xid events"),
        "{}",
        exporter.log()
    );
    scrape_until(&exporter, "GPU 0 is watched once registered", |metrics| {
        metrics.value("vram_xid_watched", &[("gpu", "0")]) == 1.0
    });
}

/// How many times the event thread has entered NVML's wait call.
fn waits_entered(calls: &Path) -> usize {
    calls_made(calls, "nvmlEventSetWait_v2")
}

/// How many times the exporter has called `symbol`, from the fake NVML's call log.
fn calls_made(calls: &Path, symbol: &str) -> usize {
    fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == symbol)
        .count()
}

/// The exporter serving the rig's scenario, with the fake NVML logging its calls there.
fn start_logging_calls(rig: &Rig) -> (Exporter, std::path::PathBuf) {
    let calls = rig.dir.path().join("calls.log");
    let mut command = rig.command();
    command
        .env("FAKE_NVML_CALL_LOG", &calls)
        .args(["--web.listen-address", "127.0.0.1:0"]);
    (start(command), calls)
}

#[test]
fn xid_counts_survive_an_nvml_reload_and_counting_resumes() {
    let rig = Rig::new();
    let gpus = || Gpus::new().gpu(Gpu::idle(0)).into_json();
    rig.write_scenario(&gpus());
    let exporter = rig.start(&[]);
    let watched = |metrics: &Metrics| {
        metrics
            .find("vram_xid_watched", &[("gpu", "0")])
            .first()
            .is_some_and(|sample| sample.2 == 1.0)
    };
    scrape_until(&exporter, "GPU 0 is watched", watched);
    rig.write_scenario(&with_xid_events(gpus(), &[(1, 0, 79)]));
    scrape_until(&exporter, "the first Xid 79 is counted", |metrics| {
        xid_count(metrics, "0", "79") == 1.0
    });

    // The driver goes away (its library answers nothing), then comes back.
    fs::remove_file(&rig.scenario).unwrap();
    scrape_until(&exporter, "NVML is down", |metrics| {
        metrics.value("vram_nvml_up", &[]) == 0.0
    });
    rig.write_scenario(&with_xid_events(gpus(), &[(1, 0, 79)]));
    let metrics = scrape_until(
        &exporter,
        "NVML is reloaded and GPU 0 watched again",
        |metrics| metrics.value("vram_nvml_up", &[]) == 1.0 && watched(metrics),
    );
    // The counter kept its value across the reload.
    assert_eq!(xid_count(&metrics, "0", "79"), 1.0);
    // A later event of another Xid: once it is counted, the event thread has read past
    // the old one since the reload, so the old one was not recounted.
    rig.write_scenario(&with_xid_events(gpus(), &[(1, 0, 79), (2, 0, 48)]));
    let metrics = scrape_until(
        &exporter,
        "the Xid 48 after the reload is counted",
        |metrics| xid_count(metrics, "0", "48") == 1.0,
    );
    assert_eq!(xid_count(&metrics, "0", "79"), 1.0);
    rig.write_scenario(&with_xid_events(
        gpus(),
        &[(1, 0, 79), (2, 0, 48), (3, 0, 79)],
    ));
    scrape_until(&exporter, "the second Xid 79 is counted", |metrics| {
        xid_count(metrics, "0", "79") == 2.0
    });
}

#[test]
fn a_gpu_without_xid_events_is_not_watched_and_one_shot_commands_watch_nothing() {
    let rig = Rig::new();
    let mut quiet = Gpu::idle(1);
    quiet.0["supported_events"] = Value::from(0);
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(quiet).into_json());
    let exporter = rig.start(&[]);
    let metrics = scrape_until(&exporter, "GPU 0 is watched", |metrics| {
        metrics
            .find("vram_xid_watched", &[("gpu", "0")])
            .first()
            .is_some_and(|sample| sample.2 == 1.0)
    });
    assert_eq!(metrics.value("vram_xid_watched", &[("gpu", "1")]), 0.0);

    let output = rig.dir.path().join("vram.prom");
    let outcome = rig.run(&["textfile", "-o", output.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(0), "{}", outcome.stderr);
    let written = Metrics::parse(&fs::read_to_string(&output).unwrap());
    assert!(!written.has("vram_xid_watched"), "{}", written.text);
}

#[test]
fn what_a_gpu_cannot_answer_and_its_mig_mode_are_not_asked_on_every_scrape() {
    // An H200 answers NotSupported for retired pages (it remaps rows instead), slowly;
    // its MIG mode changes only at a reset. Memory is asked on every scrape.
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).mig_disabled())
            .into_json(),
    );
    let (exporter, calls) = start_logging_calls(&rig);
    let count = |symbol: &str| calls_made(&calls, symbol);
    let first = exporter.scrape();
    assert_eq!(first.value("vram_gpu_mig_mode", &[("gpu", "0")]), 0.0);
    let asked = [
        count("nvmlDeviceGetRetiredPagesPendingStatus"),
        count("nvmlDeviceGetMigMode"),
        count("nvmlDeviceGetMemoryInfo_v2"),
    ];
    assert!(asked.iter().all(|&times| times >= 1), "{asked:?}");
    for _ in 0..3 {
        let metrics = exporter.scrape();
        assert_eq!(metrics.value("vram_gpu_mig_mode", &[("gpu", "0")]), 0.0);
        assert!(metrics
            .find("vram_gpu_retired_pages_pending", &[("gpu", "0")])
            .is_empty());
    }
    assert_eq!(count("nvmlDeviceGetRetiredPagesPendingStatus"), asked[0]);
    assert_eq!(count("nvmlDeviceGetMigMode"), asked[1]);
    assert_eq!(count("nvmlDeviceGetMemoryInfo_v2"), asked[2] + 3);
}

#[test]
fn a_gpu_s_health_is_asked_again_after_a_critical_xid_not_on_every_scrape() {
    // The driver changes what a GPU needs after a fault, and a fault raises a critical
    // Xid: between events, scrapes serve the health as read (for 30 s), while memory is
    // asked every time.
    const FIELDS: &str = "nvmlDeviceGetFieldValues";
    const ROWS: &str = "nvmlDeviceGetRemappedRows";
    let rig = Rig::new();
    let gpus = |action, correctable| {
        Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(USED)
                    .recovery_action(action)
                    .remapped_rows(correctable, 0, false, false),
            )
            .into_json()
    };
    let remapped = |metrics: &Metrics| {
        metrics.value(
            "vram_gpu_remapped_rows",
            &[("gpu", "0"), ("cause", "correctable")],
        )
    };
    rig.write_scenario(&gpus(0, 0));
    let (exporter, calls) = start_logging_calls(&rig);
    let count = |symbol: &str| calls_made(&calls, symbol);
    let first = exporter.scrape();
    assert_eq!(action(&first, "0", "none"), 1.0);
    let asked = [
        count(FIELDS),
        count(ROWS),
        count("nvmlDeviceGetMemoryInfo_v2"),
    ];
    assert!(asked.iter().all(|&times| times >= 1), "{asked:?}");

    // The driver would answer otherwise now, but no event said so: not asked.
    rig.write_scenario(&gpus(1, 2));
    for _ in 0..3 {
        let metrics = exporter.scrape();
        assert_eq!(action(&metrics, "0", "none"), 1.0);
        assert_eq!(remapped(&metrics), 0.0);
    }
    assert_eq!([count(FIELDS), count(ROWS)], [asked[0], asked[1]]);
    assert_eq!(count("nvmlDeviceGetMemoryInfo_v2"), asked[2] + 3);

    // Xid 154 (the recovery action changed): the scrape after it is counted asks again.
    rig.write_scenario(&with_xid_events(gpus(1, 2), &[(1, 0, 154)]));
    scrape_until(&exporter, "Xid 154 is counted", |metrics| {
        xid_count(metrics, "0", "154") == 1.0
    });
    let metrics = exporter.scrape();
    assert_eq!(action(&metrics, "0", "gpu_reset"), 1.0);
    assert_eq!(action(&metrics, "0", "none"), 0.0);
    assert_eq!(remapped(&metrics), 2.0);
    assert!(count(FIELDS) > asked[0] && count(ROWS) > asked[1]);
}

#[test]
fn a_healthy_host_is_asked_the_library_calls_once_and_a_driver_gone_is_down_at_the_next_scrape() {
    // The device count and driver version do not change while NVML stays loaded: a look
    // of a healthy host reads the GPUs without asking them again (for 30 s).
    let rig = Rig::new();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    let (exporter, calls) = start_logging_calls(&rig);
    // Loading NVML and watching its events ask the count too; counted from here.
    assert_eq!(exporter.scrape().value("vram_nvml_up", &[]), 1.0);
    let asked = |symbol| calls_made(&calls, symbol);
    let (counts, versions, memory) = (
        asked("nvmlDeviceGetCount_v2"),
        asked("nvmlSystemGetDriverVersion"),
        asked("nvmlDeviceGetMemoryInfo_v2"),
    );
    for _ in 0..4 {
        let metrics = exporter.scrape();
        assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "1")]), 1.0);
    }
    assert_eq!(
        asked("nvmlDeviceGetMemoryInfo_v2"),
        memory + 8,
        "each scrape reads both GPUs"
    );
    assert_eq!(asked("nvmlDeviceGetCount_v2"), counts);
    assert_eq!(asked("nvmlSystemGetDriverVersion"), versions);

    // The driver goes away and every call fails: the GPUs' failures make the same look
    // ask the library, so the very next scrape says NVML is down, not that both GPUs
    // failed on their own.
    fs::remove_file(&rig.scenario).unwrap();
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
    assert!(
        metrics.find("vram_gpu_up", &[]).is_empty(),
        "no GPU is reported while NVML is down"
    );
    assert_eq!(asked("nvmlDeviceGetCount_v2"), counts + 1);
}
