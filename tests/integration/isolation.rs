//! One sick GPU never blinds the rest. A GPU whose NVML calls hang (fallen off the bus, a
//! wedged driver) is the fake NVML's `hangs` directive: the call blocks until a file
//! exists, so every hang here ends when the test says so. Real processes hold the device
//! files: a model CUDA owner on GPU 0, and on GPU 2 a fork orphan (the owner exited, its
//! forked child keeps the context) with that child, its culprit.

use crate::helpers::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const GPUS: u32 = 8;
/// The GPU with a live owner.
const OWNED: u32 = 0;
/// The GPU whose dead owner's memory a forked child still holds.
const ORPHANED: u32 = 2;
/// The GPU whose memory call hangs.
const HUNG: u32 = 5;
const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";
/// How long a scrape waits in these tests; NVML is waited for half of it.
const COLLECTION_TIMEOUT: &str = "4s";
const NVML_WAIT: Duration = Duration::from_secs(2);

/// Eight H200s: a live owner on GPU 0, a fork orphan on GPU 2 with its culprit, and
/// GPU 5, whose memory call hangs once the scenario says so.
struct SickHost {
    rig: Rig,
    /// The hung call returns once this file exists.
    hang_ends: PathBuf,
    owner: Holder,
    dead_owner: u32,
    culprit: Holder,
}

impl SickHost {
    fn new() -> SickHost {
        let rig = Rig::new().with_gpu_nodes(GPUS);
        let owner = Holder::spawn(&rig.device(OWNED));
        let (dead_owner, culprit) = Holder::fork_orphan(&rig.device(ORPHANED));
        let hang_ends = rig.dir.path().join("gpu-5-answers-again");
        let host = SickHost {
            rig,
            hang_ends,
            owner,
            dead_owner,
            culprit,
        };
        host.write(false);
        host
    }

    /// The scenario, with GPU 5's memory call hanging or not.
    fn write(&self, hung: bool) {
        let mut gpus = Gpus::new();
        for index in 0..GPUS {
            gpus = gpus.gpu(match index {
                OWNED => Gpu::one_owner(OWNED, self.owner.pid),
                ORPHANED => Gpu::one_owner(ORPHANED, self.dead_owner),
                HUNG if hung => Gpu::idle(HUNG).hang(MEMORY_CALL, &self.hang_ends),
                index => Gpu::idle(index),
            });
        }
        self.rig.write_scenario(&gpus.into_json());
    }

    /// The exporter on this host, logging the fake NVML's calls to `calls`.
    fn serve(&self, calls: &Path) -> Exporter {
        let mut command = self.rig.command();
        command.env("FAKE_NVML_CALL_LOG", calls).args([
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.collection-timeout",
            COLLECTION_TIMEOUT,
        ]);
        start(command)
    }
}

/// Every sample of a GPU other than `except`, by name and labels.
fn other_gpus(metrics: &Metrics, except: u32) -> BTreeMap<(String, Vec<(String, String)>), f64> {
    let except = except.to_string();
    metrics
        .samples
        .iter()
        .filter(|(_, labels, _)| labels.get("gpu").is_some_and(|gpu| *gpu != except))
        .map(|(name, labels, value)| {
            let labels = labels
                .iter()
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            ((name.clone(), labels), *value)
        })
        .collect()
}

/// How many times the fake NVML was asked `symbol`.
fn calls_of(log: &Path, symbol: &str) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == symbol)
        .count()
}

/// GPU 5 unreadable, with its reason.
fn assert_not_answering(metrics: &Metrics) {
    let gpu = HUNG.to_string();
    let gpu = gpu.as_str();
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", gpu)]), 0.0);
    for (error, expected) in [
        ("timeout", 1.0),
        ("gpu_lost", 0.0),
        ("reset_required", 0.0),
        ("not_supported", 0.0),
        ("no_permission", 0.0),
        ("unknown", 0.0),
    ] {
        let labels = [("gpu", gpu), ("error", error)];
        assert_eq!(
            metrics.value("vram_gpu_error", &labels),
            expected,
            "{error}"
        );
    }
    // It keeps the identity it had: its labels do not change while it hangs.
    let uuid = Gpu::uuid(HUNG);
    let info = [
        ("gpu", gpu),
        ("uuid", uuid.as_str()),
        ("name", "NVIDIA H200"),
    ];
    assert_eq!(metrics.value("vram_gpu_info", &info), 1.0);
    assert!(metrics.find("vram_used_bytes", &[("gpu", gpu)]).is_empty());
    assert!(metrics
        .find("vram_orphaned_bytes", &[("gpu", gpu)])
        .is_empty());
}

#[test]
fn one_hung_gpu_of_eight_leaves_the_other_seven_exact_and_the_threads_flat() {
    let host = SickHost::new();
    let calls = host.rig.dir.path().join("calls.log");
    let exporter = host.serve(&calls);
    // The baseline, once the Xid thread watches every GPU (it registers them on its own).
    let mut healthy = exporter.scrape();
    wait_until(
        "every GPU's Xid events are watched",
        Duration::from_secs(10),
        || {
            healthy = exporter.scrape();
            healthy
                .find("vram_xid_watched", &[])
                .iter()
                .filter(|(_, _, watched)| *watched == 1.0)
                .count()
                == GPUS as usize
        },
    );
    let culprit = host.culprit.pid.to_string();
    let orphaned_gpu = ORPHANED.to_string();
    let culprit_labels = [("gpu", orphaned_gpu.as_str()), ("pid", culprit.as_str())];
    assert_eq!(healthy.value("vram_holder_info", &culprit_labels), 1.0);
    assert_eq!(healthy.value("vram_gpu_up", &[("gpu", "5")]), 1.0);

    // GPU 5 starts to hang in its memory call.
    host.write(true);
    let started = Instant::now();
    let response = exporter.get("/metrics");
    let took = started.elapsed();
    // A collection that outlived the scrape's wait would be answered 503.
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        took >= NVML_WAIT,
        "the scrape waited for GPU 5 only {took:?}"
    );
    let sick = Metrics::parse(&response.body);
    assert_not_answering(&sick);
    let stuck_labels = [("gpu", "5"), ("call", MEMORY_CALL)];
    let stuck = sick.value("vram_gpu_stuck_seconds", &stuck_labels);
    assert!(stuck >= 1.5, "stuck {stuck} s");
    // The seven others exactly as on the healthy host: memory, owners, the orphan and its
    // culprit, everything.
    assert_eq!(other_gpus(&sick, HUNG), other_gpus(&healthy, HUNG));
    assert_eq!(
        sick.value(
            "vram_orphaned_bytes",
            &[("gpu", "2"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_eq!(sick.value("vram_holder_info", &culprit_labels), 1.0);
    assert_eq!(sick.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(sick.value("vram_holder_scan_complete", &[]), 1.0);
    assert_promtool_clean(&response.body);

    // 100 scrapes while it hangs: none waits for GPU 5 again, none asks it anything (each
    // of the seven others is asked its memory once a scrape), and no thread is added.
    let pid = exporter.child.id();
    let threads_before = thread_count(pid);
    let memory_calls_before = calls_of(&calls, MEMORY_CALL);
    let mut threads = Vec::new();
    let mut last_stuck = stuck;
    let hundred = Instant::now();
    for _ in 0..100 {
        let metrics = exporter.scrape();
        assert_not_answering(&metrics);
        let now_stuck = metrics.value("vram_gpu_stuck_seconds", &stuck_labels);
        assert!(now_stuck >= last_stuck, "the same call, stuck longer");
        last_stuck = now_stuck;
        threads.push(thread_count(pid));
    }
    assert_eq!(
        calls_of(&calls, MEMORY_CALL) - memory_calls_before,
        7 * 100,
        "GPU 5 was asked again while its call hung"
    );
    // Flat: a thread per stuck call would add one a scrape. The one leeway is tokio's
    // blocking pool (at most 4 threads, `src/web/server.rs`), which starts another thread
    // for a collection when a scrape arrives before the previous collection's thread is
    // back in the pool, and keeps it 10 s; on a busy machine that may happen twice.
    let most = threads.iter().copied().max().unwrap();
    assert!(
        most <= threads_before + 2,
        "threads before: {threads_before}, after each scrape: {threads:?}"
    );
    assert!(
        hundred.elapsed() < NVML_WAIT * 50,
        "100 scrapes took {:?}: later scrapes waited for the hung GPU",
        hundred.elapsed()
    );

    // The hang ends: the stuck call returns, and GPU 5's reader goes on with its process
    // lists (no scrape runs meanwhile, so that call is GPU 5's).
    let logged = fs::read_to_string(&calls).unwrap().len();
    fs::write(&host.hang_ends, "").unwrap();
    wait_until(
        "GPU 5's reader is past the call that hung",
        Duration::from_secs(10),
        || {
            fs::read_to_string(&calls).unwrap()[logged..]
                .lines()
                .any(|line| line == "nvmlDeviceGetComputeRunningProcesses_v3")
        },
    );
    // Reported again within two scrapes (this one already).
    let back = exporter.scrape();
    assert_eq!(back.value("vram_gpu_up", &[("gpu", "5")]), 1.0);
    assert_eq!(
        back.value("vram_gpu_error", &[("gpu", "5"), ("error", "timeout")]),
        0.0
    );
    assert!(back.find("vram_gpu_stuck_seconds", &[]).is_empty());
    assert_eq!(other_gpus(&back, HUNG), other_gpus(&healthy, HUNG));
    let log = exporter.log();
    assert_eq!(
        log.matches("GPU does not answer NVML").count(),
        1,
        "logged once:\n{log}"
    );
    assert!(log.contains("GPU answers NVML again"), "{log}");
}

#[test]
fn check_exits_3_within_its_timeout_naming_the_hung_gpu_and_the_other_gpus_culprit() {
    let host = SickHost::new();
    host.write(true);
    let started = Instant::now();
    let check = host.rig.spawn(&["check", "--timeout", "6s"]);
    // While it waits, it says for what, on stderr.
    wait_until(
        "check says what it waits for",
        Duration::from_secs(10),
        || {
            check
                .stderr()
                .contains("waiting for GPU 5 (in nvmlDeviceGetMemoryInfo_v2 for ")
        },
    );
    let outcome = check.finish(Duration::from_secs(20));
    let took = started.elapsed();
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(took < Duration::from_secs(6 + 3), "check took {took:?}");
    let hung = outcome
        .stdout
        .lines()
        .find(|line| line.starts_with("GPU 5 does not answer NVML"))
        .unwrap_or_else(|| panic!("no verdict for GPU 5:\n{}", outcome.stdout));
    assert!(
        hung.starts_with("GPU 5 does not answer NVML (stuck ")
            && hung.ends_with(" s in nvmlDeviceGetMemoryInfo_v2): cannot tell."),
        "{hung}"
    );
    // The other GPUs are judged as usual: the orphan's culprit is named, with the kill.
    let orphan = verdict_line(&outcome.stdout, ORPHANED);
    let held = format!(
        "GPU 2: 8.6 GiB (8,802 MiB) held for exited PID {}; still held by PID {} (dataloader, ",
        host.dead_owner, host.culprit.pid
    );
    assert!(orphan.starts_with(&held), "{orphan}");
    let kill = format!(
        "\n  suggested: kill {0}   # {0} is dataloader",
        host.culprit.pid
    );
    assert!(outcome.stdout.contains(&kill), "{}", outcome.stdout);
    assert!(verdict_line(&outcome.stdout, OWNED).contains("owned by 1 live process"));
    assert_eq!(
        verdict_line(&outcome.stdout, 7),
        "GPU 7: idle; nothing orphaned."
    );
    assert!(
        outcome
            .stdout
            .ends_with("\nexit status 3: cannot tell: some memory cannot be judged\n"),
        "{}",
        outcome.stdout
    );

    // --json: the same.
    let outcome = host.rig.run(&["check", "--json", "--timeout", "4s"]);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    let document = outcome.json();
    assert_eq!(document["status"], "not_answering");
    let hung = &document["gpus"][HUNG as usize];
    assert_eq!(hung["status"], "not_answering");
    assert_eq!(hung["error"], "timeout");
    assert_eq!(hung["memory"], json!(null));
    assert_eq!(hung["not_answering"]["call"], MEMORY_CALL);
    assert!(hung["not_answering"]["stuck_seconds"].as_f64().unwrap() >= 1.5);
    assert!(hung["verdict"]["sentence"]
        .as_str()
        .unwrap()
        .starts_with("GPU 5 does not answer NVML (stuck "));
    let orphan = &document["gpus"][ORPHANED as usize];
    assert_eq!(orphan["status"], "orphaned");
    assert_eq!(orphan["culprits"][0]["pid"], host.culprit.pid);
    assert_eq!(orphan["orphaned_bytes"], CHARGED);
}

#[test]
fn check_wait_during_a_hang_ends_at_its_limit() {
    let host = SickHost::new();
    host.write(true);
    let started = Instant::now();
    // The first look waits for GPU 5 for half of --timeout; the looks after it report
    // GPU 5 at once, and the wait ends when its time is up, with the orphan still there.
    let outcome = host.rig.run(&["check", "--wait", "2s", "--timeout", "4s"]);
    let took = started.elapsed();
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stderr.contains("8.6 GiB still orphaned after 2."),
        "{}",
        outcome.stderr
    );
    assert!(took >= Duration::from_secs(2), "{took:?}");
    // GPU 5 still hangs (its file was never written): the wait ended on its own.
    assert!(!host.hang_ends.exists());
    assert!(
        outcome
            .stdout
            .contains("\nGPU 5 does not answer NVML (stuck "),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stdout
            .ends_with("\nexit status 3: cannot tell: some memory cannot be judged\n"),
        "{}",
        outcome.stdout
    );
}

#[test]
fn snapshot_and_textfile_are_written_during_a_hang_and_exit_3() {
    let host = SickHost::new();
    host.write(true);
    // `snapshot` or `textfile` writing `file`, waiting 2 s.
    let write = |mode: &str, file: &Path| {
        let file = file.to_str().unwrap();
        host.rig.run(&[mode, "-o", file, "--timeout", "2s"])
    };
    let snapshot = host.rig.dir.path().join("snapshot.json");
    let outcome = write("snapshot", &snapshot);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .starts_with("vram-exporter: GPU 5 does not answer NVML (stuck ")
            && outcome
                .stderr
                .ends_with(" s in nvmlDeviceGetMemoryInfo_v2); the snapshot says so\n"),
        "{}",
        outcome.stderr
    );
    let written: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&snapshot).unwrap()).unwrap();
    let gpu = &written["observation"]["nvml"]["gpus"][HUNG as usize];
    assert_eq!(gpu["state"]["status"], "not_answering");
    assert_eq!(gpu["state"]["call"], MEMORY_CALL);
    assert_eq!(gpu["uuid"], Gpu::uuid(HUNG));
    // It replays to the same verdict elsewhere.
    let replayed = host
        .rig
        .run(&["check", "--replay", snapshot.to_str().unwrap()]);
    assert_eq!(replayed.status, Some(3), "{replayed:?}");
    assert!(replayed
        .stdout
        .contains("\nGPU 5 does not answer NVML (stuck "));

    let textfile = host.rig.dir.path().join("vram.prom");
    let outcome = write("textfile", &textfile);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stderr.ends_with("; the metrics say so\n"),
        "{}",
        outcome.stderr
    );
    let metrics = Metrics::parse(&fs::read_to_string(&textfile).unwrap());
    assert_not_answering(&metrics);
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "2"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
}

#[test]
fn sigterm_during_a_hang_exits_within_the_grace() {
    let host = SickHost::new();
    host.write(true);
    let calls = host.rig.dir.path().join("calls.log");
    let exporter = host.serve(&calls);
    // A scrape in flight, waiting for the hung GPU, when SIGTERM comes.
    let address = exporter.address;
    let scrape = std::thread::spawn(move || http(address, "GET", "/metrics", &[]));
    wait_until(
        "the scrape has asked GPU 5 for its memory",
        Duration::from_secs(10),
        || calls_of(&calls, MEMORY_CALL) >= GPUS as usize,
    );
    let started = Instant::now();
    signal(exporter.child.id(), libc::SIGTERM);
    let status = exporter.wait_for_exit();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    // Open requests get 10 s to finish (README, HTTP endpoints); the runtime 1 s more.
    assert!(took < Duration::from_secs(11), "exited after {took:?}");
    // The scrape in flight was answered before the exporter exited.
    let response = scrape.join().unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert_not_answering(&Metrics::parse(&response.body));
}

#[test]
fn nvml_missing_is_logged_at_start_and_every_command_answers_as_its_help_says() {
    let rig = Rig::new();
    let missing = rig.dir.path().join("nowhere/libnvidia-ml.so.1");
    let mut command = std::process::Command::new(exporter_binary());
    command
        .env("FAKE_NVML_SCENARIO", &rig.scenario)
        .arg("--nvml.library")
        .arg(&missing)
        .args(["--web.listen-address", "127.0.0.1:0"]);
    let exporter = start(command);
    // Said at start, before any scrape.
    wait_until(
        "the exporter logs that NVML is missing",
        Duration::from_secs(10),
        || exporter.log().contains("cannot load NVML"),
    );
    // Ready: /metrics answers, and says why nothing is observed.
    assert_eq!(exporter.get("/-/ready").status, 200);
    assert_eq!(exporter.get("/-/healthy").status, 200);
    let response = exporter.get("/metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    let metrics = Metrics::parse(&response.body);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
    assert_eq!(
        metrics.value("vram_nvml_error", &[("error", "missing")]),
        1.0
    );
    assert_eq!(
        metrics.value("vram_nvml_error", &[("error", "not_answering")]),
        0.0
    );
    assert_eq!(metrics.find("vram_build_info", &[]).len(), 1);
    assert!(metrics.has("vram_scrape_duration_seconds"));
    assert!(!metrics.has("vram_gpu_up"));
    assert_promtool_clean(&response.body);
    // Logged once, not once a scrape.
    exporter.scrape();
    let log = exporter.log();
    let said = log.lines().filter(|line| line.contains("cannot load NVML"));
    assert_eq!(said.count(), 1, "{log}");

    // snapshot and textfile write their file, saying so, and exit 2 as their help says.
    let snapshot = rig.dir.path().join("snapshot.json");
    let outcome = rig.run(&[
        "snapshot",
        "-o",
        snapshot.to_str().unwrap(),
        "--nvml.library",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .starts_with("vram-exporter: NVML is not available: cannot load NVML from ")
            && outcome.stderr.ends_with("; the snapshot says so\n")
            && outcome.stderr.lines().count() == 1,
        "{}",
        outcome.stderr
    );
    let written: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&snapshot).unwrap()).unwrap();
    assert_eq!(written["observation"]["nvml"]["status"], "down");
    assert_eq!(written["observation"]["nvml"]["reason"], "missing");

    let textfile = rig.dir.path().join("vram.prom");
    let outcome = rig.run(&[
        "textfile",
        "-o",
        textfile.to_str().unwrap(),
        "--nvml.library",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(outcome.status, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.ends_with("; the metrics say so\n"),
        "{}",
        outcome.stderr
    );
    let metrics = Metrics::parse(&fs::read_to_string(&textfile).unwrap());
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
    assert_eq!(
        metrics.value("vram_nvml_error", &[("error", "missing")]),
        1.0
    );
    // The help says what these statuses mean.
    for mode in ["snapshot", "textfile"] {
        let help = rig.run(&[mode, "--help"]).stdout;
        assert!(help.contains("\n  0  written\n"), "{help}");
        assert!(
            help.contains("\n  2  error: a bad flag, a file that cannot be written; or NVML missing (the file is still written, and says so)\n"),
            "{help}"
        );
        assert!(
            help.contains("\n  3  written, but NVML, a GPU or a /proc read did not answer within --timeout (the file says which)"),
            "{help}"
        );
    }
}

#[test]
fn nvml_whose_init_hangs_is_served_as_not_answering_until_it_returns() {
    let rig = Rig::new();
    let init_ends = rig.dir.path().join("init-returns");
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0))
            .hang("nvmlInit_v2", &init_ends)
            .into_json(),
    );
    // A wait long enough that a scrape which wrongly waits for NVML again (4 s, half of
    // it) stands well apart from one that does not, on a loaded machine too.
    let exporter = rig.start(&["--web.collection-timeout", "8s"]);
    let response = exporter.get("/metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    let metrics = Metrics::parse(&response.body);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 0.0);
    assert_eq!(
        metrics.value("vram_nvml_error", &[("error", "not_answering")]),
        1.0
    );
    let stuck = metrics.value("vram_nvml_stuck_seconds", &[("call", "nvmlInit_v2")]);
    assert!(stuck >= 1.0, "stuck {stuck} s");
    assert_promtool_clean(&response.body);
    // Later scrapes do not wait for it.
    let started = Instant::now();
    assert_eq!(exporter.scrape().value("vram_nvml_up", &[]), 0.0);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );

    // A one-shot look says so too, and exits 3 within its timeout.
    let outcome = rig.run(&["check", "--timeout", "2s"]);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stdout.starts_with("NVML does not answer (stuck ")
            && outcome
                .stdout
                .contains(" s in nvmlInit_v2): cannot tell.\n"),
        "{}",
        outcome.stdout
    );

    // Once init returns, NVML is read again.
    fs::write(&init_ends, "").unwrap();
    wait_until("NVML answers again", Duration::from_secs(20), || {
        exporter.scrape().value("vram_nvml_up", &[]) == 1.0
    });
    let metrics = exporter.scrape();
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "0")]), 1.0);
    assert!(exporter.log().contains("NVML answers again"));
}

#[test]
fn a_proc_read_that_blocks_leaves_the_scan_incomplete_and_stalls_nothing() {
    let rig = Rig::new();
    let dead_owner = nonexistent_pid();
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let blocking = rig.procfs_whose_maps_block(4242, &rig.device(0));
    let procfs = &blocking.procfs;
    let exporter = rig.start(&[
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs.to_str().unwrap(),
        // Long enough that a scrape which wrongly waits for the scan again (6.8 s, 85 %
        // of it) stands well apart from one that does not.
        "--web.collection-timeout",
        "8s",
        "--holders.scan-timeout",
        "30s",
    ]);
    // The orphan sends the scan to the holder's maps, where it blocks: the scrape is still
    // answered in time, the orphan served, the scan incomplete and the read reported.
    let response = exporter.get("/metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    let first = Metrics::parse(&response.body);
    assert_eq!(
        first.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_eq!(first.value("vram_holder_scan_complete", &[]), 0.0);
    assert!(first.value("vram_procfs_stuck_seconds", &[]) > 0.0);
    assert!(first.find("vram_holder_info", &[]).is_empty());
    assert_promtool_clean(&response.body);
    // The next scrape starts no second reader: the owners it cannot read are unknown,
    // so nothing is called orphaned, and it answers at once.
    let started = Instant::now();
    let second = exporter.scrape();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        second.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "unknown")]
        ),
        1.0
    );
    assert_eq!(
        second.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        0.0
    );
    assert!(second.value("vram_procfs_stuck_seconds", &[]) > 0.0);
    // check says why it cannot name the holder.
    let outcome = rig.run(&[
        "check",
        "--json",
        "--timeout",
        "2s",
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs.to_str().unwrap(),
    ]);
    let document = outcome.json();
    assert!(
        document["holder_scan"]["blocked_seconds"].is_u64(),
        "{document}"
    );
    assert_eq!(document["gpus"][0]["remedy"]["action"], "cannot_tell");
    assert_eq!(
        document["gpus"][0]["remedy"]["reason"]["why"],
        "scan_blocked"
    );

    // The read returns, with the maps of a context on GPU 0.
    blocking.unblock(&format!(
        "7f10a4000000-7f10a4001000 rw-s 00000000 00:05 1071 {}\n",
        rig.device(0).display()
    ));
    wait_until("the /proc reader is back", Duration::from_secs(20), || {
        let metrics = exporter.scrape();
        metrics.value("vram_procfs_stuck_seconds", &[]) == 0.0
            && metrics.value("vram_holder_scan_complete", &[]) == 1.0
            && !metrics
                .find("vram_holder_info", &[("pid", "4242")])
                .is_empty()
    });
}

#[test]
fn a_gpu_hung_in_a_process_list_is_reported_in_that_list() {
    // The process lists are read through NVML's raw calls, one call each into a kept
    // buffer; each is named before it is made, so a hang in one says which.
    let rig = Rig::new();
    let hang_ends = rig.dir.path().join("the-lists-answer-again");
    let lists = [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    ];
    let mut gpus = Gpus::new();
    for (index, list) in (0..).zip(lists) {
        gpus = gpus.gpu(Gpu::idle(index).hang(list, &hang_ends));
    }
    rig.write_scenario(&gpus.into_json());
    let outcome = rig.run(&["check", "--json", "--timeout", "3s"]);
    fs::write(&hang_ends, "").unwrap();
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    let document = outcome.json();
    for (index, list) in lists.iter().enumerate() {
        let gpu = &document["gpus"][index];
        assert_eq!(gpu["status"], "not_answering", "{gpu}");
        assert_eq!(gpu["not_answering"]["call"], *list, "{gpu}");
    }
}
