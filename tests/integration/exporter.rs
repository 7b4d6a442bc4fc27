//! The exporter against the fake NVML and real processes: each ownership scenario shows
//! the exact owner counts and orphaned bytes.

use crate::helpers::*;
use std::time::Duration;

const GPU0: [(&str, &str); 1] = [("gpu", "0")];

fn state(metrics: &Metrics, name: &str, state: &str) -> f64 {
    metrics.value(name, &[("gpu", "0"), ("state", state)])
}

/// Culprits of GPU 0's orphaned memory the metrics count.
fn culprits(metrics: &Metrics) -> f64 {
    metrics.value(
        "vram_holder_processes",
        &[("gpu", "0"), ("role", "culprit")],
    )
}

fn orphaned(metrics: &Metrics, reason: &str) -> f64 {
    metrics.value("vram_orphaned_bytes", &[("gpu", "0"), ("reason", reason)])
}

/// Every state but `except` has no owners.
fn only_state(metrics: &Metrics, expected: &str, count: f64) {
    for state_name in [
        "running",
        "stopped",
        "uninterruptible",
        "zombie",
        "gone",
        "unknown",
    ] {
        let want = if state_name == expected { count } else { 0.0 };
        assert_eq!(
            state(metrics, "vram_owner_processes", state_name),
            want,
            "owners in state {state_name}"
        );
    }
}

#[test]
fn idle_gpu_reports_memory_and_nothing_orphaned() {
    let rig = Rig::new();
    let exporter = rig.start(&[]);
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(metrics.value("vram_gpu_up", &GPU0), 1.0);
    assert_eq!(metrics.value("vram_total_bytes", &GPU0), TOTAL as f64);
    assert_eq!(metrics.value("vram_reserved_bytes", &GPU0), RESERVED as f64);
    assert_eq!(metrics.value("vram_used_bytes", &GPU0), 0.0);
    assert_eq!(
        metrics.value("vram_free_bytes", &GPU0),
        (TOTAL - RESERVED) as f64
    );
    only_state(&metrics, "running", 0.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
    assert_eq!(orphaned(&metrics, "unattributed"), 0.0);
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 1.0);
    let info = metrics.find("vram_gpu_info", &GPU0);
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].1["uuid"], Gpu::uuid(0));
    assert_eq!(info[0].1["name"], "NVIDIA H200");
    assert_eq!(info[0].1["pci_bus_id"], "00000000:19:00.0");
    assert_eq!(info[0].1["minor"], "0");
    let build = metrics.find("vram_build_info", &[]);
    assert_eq!(build[0].1["driver_version"], "580.159.04");
    assert_eq!(build[0].1["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn live_owner_is_running_and_owns_its_bytes() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "running", 1.0);
    assert_eq!(
        state(&metrics, "vram_owned_bytes", "running"),
        CHARGED as f64
    );
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
    // The 8.8 MiB of context overhead stays under the default floor.
    assert_eq!(orphaned(&metrics, "unattributed"), 0.0);
    assert_eq!(metrics.value("vram_unattributed_bytes", &GPU0), 0.0);
}

#[test]
fn stopped_owner_is_stopped_and_nothing_is_orphaned() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    owner.stop();
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "stopped", 1.0);
    assert_eq!(
        state(&metrics, "vram_owned_bytes", "stopped"),
        CHARGED as f64
    );
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
}

#[test]
fn zombie_main_thread_with_a_live_thread_is_a_live_owner() {
    let rig = Rig::new();
    let owner = Holder::zombie_main_thread(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "zombie", 1.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
}

#[test]
fn fork_inherited_orphan_is_owner_gone_until_the_child_dies() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let charged = Gpus::new().gpu(Gpu::one_owner(0, dead_owner)).into_json();
    rig.write_scenario(&charged);
    let exporter = rig.start(&[]);

    let metrics = exporter.scrape();
    only_state(&metrics, "gone", 1.0);
    assert_eq!(state(&metrics, "vram_owned_bytes", "gone"), CHARGED as f64);
    assert_eq!(orphaned(&metrics, "owner_gone"), CHARGED as f64);
    assert_eq!(orphaned(&metrics, "unattributed"), 0.0);
    assert_eq!(culprits(&metrics), 1.0);
    let holder_pid = child.pid.to_string();
    let holder = metrics.find("vram_holder_info", &[("gpu", "0"), ("pid", &holder_pid)]);
    assert_eq!(holder.len(), 1, "{}", metrics.text);
    assert_eq!(holder[0].1["comm"], "dataloader");
    assert_eq!(holder[0].1["state"], "running");
    assert_eq!(holder[0].1["uuid"], Gpu::uuid(0));
    assert_eq!(metrics.value("vram_holder_scan_complete", &[]), 1.0);
    assert!(metrics.value("vram_holder_scan_duration_seconds", &[]) > 0.0);

    // Killing the child frees the memory: the driver drops the dead PID from its list.
    child.kill();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    let metrics = exporter.scrape();
    only_state(&metrics, "gone", 0.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
    assert_eq!(culprits(&metrics), 0.0);
    assert!(metrics.find("vram_holder_info", &[]).is_empty());
    assert_eq!(metrics.value("vram_holder_scan_duration_seconds", &[]), 0.0);
}

#[test]
fn owner_pid_that_no_longer_exists_is_gone() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, nonexistent_pid()))
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "gone", 1.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), CHARGED as f64);
    assert_eq!(culprits(&metrics), 0.0);
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "exited")]
        ),
        1.0
    );
}

/// How many times each of the three process-list calls is in the fake NVML's call log.
fn list_calls(calls: &std::path::Path) -> [usize; 3] {
    let log = std::fs::read_to_string(calls).unwrap_or_default();
    PROCESS_LIST_CALLS.map(|call| log.lines().filter(|line| *line == call).count())
}

#[test]
fn each_process_list_is_one_nvml_call_a_scrape() {
    // nvml-wrapper's safe API asks for a non-empty list twice (its length, then its
    // entries); the exporter reads each list once, into a buffer it keeps.
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let listed = |processes: u32| {
        let mut gpu = Gpu::idle(0).used(u64::from(processes) * CHARGED);
        for offset in 0..processes {
            gpu = gpu.process(nonexistent_pid() + offset, Some(CHARGED));
        }
        gpu.0["graphics_processes"] =
            serde_json::json!([{ "pid": nonexistent_pid(), "used_bytes": CHARGED }]);
        gpu.0["mps_processes"] =
            serde_json::json!([{ "pid": nonexistent_pid() + 1, "used_bytes": CHARGED }]);
        Gpus::new().gpu(gpu).into_json()
    };
    rig.write_scenario(&listed(3));
    let mut command = rig.command();
    command
        .env("FAKE_NVML_CALL_LOG", &calls)
        .args(["--web.listen-address", "127.0.0.1:0"]);
    let exporter = start(command);
    for scrape in 1..=3 {
        only_state(&exporter.scrape(), "gone", 3.0);
        assert_eq!(list_calls(&calls), [scrape; 3], "after {scrape} scrapes");
    }
    // A list longer than the buffer so far: one more call to learn its length, the
    // buffer grows, and every process is there.
    rig.write_scenario(&listed(100));
    let before = list_calls(&calls);
    only_state(&exporter.scrape(), "gone", 100.0);
    let after = list_calls(&calls);
    assert!(
        (1..=2).contains(&(after[0] - before[0])),
        "{before:?} -> {after:?}"
    );
    assert_eq!([after[1] - before[1], after[2] - before[2]], [1, 1]);
}

#[test]
fn reused_pid_without_the_device_is_gone() {
    let rig = Rig::new();
    // A live process that never opened a GPU, standing where the owner's PID was.
    let stranger = Holder::opening(&rig.dir.path().join("scenario.json"));
    rig.charge_gpu0(stranger.pid, Some(CHARGED));
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "gone", 1.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), CHARGED as f64);
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "reused")]
        ),
        1.0
    );
}

#[test]
fn memory_charged_to_nobody_is_unattributed_orphan() {
    // The story's GPU 2: 76,107 MiB used and no process listed.
    let used = 76_107 * 1024 * 1024;
    let rig = Rig::new();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0).used(used)).into_json());
    let metrics = rig.start(&[]).scrape();
    assert_eq!(orphaned(&metrics, "unattributed"), used as f64);
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
    assert_eq!(metrics.value("vram_unattributed_bytes", &GPU0), used as f64);
}

#[test]
fn noise_floor_is_a_flag() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let metrics = rig.start(&["--orphan.context-overhead", "0"]).scrape();
    assert_eq!(orphaned(&metrics, "unattributed"), (USED - CHARGED) as f64);
}

#[test]
fn live_owner_with_unavailable_usage_blocks_unattributed_orphans() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, None);
    let metrics = rig.start(&[]).scrape();
    only_state(&metrics, "running", 1.0);
    assert_eq!(
        metrics.value("vram_owner_processes_usage_unavailable", &GPU0),
        1.0
    );
    assert!(metrics.value("vram_unattributed_bytes", &GPU0) > 0.0);
    assert_eq!(orphaned(&metrics, "unattributed"), 0.0);
}

#[test]
fn blind_exporter_reports_unattributed_but_not_orphaned() {
    // A procfs whose own PID namespace is not the host's: NVML would hide foreign owners.
    let rig = Rig::new();
    let procfs = rig.dir.path().join("proc");
    std::fs::create_dir_all(procfs.join("self/ns")).unwrap();
    std::os::unix::fs::symlink("pid:[4026532999]", procfs.join("self/ns/pid")).unwrap();
    let used = 4 * 1024 * 1024 * 1024 + 9 * 1024 * 1024;
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0).used(used)).into_json());
    let exporter = rig.start(&[
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs.to_str().unwrap(),
    ]);
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 0.0);
    assert_eq!(metrics.value("vram_unattributed_bytes", &GPU0), used as f64);
    assert_eq!(orphaned(&metrics, "unattributed"), 0.0);
    assert!(
        exporter.log().contains("level=warn") && exporter.log().contains("PID namespace"),
        "a blind exporter warns at start:\n{}",
        exporter.log()
    );
}

#[test]
fn lost_gpu_loses_only_its_own_series() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED))
            .gpu(Gpu::idle(1).error("nvmlDeviceGetMemoryInfo_v2", "GpuLost"))
            .gpu(Gpu::idle(2).error("nvmlDeviceGetMemoryInfo_v2", "ResetRequired"))
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(metrics.value("vram_gpu_up", &GPU0), 1.0);
    assert_eq!(metrics.value("vram_used_bytes", &GPU0), USED as f64);
    for (gpu, error) in [("1", "gpu_lost"), ("2", "reset_required")] {
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", gpu)]), 0.0);
        assert_eq!(
            metrics.value("vram_gpu_error", &[("gpu", gpu), ("error", error)]),
            1.0
        );
        assert_eq!(
            metrics.value("vram_gpu_error", &[("gpu", gpu), ("error", "unknown")]),
            0.0
        );
        // No wrong numbers: its memory series are absent, not zero.
        assert!(metrics.find("vram_used_bytes", &[("gpu", gpu)]).is_empty());
        assert!(metrics
            .find("vram_orphaned_bytes", &[("gpu", gpu)])
            .is_empty());
        // It keeps its identity.
        assert_eq!(metrics.find("vram_gpu_info", &[("gpu", gpu)]).len(), 1);
    }
}

#[test]
fn missing_nvml_serves_health_series_and_recovers_when_it_appears() {
    let rig = Rig::new();
    let late = rig.dir.path().join("late");
    std::fs::create_dir(&late).unwrap();
    let library = late.join("libnvidia-ml.so.1");
    let mut command = std::process::Command::new(exporter_binary());
    command
        .env("FAKE_NVML_SCENARIO", &rig.scenario)
        .args(["--web.listen-address", "127.0.0.1:0", "--nvml.library"])
        .arg(&library);
    let exporter = crate::helpers::start(command);

    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
    assert!(metrics.has("vram_scrape_duration_seconds"));
    assert!(metrics.has("vram_host_pid_namespace"));
    assert!(!metrics.has("vram_used_bytes"));
    exporter.scrape();
    let errors = exporter.log().matches("level=error").count();
    assert_eq!(
        errors,
        1,
        "one clear error, not one per scrape:\n{}",
        exporter.log()
    );
    // The one line says, with the path, that it keeps trying and what is served
    // meanwhile, which /-/ready and docs/reference.md agree with.
    let log = exporter.log();
    let said = log
        .lines()
        .find(|line| line.contains("level=error"))
        .unwrap();
    for words in [
        format!("msg=\"cannot load NVML from {}; retrying until it loads (1 s, doubling to 300 s)", library.display()),
        "serving vram_nvml_up 0 with vram_nvml_error{error=\\\"missing\\\"} 1 meanwhile, and /-/ready answers 200".to_string(),
        format!("(the path --nvml.library gives): {}: cannot open shared object file", library.display()),
        "point --nvml.library at the NVIDIA driver's libnvidia-ml.so.1".to_string(),
    ] {
        assert!(said.contains(&words), "{words} not in: {said}");
    }
    assert!(!log.contains("libloading"), "{log}");
    assert_eq!(
        metrics.value("vram_nvml_error", &[("error", "missing")]),
        1.0
    );
    assert_eq!(exporter.get("/-/ready").status, 200);
    let reference = std::fs::read_to_string(repository().join("docs/reference.md")).unwrap();
    assert!(reference
        .contains("`/-/ready` answers 200 as soon as the server listens, whatever NVML does"));

    // The driver gets installed: a later scrape (after the back-off) finds it.
    std::os::unix::fs::symlink(fake_nvml_library(), &library).unwrap();
    wait_until("NVML is up", Duration::from_secs(20), || {
        exporter.scrape().value("vram_nvml_up", &[]) == 1.0
    });
}

#[test]
fn driver_that_fails_to_initialise_is_nvml_down() {
    let rig = Rig::new();
    rig.write_scenario(&Gpus::new().init_error("DriverNotLoaded").into_json());
    let metrics = rig.start(&[]).scrape();
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
}

#[test]
fn per_process_series_are_opt_in_and_capped() {
    let rig = Rig::new();
    let owners: Vec<Holder> = (0..3).map(|_| Holder::spawn(&rig.device(0))).collect();
    let mut gpu = Gpu::idle(0).used(3 * CHARGED);
    for owner in &owners {
        gpu = gpu.process(owner.pid, Some(CHARGED));
    }
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());

    assert!(!rig.start(&[]).scrape().has("vram_process_used_bytes"));
    let metrics = rig.start(&["--collector.processes"]).scrape();
    let pid = owners[0].pid.to_string();
    let series = metrics.find("vram_process_used_bytes", &[("pid", &pid)]);
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].1["comm"], "cuda-job");
    assert_eq!(series[0].1["state"], "running");
    assert_eq!(series[0].2, CHARGED as f64);
    let capped = rig
        .start(&["--collector.processes", "--collector.processes.limit", "2"])
        .scrape();
    assert_eq!(capped.find("vram_process_used_bytes", &[]).len(), 2);
}

#[test]
fn real_output_passes_promtool_check_metrics() {
    let rig = Rig::new();
    let (dead_owner, _child) = Holder::fork_orphan(&rig.device(0));
    let live = Holder::spawn(&rig.device(1));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, live.pid))
            .gpu(Gpu::idle(2).error("nvmlDeviceGetMemoryInfo_v2", "GpuLost"))
            .into_json(),
    );
    let exporter = rig.start(&["--collector.processes"]);
    let metrics = exporter.scrape();
    assert!(metrics.has("vram_holder_info"));
    assert!(metrics.has("vram_process_used_bytes"));
    assert_promtool_clean(&metrics.text);
}

#[test]
fn http_endpoints_follow_exporter_conventions() {
    let rig = Rig::new();
    let exporter = rig.start(&["--web.telemetry-path", "/vram"]);

    let landing = exporter.get("/");
    assert_eq!(landing.status, 200);
    assert!(landing
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(landing.body.contains("href=\"/vram\""));
    assert_eq!(exporter.get("/-/healthy").status, 200);
    assert_eq!(exporter.get("/-/ready").status, 200);
    assert_eq!(exporter.get("/metrics").status, 404);
    assert_eq!(exporter.get("/nope").status, 404);

    let metrics = exporter.get("/vram");
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(metrics.body.contains("vram_nvml_up 1"));

    let head = exporter.request("HEAD", "/vram", &[]);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());

    for method in ["POST", "PUT", "DELETE"] {
        let refused = exporter.request(method, "/vram", &["Content-Length: 0"]);
        assert_eq!(refused.status, 405, "{method}");
        assert_eq!(refused.header("allow"), Some("GET, HEAD"));
    }

    let openmetrics = exporter.request(
        "GET",
        "/vram",
        &["Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"],
    );
    assert!(openmetrics
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(openmetrics.body.trim_end().ends_with("# EOF"));
}

#[test]
fn sigterm_shuts_down_cleanly() {
    // The reference (HTTP endpoints) promises that SIGTERM lets requests in flight finish. A scrape whose
    // collection is inside a slow NVML call (the fake's memory call sleeps 2 s) when
    // SIGTERM arrives must still get its whole body, and the exporter then exits 0.
    const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";
    let rig = Rig::new();
    let mut gpu = Gpu::idle(0);
    gpu.0["delays_ms"][MEMORY_CALL] = serde_json::json!(2000);
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let calls = rig.dir.path().join("calls.log");
    let mut command = rig.command();
    command
        .env("FAKE_NVML_CALL_LOG", &calls)
        .args(["--web.listen-address", "127.0.0.1:0"]);
    let exporter = start(command);
    let memory_calls = || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .filter(|call| *call == MEMORY_CALL)
            .count()
    };
    let before = memory_calls();

    let address = exporter.address;
    let scrape = std::thread::spawn(move || http(address, "GET", "/metrics", &[]));
    // The fake logs a call as it starts it: from here the collection is in flight.
    wait_until(
        "the scrape's collection is inside NVML's memory call",
        Duration::from_secs(10),
        || memory_calls() > before,
    );
    signal(exporter.child.id(), libc::SIGTERM);

    let response = scrape.join().expect("the scrape in flight is answered");
    assert_eq!(response.status, 200, "{}", response.body);
    let metrics = Metrics::parse(&response.body);
    assert_eq!(metrics.value("vram_gpu_up", &GPU0), 1.0);
    assert_eq!(
        metrics.value("vram_total_bytes", &GPU0),
        TOTAL as f64,
        "{}",
        response.body
    );
    // The body is whole: the last family is there too.
    assert!(
        metrics.has("vram_scrape_duration_seconds"),
        "{}",
        response.body
    );
    let status = exporter.wait_for_exit();
    assert!(status.success(), "{status:?}");
}

#[test]
fn port_in_use_is_one_clear_line_and_a_failure() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let rig = Rig::new();
    let outcome = rig.run(&["--web.listen-address", &address]);
    assert_eq!(outcome.status, Some(2));
    let lines: Vec<&str> = outcome.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", outcome.stderr);
    assert!(
        lines[0].contains("cannot listen on") && lines[0].contains("in use"),
        "{}",
        lines[0]
    );
}

#[test]
fn bad_flags_are_one_clear_line_and_a_failure() {
    let rig = Rig::new();
    for (args, expected) in [
        (
            vec!["--web.listen-address", "not-an-address"],
            "is not HOST:PORT",
        ),
        (vec!["--orphan.context-overhead", "lots"], "not a size"),
        // 16 bytes or 16 MiB: a number alone is refused, as a duration's is.
        (
            vec!["--orphan.context-overhead", "16"],
            "invalid value '16' for '--orphan.context-overhead <SIZE>': '16' needs a unit: B, KiB, MiB, GiB, TiB, kB, MB, GB or TB; see vram-exporter --help",
        ),
        (
            vec!["--holders.scan-timeout", "2"],
            "invalid value '2' for '--holders.scan-timeout <DURATION>': '2' needs a unit: ns, us, ms, s, m, h, d, w or y; see vram-exporter --help",
        ),
        (vec!["--web.telemetry-path", "metrics"], "must start with /"),
        (vec!["--log.level", "loud"], "invalid value"),
    ] {
        let outcome = rig.run(&args);
        assert_eq!(outcome.status, Some(2), "{args:?}: {}", outcome.stderr);
        assert!(
            outcome.stderr.contains(expected),
            "{args:?}: {}",
            outcome.stderr
        );
        assert!(!outcome.stderr.contains("panicked"), "{}", outcome.stderr);
    }
}

#[test]
fn unreadable_proc_entries_are_counted_not_called_gone() {
    // PID 1 belongs to root; an unprivileged exporter may not read its descriptors.
    let rig = Rig::new();
    rig.charge_gpu0(1, Some(CHARGED));
    let exporter =
        crate::helpers::start(rig.unprivileged_command(&["--web.listen-address", "127.0.0.1:0"]));
    let metrics = exporter.scrape();
    assert!(
        metrics.value("vram_scrape_procfs_unreadable_entries", &[]) >= 1.0,
        "{}",
        metrics.text
    );
    assert_eq!(state(&metrics, "vram_owner_processes", "gone"), 0.0);
    assert_eq!(orphaned(&metrics, "owner_gone"), 0.0);
}

/// The `collected` lines of a debug log.
fn collection_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains(" msg=collected "))
        .map(str::to_string)
        .collect()
}

#[test]
fn debug_logs_one_line_per_collection_with_what_it_found() {
    // An owner that is gone: its memory is orphaned, so every collection scans.
    let rig = Rig::new();
    rig.charge_gpu0(nonexistent_pid(), Some(CHARGED));
    let exporter = rig.start(&["--log.level", "debug"]);
    for scrapes in 1..=3 {
        exporter.scrape();
        // The line is written before the response goes out; the log is read apart.
        wait_until("the collection is logged", Duration::from_secs(20), || {
            collection_lines(&exporter.log()).len() >= scrapes
        });
        assert_eq!(
            collection_lines(&exporter.log()).len(),
            scrapes,
            "{}",
            exporter.log()
        );
    }
    let lines = collection_lines(&exporter.log());
    for field in [
        "level=debug",
        "gpus=1",
        "owners=1",
        &format!("orphaned_bytes={CHARGED}"),
        "holder_scan=made",
        "scan_complete=true",
        "source=live",
    ] {
        assert!(
            lines[2].contains(&format!(" {field}")),
            "{field}: {}",
            lines[2]
        );
    }
    for timed in ["seconds", "scan_seconds"] {
        let value = lines[2]
            .split(' ')
            .find_map(|pair| pair.strip_prefix(&format!("{timed}=")))
            .unwrap_or_else(|| panic!("no {timed}: {}", lines[2]));
        assert!(value.parse::<f64>().unwrap() >= 0.0, "{}", lines[2]);
    }

    // At the default level, nothing per scrape.
    let quiet = rig.start(&[]);
    quiet.scrape();
    assert!(collection_lines(&quiet.log()).is_empty(), "{}", quiet.log());

    // One look of check at a replayed snapshot: one line, with the scan it recorded.
    let snapshot = rig.dir.path().join("snapshot.json");
    let written = rig.run(&["snapshot", "-o", snapshot.to_str().unwrap()]);
    assert_eq!(written.status, Some(0), "{written:?}");
    let replayed = rig.run(&[
        "check",
        "--log.level",
        "debug",
        "--replay",
        snapshot.to_str().unwrap(),
    ]);
    let lines = collection_lines(&replayed.stderr);
    assert_eq!(lines.len(), 1, "{}", replayed.stderr);
    assert!(lines[0].contains(" holder_scan=replayed "), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("source=\"replay of {}\"", snapshot.display())),
        "{}",
        lines[0]
    );
}

/// Whether this machine has the IPv6 loopback address `::1`.
fn has_ipv6_loopback() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|interfaces| {
        interfaces
            .lines()
            .any(|line| line.starts_with("00000000000000000000000000000001 "))
    })
}

#[test]
fn port_alone_listens_on_ipv6_and_ipv4() {
    // `:PORT`, node_exporter's form: one port, answered on both families.
    assert!(
        has_ipv6_loopback(),
        "this machine has no IPv6 loopback (::1 is not in /proc/net/if_inet6): \
         the IPv6 half of --web.listen-address :PORT cannot be tested here"
    );
    let rig = Rig::new();
    let mut command = rig.command();
    command.args(["--web.listen-address", ":0"]);
    let exporter = start(command);
    assert_eq!(
        exporter.address.ip(),
        std::net::Ipv6Addr::UNSPECIFIED,
        "{}",
        exporter.log()
    );
    let port = exporter.address.port();
    for loopback in ["127.0.0.1", "::1"] {
        let address = std::net::SocketAddr::new(loopback.parse().unwrap(), port);
        let response = http(address, "GET", "/metrics", &[]);
        assert_eq!(response.status, 200, "{address}: {}", response.body);
        assert_eq!(
            Metrics::parse(&response.body).value("vram_nvml_up", &[]),
            1.0,
            "{address}"
        );
    }
    assert!(
        !exporter.log().contains("IPv4 interface only"),
        "{}",
        exporter.log()
    );
}

/// A field of `/proc/PID/limits`: the soft limit of the line that starts with `name`.
fn soft_limit(pid: u32, name: &str) -> f64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .unwrap();
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// The host's boot time, `btime` of `/proc/stat`.
fn boot_time() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let btime = stat.lines().find_map(|line| line.strip_prefix("btime "));
    btime.unwrap().trim().parse().unwrap()
}

#[test]
fn the_server_serves_its_own_process_series_and_textfile_does_not() {
    let rig = Rig::new();
    let exporter = rig.start(&[]);
    let pid = exporter.child.id();
    let metrics = exporter.scrape();
    assert_promtool_clean(&metrics.text);
    let value = |name: &str| metrics.value(name, &[]);
    assert!(
        metrics
            .text
            .contains("# TYPE process_cpu_seconds_total counter\n"),
        "{}",
        metrics.text
    );
    // The figures are the server's own, not the test's: its start time, its limit.
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let started = boot_time() + start_time_ticks(pid) as f64 / ticks_per_second;
    assert!(
        (value("process_start_time_seconds") - started).abs() < 0.011,
        "{} against {started}",
        value("process_start_time_seconds")
    );
    assert_eq!(value("process_max_fds"), soft_limit(pid, "Max open files"));
    let open = value("process_open_fds");
    assert!(open >= 3.0 && open <= value("process_max_fds"), "{open}");
    let resident = value("process_resident_memory_bytes");
    assert!(resident > 0.0, "{resident}");
    assert!(value("process_virtual_memory_bytes") >= resident);
    // CPU time only grows, and collecting costs some.
    let first_cpu = value("process_cpu_seconds_total");
    assert!(first_cpu >= 0.0);
    let mut later = exporter.scrape();
    wait_until("a scrape's CPU time shows", Duration::from_secs(20), || {
        later = exporter.scrape();
        later.value("process_cpu_seconds_total", &[]) > first_cpu
    });

    // A one-shot command's process is gone once its output is read: no such series.
    let output = rig.dir.path().join("vram.prom");
    let outcome = rig.run(&["textfile", "-o", output.to_str().unwrap()]);
    assert_eq!(outcome.status, Some(0), "{}", outcome.stderr);
    let written = std::fs::read_to_string(&output).unwrap();
    assert!(written.contains("vram_nvml_up 1"), "{written}");
    let own_process_series = written
        .lines()
        .filter(|line| line.starts_with("process_") || line.starts_with("# TYPE process_"))
        .count();
    assert_eq!(own_process_series, 0, "{written}");
}
