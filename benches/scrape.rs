//! The release binary against the fake NVML, measured from outside as Prometheus sees it:
//! scrape latency end to end, where the time of a scrape goes, steady memory and CPU
//! over 128,000 scrapes, the CPU cost of one scrape a second, and 64 concurrent
//! connections under `wrk` with one more connection a second beside them.
//!
//! `cargo bench --bench scrape` (the binary and the fake NVML are built with the release
//! settings). Without `--bench` (as `cargo test --benches` runs it) it only checks that
//! every scenario serves a correct body.
//!
//! The owners are real processes (model CUDA processes) holding a stand-in device file,
//! so every owner is live, nothing is orphaned, and the holder scan never runs: these
//! figures exclude it (see `benches/holders.rs` for the scan).
//!
//! Environment: `SCRAPE_SAMPLES` (scrapes timed per scenario, default 2000),
//! `SCRAPE_SOAK` (scrapes of the memory soak, default 128000) on `SCRAPE_SOAK_GPUS` GPUs
//! (default 1) with `SCRAPE_SOAK_OWNERS` owners (default 8, at most 64; the interval
//! section uses the same scenario), `SCRAPE_INTERVAL_SECONDS` (how long the interval
//! section scrapes once a second, and first idles, default 180),
//! `SCRAPE_WRK_SECONDS` (default 30), `SCRAPE_WRK_CONNECTIONS` (default 64),
//! `SCRAPE_WRK_BESIDE` (default 1: one more connection a second beside wrk's, as a
//! Prometheus server beside a load test; 0: wrk alone) and
//! `SCRAPE_BASELINE_BINARY` (an earlier build of the exporter: the wrk section then
//! measures it the same way, alternating with this build over two rounds, for a
//! before-and-after in one run; the targets and latency sections too). `SCRAPE_TARGET_SECONDS`
//! (default 20) is how long each wrk run of the targets section lasts. A positional
//! argument filters the sections by name: latency, breakdown, soak, interval, wrk,
//! targets.

// The integration tests' rig, fake NVML scenario and model owners. The bench uses a few of
// them; the tests use them all, and there the compiler finds any that nothing uses.
#[path = "../tests/integration/helpers/mod.rs"]
#[allow(dead_code, unused_imports)]
mod helpers;
// What the benches read from the environment.
mod settings;

use helpers::{exporter_binary, Exporter, Gpu, Gpus, Holder, Rig};
use settings::env_number;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vram_exporter::observe::procfs::{Memory, Placement, ProcRoot, Reader};

/// What each owner is charged, and the per-context overhead that no process is charged for
/// (below the default 16 MiB floor, so it is not called orphaned).
const CHARGED: u64 = 1 << 30;
const OVERHEAD: u64 = 9_240_576;
/// The most GPUs a scenario has; the rig brings four device files, we add the rest.
const MAX_GPUS: u32 = 8;
const MAX_OWNERS: usize = 64;
const SHAPES: [(u32, usize); 4] = [(1, 0), (1, 64), (8, 0), (8, 64)];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let measure = args.iter().any(|arg| arg == "--bench");
    let filters: Vec<&str> = args
        .iter()
        .filter(|arg| !arg.starts_with('-'))
        .map(String::as_str)
        .collect();
    let wanted = |section: &str| {
        filters.is_empty()
            || filters
                .iter()
                .any(|filter| format!("scrape/{section}").contains(filter))
    };
    if !["latency", "breakdown", "soak", "interval", "wrk", "targets"]
        .iter()
        .any(|section| wanted(section))
    {
        return;
    }

    let rig = Rig::new();
    for minor in 4..MAX_GPUS {
        // A page, as the rig gives its own nodes, so that the model owners can map it.
        fs::write(rig.device(minor), [0u8; 4096]).unwrap();
    }
    let mut owners = Owners::default();
    machine();

    let mut medians = Vec::new();
    if wanted("latency") {
        let samples = if measure {
            env_number("SCRAPE_SAMPLES", 2_000)
        } else {
            20
        };
        medians = latency(&rig, &mut owners, samples, measure);
    }
    if !measure {
        println!("scrape: smoke run passed (run `cargo bench --bench scrape` to measure)");
        return;
    }
    if wanted("breakdown") {
        breakdown(&rig, &mut owners, &medians);
    }
    // The soak and the interval sections share one scenario.
    let soak_gpus = env_number("SCRAPE_SOAK_GPUS", 1) as u32;
    let soak_owners = env_number("SCRAPE_SOAK_OWNERS", 8).min(MAX_OWNERS);
    if wanted("soak") {
        let pids = owners.pids(&rig, soak_gpus);
        let scrapes = env_number("SCRAPE_SOAK", 128_000);
        soak(&rig, soak_gpus, &pids[..soak_owners], scrapes);
    }
    if wanted("interval") {
        let pids = owners.pids(&rig, soak_gpus);
        let seconds = env_number("SCRAPE_INTERVAL_SECONDS", 180);
        interval(&rig, soak_gpus, &pids[..soak_owners], seconds);
    }
    if wanted("targets") {
        // Only the 8-GPU owners may run: the other sections' owners would hold contexts
        // NVML does not list, culprits of the orphan episode.
        owners.by_gpus.retain(|&gpus, _| gpus == MAX_GPUS);
        let baseline = std::env::var_os("SCRAPE_BASELINE_BINARY").map(std::path::PathBuf::from);
        let pids = owners.pids(&rig, MAX_GPUS);
        targets(
            &rig,
            &pids,
            baseline.as_deref(),
            env_number("SCRAPE_TARGET_SECONDS", 20),
        );
    }
    if wanted("wrk") {
        let seconds = env_number("SCRAPE_WRK_SECONDS", 30);
        let connections = env_number("SCRAPE_WRK_CONNECTIONS", 64);
        let beside = env_number("SCRAPE_WRK_BESIDE", 1) != 0;
        let pids = owners.pids(&rig, MAX_GPUS);
        let mut runs = Vec::new();
        match std::env::var_os("SCRAPE_BASELINE_BINARY") {
            // Two rounds, alternating, so that what else loads the machine falls on both.
            Some(baseline) => {
                let baseline = std::path::PathBuf::from(baseline);
                for _ in 0..2 {
                    runs.push(wrk(&rig, &pids, &baseline, seconds, connections, beside));
                    runs.push(wrk(
                        &rig,
                        &pids,
                        &exporter_binary(),
                        seconds,
                        connections,
                        beside,
                    ));
                }
            }
            None => runs.push(wrk(
                &rig,
                &pids,
                &exporter_binary(),
                seconds,
                connections,
                beside,
            )),
        }
        wrk_summary(&runs);
    }
}

/// The owners of each scenario: for `gpus` GPUs, 64 live model CUDA processes, owner k
/// holding GPU k % `gpus` (the verdict checks that an owner maps the GPU it is charged
/// on), started the first time a section needs them and ended with the bench.
#[derive(Default)]
struct Owners {
    by_gpus: std::collections::BTreeMap<u32, Vec<Holder>>,
}

impl Owners {
    fn pids(&mut self, rig: &Rig, gpus: u32) -> Vec<u32> {
        self.by_gpus
            .entry(gpus)
            .or_insert_with(|| {
                (0..MAX_OWNERS)
                    .map(|index| Holder::spawn(&rig.device(index as u32 % gpus)))
                    .collect()
            })
            .iter()
            .map(|owner| owner.pid)
            .collect()
    }
}

/// The machine the figures come from.
fn machine() {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let model = fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let processes = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
        })
        .count();
    println!("machine: {cores} cores, {model}; {processes} processes in /proc");
    println!("binary: {}", exporter_binary().display());
}

/// `gpus` GPUs with `owners` of `pids` spread over them round-robin, all live.
fn scenario(gpus: u32, pids: &[u32]) -> serde_json::Value {
    scenario_with_orphan(gpus, pids, None)
}

/// Like [`scenario`], with GPU 0 also charging `dead_owner`, when given, for memory.
fn scenario_with_orphan(gpus: u32, pids: &[u32], dead_owner: Option<u32>) -> serde_json::Value {
    let mut list = Gpus::new();
    for index in 0..gpus {
        let mine: Vec<u32> = pids
            .iter()
            .enumerate()
            .filter(|(owner, _)| *owner as u32 % gpus == index)
            .map(|(_, pid)| *pid)
            .collect();
        let mut used = (CHARGED + OVERHEAD) * mine.len() as u64;
        let mut gpu = Gpu::idle(index);
        for pid in mine {
            gpu = gpu.process(pid, Some(CHARGED));
        }
        if let (0, Some(dead_owner)) = (index, dead_owner) {
            used += CHARGED;
            gpu = gpu.process(dead_owner, Some(CHARGED));
        }
        gpu = gpu.used(used);
        list = list.gpu(gpu);
    }
    list.into_json()
}

fn start(rig: &Rig, gpus: u32, pids: &[u32]) -> Exporter {
    rig.write_scenario(&scenario(gpus, pids));
    rig.start(&[])
}

/// Like [`start`], with another build of the exporter (an earlier one, to compare).
fn start_binary(rig: &Rig, binary: &Path, gpus: u32, pids: &[u32]) -> Exporter {
    start_with(rig, binary, &scenario(gpus, pids))
}

/// `binary` serving the fake NVML's `scenario`.
fn start_with(rig: &Rig, binary: &Path, scenario: &serde_json::Value) -> Exporter {
    rig.write_scenario(scenario);
    let mut command = Command::new(binary);
    command
        .env("FAKE_NVML_SCENARIO", &rig.scenario)
        .arg("--nvml.library")
        .arg(&rig.library)
        .arg("--test.device-prefix")
        .arg(rig.device_prefix())
        .args(["--web.listen-address", "127.0.0.1:0"]);
    helpers::start(command)
}

/// One HTTP/1.1 connection kept alive across scrapes, as Prometheus keeps it.
struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    request: Vec<u8>,
}

impl Connection {
    fn open(address: SocketAddr) -> Connection {
        let stream = TcpStream::connect(address).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Connection {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::with_capacity(64 * 1024, stream),
            request: format!(
                "GET /metrics HTTP/1.1\r\nHost: {address}\r\nUser-Agent: Prometheus/3.0\r\n\
                 Accept: text/plain;version=0.0.4;q=0.9,*/*;q=0.1\r\n\r\n"
            )
            .into_bytes(),
        }
    }

    /// One scrape: request to last byte of the body.
    fn scrape(&mut self, body: &mut Vec<u8>) -> Duration {
        let started = Instant::now();
        self.writer.write_all(&self.request).unwrap();
        let mut line = String::new();
        let mut status = 0;
        let mut length = None;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("response head");
            if line == "\r\n" {
                break;
            }
            if status == 0 {
                status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            } else if let Some((key, value)) = line.split_once(':') {
                if key.eq_ignore_ascii_case("content-length") {
                    length = Some(value.trim().parse::<usize>().unwrap());
                }
            }
        }
        let length = length.expect("a Content-Length");
        body.resize(length, 0);
        self.reader.read_exact(body).expect("response body");
        let elapsed = started.elapsed();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(body));
        elapsed
    }
}

/// A new connection for one scrape, closed after it.
fn scrape_new_connection(address: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let mut raw = Vec::with_capacity(64 * 1024);
    stream.read_to_end(&mut raw).unwrap();
    let elapsed = started.elapsed();
    assert!(raw.starts_with(b"HTTP/1.1 200"));
    elapsed
}

/// The value of an unlabelled sample, or the sum of a family's samples whose labels contain `with`.
fn sample_sum(body: &str, name: &str, with: &str) -> f64 {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter(|line| line.contains(with))
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

/// A body must show `owners` running owners, nothing orphaned and no holder scan.
fn check_body(body: &str, gpus: u32, owners: usize) {
    assert_eq!(
        sample_sum(body, "vram_gpu_up", ""),
        f64::from(gpus),
        "{body}"
    );
    assert_eq!(
        sample_sum(body, "vram_owner_processes", "state=\"running\""),
        owners as f64,
        "{body}"
    );
    assert_eq!(sample_sum(body, "vram_owner_processes", ""), owners as f64);
    assert_eq!(sample_sum(body, "vram_orphaned_bytes", ""), 0.0, "{body}");
    assert_eq!(
        sample_sum(body, "vram_holder_scan_duration_seconds", ""),
        0.0
    );
}

/// The end-to-end median of a scenario, and the exporter's own figure for the same scrapes.
struct Latency {
    gpus: u32,
    owners: usize,
    median: Duration,
    inside: Duration,
}

struct Summary {
    median: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    mean: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let at = |fraction: f64| {
        samples[((samples.len() as f64 * fraction) as usize).min(samples.len() - 1)]
    };
    Summary {
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: *samples.last().unwrap(),
        mean: samples.iter().sum::<Duration>() / samples.len() as u32,
    }
}

fn micros(duration: Duration) -> String {
    format!("{:.0}", duration.as_secs_f64() * 1e6)
}

fn latency(rig: &Rig, all: &mut Owners, samples: usize, measure: bool) -> Vec<Latency> {
    let mut medians = Vec::new();
    let warm_up = if measure { 200 } else { 2 };
    println!("\n## scrape latency, keep-alive connection, request to last byte ({samples} scrapes per scenario, after {warm_up} warm-up)");
    // With a baseline build, each scenario runs it right before this build, so that both
    // see the same machine.
    let mut builds = vec![("this build", exporter_binary())];
    if let (true, Some(baseline)) = (measure, std::env::var_os("SCRAPE_BASELINE_BINARY")) {
        builds.insert(0, ("baseline", baseline.into()));
    }
    println!("| GPUs | owners | build | body bytes | median us | p90 us | p99 us | max us | mean us | in-exporter median us | new connection median us | new connection p99 us | bodies equal to the previous |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for ((gpus, owners), (build, binary)) in SHAPES
        .into_iter()
        .flat_map(|shape| builds.iter().map(move |build| (shape, build)))
    {
        let pids = all.pids(rig, gpus);
        let exporter = start_binary(rig, binary, gpus, &pids[..owners]);
        let mut connection = Connection::open(exporter.address);
        let mut body = Vec::new();
        for _ in 0..warm_up {
            connection.scrape(&mut body);
        }
        check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
        let mut timed = Vec::with_capacity(samples);
        let mut inside = Vec::with_capacity(samples);
        // A scrape must get a collection of its own: one that got the body of the
        // collection before it (the same bytes, scrape duration included) timed nothing.
        let mut previous = Vec::new();
        let mut shared = 0;
        for _ in 0..samples {
            timed.push(connection.scrape(&mut body));
            if body == previous {
                shared += 1;
            }
            previous.clone_from(&body);
            let text = std::str::from_utf8(&body).unwrap();
            inside.push(Duration::from_secs_f64(sample_sum(
                text,
                "vram_scrape_duration_seconds",
                "",
            )));
        }
        check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
        // Two collections can render the same bytes by chance (equal durations to the
        // nanosecond); a scrape joining a finished collection would show in half of them.
        assert!(
            shared * 100 < samples,
            "{shared} of {samples} scrapes got the previous scrape's body"
        );
        let fresh: Vec<Duration> = (0..samples.min(1_000))
            .map(|_| scrape_new_connection(exporter.address))
            .collect();
        let timed = summarize(timed);
        let inside = summarize(inside);
        let fresh = summarize(fresh);
        println!(
            "| {gpus} | {owners} | {build} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {shared} |",
            body.len(),
            micros(timed.median),
            micros(timed.p90),
            micros(timed.p99),
            micros(timed.max),
            micros(timed.mean),
            micros(inside.median),
            micros(fresh.median),
            micros(fresh.p99),
        );
        if *build == "this build" {
            medians.push(Latency {
                gpus,
                owners,
                median: timed.median,
                inside: inside.median,
            });
        }
        drop(exporter);
    }
    medians
}

/// Median of `runs` timings of `work`.
fn time_median(runs: usize, mut work: impl FnMut()) -> Duration {
    for _ in 0..runs / 10 {
        work();
    }
    let samples = (0..runs)
        .map(|_| {
            let started = Instant::now();
            work();
            started.elapsed()
        })
        .collect();
    summarize(samples).median
}

/// Real NVML's cost per GPU and scrape, measured on an H200 (docs: gpu-facts): about
/// 40 us of calls for memory, identity and the three process lists.
const REAL_NVML_PER_GPU: Duration = Duration::from_micros(40);

/// Where the time of a scrape goes, per scenario: the fake NVML answering the calls a
/// scrape makes, and the `/proc` lookups of the owners, each timed in this process; and
/// what a scrape would cost with real NVML instead of the fake.
fn breakdown(rig: &Rig, all: &mut Owners, latencies: &[Latency]) {
    const RUNS: usize = 500;
    println!("\n## where a scrape's time goes (medians; the parts timed in this process, {RUNS} runs each)");
    println!("| GPUs | owners | NVML calls | fake NVML answering them us | /proc lookups of the owners us | in-exporter (vram_scrape_duration_seconds) us | end to end us | end to end with real NVML (projected) us |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    // The fake NVML reads its scenario (and its call log) from the environment on every
    // call; no other thread of this process reads or writes the environment.
    std::env::set_var("FAKE_NVML_SCENARIO", &rig.scenario);
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(rig.library.as_os_str())
        .init()
        .expect("load the fake NVML");
    let calls = rig.dir.path().join("calls.log");
    let proc_root = ProcRoot {
        root: "/proc".into(),
        device_prefix: rig.device_prefix().into_os_string().into_encoded_bytes(),
    };
    for (gpus, owners) in SHAPES {
        let spawned = all.pids(rig, gpus);
        let pids = &spawned[..owners];
        rig.write_scenario(&scenario(gpus, pids));
        let _ = fs::remove_file(&calls);
        std::env::set_var("FAKE_NVML_CALL_LOG", &calls);
        read_like_a_scrape(&nvml);
        std::env::remove_var("FAKE_NVML_CALL_LOG");
        let nvml_calls = fs::read_to_string(&calls).unwrap().lines().count();
        let nvml_read = time_median(RUNS, || read_like_a_scrape(&nvml));
        // As a scrape does: each owner served from what an earlier scrape read, its stat
        // read again.
        let placement = Placement::locate(&proc_root);
        let first_look = Reader::new(&proc_root);
        let memory: Memory = pids
            .iter()
            .filter_map(|&pid| Some((pid, first_look.read_owner(pid, &[]).remember?)))
            .collect();
        let lookups = time_median(RUNS, || {
            let reader = Reader::with_memory(&proc_root, placement, &memory);
            for &pid in pids {
                let _ = std::hint::black_box(reader.read_owner(pid, &[]));
            }
        });
        let measured = latencies
            .iter()
            .find(|latency| (latency.gpus, latency.owners) == (gpus, owners));
        let projected = measured
            .map(|latency| (latency.median + REAL_NVML_PER_GPU * gpus).saturating_sub(nvml_read));
        println!(
            "| {gpus} | {owners} | {nvml_calls} | {} | {} | {} | {} | {} |",
            micros(nvml_read),
            micros(lookups),
            measured.map_or("-".into(), |latency| micros(latency.inside)),
            measured.map_or("-".into(), |latency| micros(latency.median)),
            projected.map_or("-".into(), micros),
        );
    }
    println!(
        "(the fake re-reads and parses its JSON scenario on every call; real NVML costs about {} us per GPU and scrape)",
        REAL_NVML_PER_GPU.as_micros()
    );
}

/// The NVML calls one scrape makes (through nvml-wrapper, as the exporter does): the
/// driver version, then per GPU its identity, memory and the three process lists.
fn read_like_a_scrape(nvml: &nvml_wrapper::Nvml) {
    let count = nvml.device_count().expect("device count");
    std::hint::black_box(nvml.sys_driver_version().ok());
    for index in 0..count {
        let device = nvml.device_by_index(index).expect("device");
        std::hint::black_box((
            device.uuid().ok(),
            device.name().ok(),
            device.pci_info().ok(),
            device.minor_number().ok(),
            device.memory_info().ok(),
            device.running_compute_processes().ok(),
            device.running_graphics_processes().ok(),
            device.mps_running_compute_processes().ok(),
        ));
        // What the driver says the GPU needs, and its MIG mode (the scrape also asks for
        // remapped rows through a raw call).
        std::hint::black_box((
            device.mig_mode().ok(),
            device
                .field_values_for(&[nvml_wrapper::structs::device::FieldId(
                    nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                )])
                .ok(),
            device.are_pages_pending_retired().ok(),
            device.numa_node_id().ok(),
        ));
    }
}

/// VmRSS and VmHWM in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn open_files(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
}

/// User plus system CPU time of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // After the command: state is field 3, utime field 14 and stime field 15.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / per_second
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn soak(rig: &Rig, gpus: u32, pids: &[u32], scrapes: usize) {
    let owners = pids.len();
    let exporter = start(rig, gpus, pids);
    let pid = exporter.child.id();
    std::thread::sleep(Duration::from_millis(200));
    let (started_rss, _) = memory_kib(pid);
    let mut connection = Connection::open(exporter.address);
    let mut body = Vec::new();
    connection.scrape(&mut body);
    check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
    let (first_rss, _) = memory_kib(pid);
    println!("\n## steady memory and CPU, {gpus} GPUs and {owners} owners, {scrapes} scrapes on one keep-alive connection");
    println!(
        "binary size: {} bytes ({:.1} MiB){}",
        fs::metadata(exporter_binary()).unwrap().len(),
        fs::metadata(exporter_binary()).unwrap().len() as f64 / 1048576.0,
        stripped_size(&exporter_binary())
            .map(|size| format!(
                "; stripped with `strip`: {size} bytes ({:.1} MiB)",
                size as f64 / 1048576.0
            ))
            .unwrap_or_default()
    );
    println!(
        "RSS after start: {} MiB; after the first scrape (NVML loaded): {} MiB",
        mib(started_rss),
        mib(first_rss)
    );
    println!("| scrapes | RSS MiB | peak RSS (VmHWM) MiB | open fds | threads |");
    println!("| --- | --- | --- | --- | --- |");
    let cpu_before = cpu_seconds(pid);
    let wall = Instant::now();
    // Sixteen rows: for 128,000 scrapes, every 8,000 (32,000, 64,000 and 128,000 among them).
    let step = (scrapes / 16).max(1);
    let mut done = 0;
    while done < scrapes {
        for _ in 0..step.min(scrapes - done) {
            connection.scrape(&mut body);
        }
        done += step.min(scrapes - done);
        let (rss, hwm) = memory_kib(pid);
        println!(
            "| {done} | {} | {} | {} | {} |",
            mib(rss),
            mib(hwm),
            open_files(pid),
            threads(pid)
        );
    }
    let wall = wall.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
    let per_scrape = cpu / scrapes as f64;
    println!(
        "CPU: {cpu:.2} s user+system over {scrapes} scrapes in {wall:.1} s: {:.0} us per scrape; \
         at one scrape a second: {:.2} CPU s per hour ({:.3}% of one core)",
        per_scrape * 1e6,
        per_scrape * 3600.0,
        per_scrape * 100.0
    );
}

fn stripped_size(binary: &Path) -> Option<u64> {
    let copy = std::env::temp_dir().join(format!("vram-exporter-stripped-{}", std::process::id()));
    let status = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(binary)
        .status()
        .ok()?;
    let size = fs::metadata(&copy).ok().map(|metadata| metadata.len());
    let _ = fs::remove_file(&copy);
    status.success().then_some(size).flatten()
}

/// CPU per scrape at one scrape a second, as Prometheus scrapes a node: the exporter idles
/// for `seconds`, then is scraped once a second on one keep-alive connection for
/// `seconds`; CPU (`utime + stime`) of each phase from `/proc/PID/stat`.
fn interval(rig: &Rig, gpus: u32, pids: &[u32], seconds: usize) {
    let owners = pids.len();
    let exporter = start(rig, gpus, pids);
    let pid = exporter.child.id();
    let mut connection = Connection::open(exporter.address);
    let mut body = Vec::new();
    // NVML loaded and the blocking thread started before anything is counted.
    for _ in 0..10 {
        connection.scrape(&mut body);
    }
    check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
    // The exporter closes a connection idle for 10 s; the scrapes get a new one.
    let with_connection = open_files(pid);
    drop(connection);
    wait_for_open_files(pid, with_connection - 1);
    let ticks_per_second = clock_ticks_per_second();
    let idle_before = cpu_seconds(pid);
    let threads_before = thread_ticks(pid);
    std::thread::sleep(Duration::from_secs(seconds as u64));
    let idle = cpu_seconds(pid) - idle_before;
    let idle_threads = thread_ticks(pid);
    let (rss_before, _) = memory_kib(pid);
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let mut connection = Connection::open(exporter.address);
    let mut inside = Vec::with_capacity(seconds);
    for tick in 0..seconds {
        // Paced by the clock, as Prometheus paces its scrapes; not a synchronisation.
        let next = started + Duration::from_secs(tick as u64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        connection.scrape(&mut body);
        inside.push(Duration::from_secs_f64(sample_sum(
            std::str::from_utf8(&body).unwrap(),
            "vram_scrape_duration_seconds",
            "",
        )));
    }
    std::thread::sleep(
        (started + Duration::from_secs(seconds as u64)).saturating_duration_since(Instant::now()),
    );
    let scraping = cpu_seconds(pid) - cpu_before;
    let (rss_after, _) = memory_kib(pid);
    check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
    let per_scrape = (scraping - idle).max(0.0) / seconds as f64;
    println!("\n## CPU at one scrape a second, {gpus} GPUs and {owners} owners, {seconds} s idle then {seconds} scrapes over {seconds} s");
    println!(
        "(CPU time is counted in clock ticks of {:.0} ms: each figure is within {:.0} ms of the truth)",
        1000.0 / ticks_per_second,
        1000.0 / ticks_per_second
    );
    println!("| phase | CPU s (user+system) | CPU per second of wall time | RSS MiB at its end |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| idle, {seconds} s | {idle:.2} | {:.3} ms | {} |",
        idle / seconds as f64 * 1e3,
        mib(rss_before)
    );
    println!(
        "| one scrape a second, {seconds} s | {scraping:.2} | {:.3} ms | {} |",
        scraping / seconds as f64 * 1e3,
        mib(rss_after)
    );
    let busy_while_idle: Vec<String> = idle_threads
        .iter()
        .map(|(tid, (name, ticks))| {
            let before = threads_before.get(tid).map_or(0, |(_, ticks)| *ticks);
            (name, ticks - before)
        })
        .filter(|(_, ticks)| *ticks > 0)
        .map(|(name, ticks)| format!("{name} {ticks}"))
        .collect();
    println!(
        "CPU ticks of each thread while idle (threads that ended are not listed): {}",
        if busy_while_idle.is_empty() {
            "none".to_string()
        } else {
            busy_while_idle.join(", ")
        }
    );
    println!(
        "CPU per scrape (scraping minus idle): {:.2} ms; at one scrape a second {:.2} CPU s per hour ({:.3}% of one core); \
         in-exporter scrape duration median {} us",
        per_scrape * 1e3,
        per_scrape * 3600.0,
        per_scrape * 100.0,
        micros(summarize(inside).median)
    );
}

/// Each thread of `pid`: its name and CPU ticks (user and system) so far.
fn thread_ticks(pid: u32) -> std::collections::BTreeMap<u32, (String, u64)> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let name = fs::read_to_string(task.path().join("comm")).ok()?;
            let stat = fs::read_to_string(task.path().join("stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
            let ticks = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
            Some((tid, (name.trim().to_string(), ticks)))
        })
        .collect()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// What one wrk run against one build gave.
struct WrkRun {
    label: String,
    requests: u64,
    per_second: f64,
    /// The exporter's CPU seconds (user and system) during the run.
    cpu: f64,
    /// connect, read, write, timeout, non-2xx.
    errors: [u64; 5],
    side: Vec<SideScrape>,
}

/// One scrape on a connection of its own, sent beside wrk's connections.
struct SideScrape {
    result: Result<(), String>,
    waited: Duration,
}

/// A new connection, one `GET /metrics`, `Connection: close`: what it got.
fn side_scrape(address: SocketAddr) -> SideScrape {
    let started = Instant::now();
    let result = (|| -> Result<(), String> {
        let mut stream =
            TcpStream::connect(address).map_err(|error| format!("connect: {error}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
            .write_all(
                format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .map_err(|error| format!("send: {error}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .map_err(|error| format!("read: {error}"))?;
        if raw.is_empty() {
            return Err("closed unanswered".into());
        }
        if !raw.starts_with(b"HTTP/1.1 200") {
            return Err(format!(
                "{:?}",
                String::from_utf8_lossy(&raw).lines().next()
            ));
        }
        Ok(())
    })();
    SideScrape {
        result,
        waited: started.elapsed(),
    }
}

/// The number after `key` in wrk's report, if the report has it.
fn wrk_number(report: &str, key: &str) -> Option<f64> {
    let rest = &report[report.find(key)? + key.len()..];
    let number: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().ok()
}

fn wrk(
    rig: &Rig,
    pids: &[u32],
    binary: &Path,
    seconds: usize,
    connections: usize,
    beside: bool,
) -> WrkRun {
    let (gpus, owners) = (MAX_GPUS, MAX_OWNERS);
    let wrk = helpers::require_tool("wrk", "wrk");
    let label = if binary == exporter_binary() {
        "this build".to_string()
    } else {
        "baseline (SCRAPE_BASELINE_BINARY)".to_string()
    };
    let exporter = start_binary(rig, binary, gpus, pids);
    let pid = exporter.child.id();
    let mut connection = Connection::open(exporter.address);
    let mut body = Vec::new();
    for _ in 0..100 {
        connection.scrape(&mut body);
    }
    let with_connection = open_files(pid);
    drop(connection);
    wait_for_open_files(pid, with_connection - 1);
    let (rss_before, _) = memory_kib(pid);
    let fds_before = open_files(pid);
    let threads_before = threads(pid);
    let cpu_before = cpu_seconds(pid);
    let mut run = Command::new(wrk)
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
        ])
        .arg(format!("http://{}/metrics", exporter.address))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run wrk");
    // RSS and descriptors while the load runs: they should level off, not climb. Once a
    // second, one more connection than wrk's, as a Prometheus server beside the load.
    let mut during = Vec::new();
    let mut side = Vec::new();
    let started = Instant::now();
    while run.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(100));
        let elapsed = started.elapsed().as_secs() as usize;
        if beside && elapsed >= 1 && elapsed > side.len() && elapsed < seconds {
            let address = exporter.address;
            side.push(std::thread::spawn(move || side_scrape(address)));
        }
        if elapsed / 5 > during.len() {
            let (rss, _) = memory_kib(pid);
            during.push((started.elapsed().as_secs(), rss, open_files(pid)));
        }
    }
    let output = run.wait_with_output().unwrap();
    let cpu = cpu_seconds(pid) - cpu_before;
    let side: Vec<SideScrape> = side
        .into_iter()
        .map(|scrape| scrape.join().unwrap())
        .collect();
    wait_for_open_files(pid, fds_before);
    let (rss_after, hwm) = memory_kib(pid);
    let fds_after = open_files(pid);
    let threads_after = threads(pid);
    let mut connection = Connection::open(exporter.address);
    connection.scrape(&mut body);
    check_body(std::str::from_utf8(&body).unwrap(), gpus, owners);
    assert!(
        output.status.success(),
        "wrk failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    println!(
        "\n## {label}: wrk -t2 -c{connections} -d{seconds}s --latency against /metrics, {gpus} GPUs and {owners} owners{}",
        if beside { ", plus one more connection a second" } else { "" }
    );
    println!("```");
    print!("{report}");
    println!("```");
    println!("exporter CPU during the run: {cpu:.1} s");
    println!("| when | RSS MiB | open fds | threads |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| before | {} | {fds_before} | {threads_before} |",
        mib(rss_before)
    );
    for (second, rss, fds) in during {
        println!("| at {second} s | {} | {fds} | |", mib(rss));
    }
    println!(
        "| after, once the connections closed | {} | {fds_after} | {threads_after} |",
        mib(rss_after)
    );
    println!(
        "peak RSS (VmHWM) over the exporter's life: {} MiB",
        mib(hwm)
    );
    // wrk prints these lines only when something went wrong.
    let socket_errors = report
        .lines()
        .find(|line| line.contains("Socket errors:"))
        .unwrap_or_default();
    let number = |text: &str, key: &str| wrk_number(text, key).unwrap_or(0.0) as u64;
    WrkRun {
        label,
        requests: report
            .split_once(" requests in ")
            .and_then(|(before, _)| before.split_whitespace().last())
            .and_then(|count| count.parse().ok())
            .unwrap_or(0),
        per_second: wrk_number(&report, "Requests/sec:").unwrap_or(0.0),
        cpu,
        errors: [
            number(socket_errors, "connect"),
            number(socket_errors, "read"),
            number(socket_errors, "write"),
            number(socket_errors, "timeout"),
            number(&report, "Non-2xx or 3xx responses:"),
        ],
        side,
    }
}

/// Wait until `pid` has at most `count` descriptors open (closed connections are let go).
fn wait_for_open_files(pid: u32, count: usize) {
    helpers::wait_until(
        "the exporter has closed the finished connections",
        Duration::from_secs(30),
        || open_files(pid) <= count,
    );
}

fn wrk_summary(runs: &[WrkRun]) {
    println!("\n## wrk, side by side");
    println!("| build | requests | requests/s | exporter CPU s | exporter CPU per request | socket errors: connect, read, write, timeout | non-2xx | connections beside wrk: answered 200 / sent | their failures | longest wait of one |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for run in runs {
        let answered = run
            .side
            .iter()
            .filter(|scrape| scrape.result.is_ok())
            .count();
        let mut failures: Vec<String> = run
            .side
            .iter()
            .filter_map(|scrape| scrape.result.clone().err())
            .collect();
        failures.sort();
        failures.dedup();
        let longest = run
            .side
            .iter()
            .map(|scrape| scrape.waited)
            .max()
            .unwrap_or_default();
        let [connect, read, write, timeout, non_2xx] = run.errors;
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.3} ms | {connect}, {read}, {write}, {timeout} | {non_2xx} | {answered} / {} | {} | {:.1} s |",
            run.label,
            run.requests,
            run.per_second,
            run.cpu,
            run.cpu / run.requests.max(1) as f64 * 1e3,
            run.side.len(),
            if failures.is_empty() { "none".to_string() } else { failures.join("; ") },
            longest.as_secs_f64(),
        );
    }
}

/// One wrk run of the targets section.
struct TargetRun {
    case: &'static str,
    label: String,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    requests: u64,
    in_exporter: Duration,
}

/// A latency of wrk's distribution (`50%  241.00us`) as a duration.
fn wrk_percentile(report: &str, percent: &str) -> Duration {
    let line = report
        .lines()
        .find(|line| line.trim_start().starts_with(percent))
        .unwrap_or_else(|| panic!("no {percent} line in wrk's report:\n{report}"));
    let value = line.split_whitespace().nth(1).unwrap();
    let (number, scale) = [("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(unit, scale)| value.strip_suffix(unit).map(|number| (number, *scale)))
        .unwrap();
    Duration::from_secs_f64(number.parse::<f64>().unwrap() * scale)
}

/// The scrape targets of docs/benchmarks.md, measured as they were set (`wrk`, one
/// connection, one thread): 8 GPUs with 8 live owners each, then the same during a fork-orphan episode (an owner
/// killed while its forked child keeps the device file, so every scrape scans for
/// holders). With a baseline, both builds alternate over two rounds.
fn targets(rig: &Rig, pids: &[u32], baseline: Option<&Path>, seconds: usize) {
    let wrk = helpers::require_tool("wrk", "wrk");
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let mut builds: Vec<(String, std::path::PathBuf)> = Vec::new();
    if let Some(baseline) = baseline {
        builds.push(("baseline (SCRAPE_BASELINE_BINARY)".into(), baseline.into()));
    }
    builds.push(("this build".into(), exporter_binary()));
    let live = scenario(MAX_GPUS, pids);
    let episode = scenario_with_orphan(MAX_GPUS, pids, Some(dead_owner));
    let mut runs = Vec::new();
    for _round in 0..2 {
        for (case, scenario) in [
            ("8 GPUs x 8 live owners", &live),
            ("the same during a fork-orphan episode", &episode),
        ] {
            for (label, binary) in &builds {
                let exporter = start_with(rig, binary, scenario);
                let mut connection = Connection::open(exporter.address);
                let mut body = Vec::new();
                for _ in 0..200 {
                    connection.scrape(&mut body);
                }
                let text = String::from_utf8(body.clone()).unwrap();
                let orphaned = sample_sum(&text, "vram_orphaned_bytes", "");
                if std::ptr::eq(scenario, &live) {
                    check_body(&text, MAX_GPUS, MAX_OWNERS);
                } else {
                    // Both builds see the orphan, and this one names the child holding it,
                    // the one culprit.
                    assert_eq!(orphaned, CHARGED as f64, "{text}");
                    if binary == &exporter_binary() {
                        assert_eq!(
                            sample_sum(&text, "vram_holder_processes", "role=\"culprit\""),
                            1.0,
                            "{text}"
                        );
                    }
                    if binary == &exporter_binary() {
                        assert!(text.contains(&format!("pid=\"{}\"", child.pid)), "{text}");
                    }
                }
                // The exporter's own duration of a scrape, the median of 200.
                let inside: Vec<Duration> = (0..200)
                    .map(|_| {
                        connection.scrape(&mut body);
                        let text = std::str::from_utf8(&body).unwrap();
                        Duration::from_secs_f64(sample_sum(
                            text,
                            "vram_scrape_duration_seconds",
                            "",
                        ))
                    })
                    .collect();
                drop(connection);
                let output = Command::new(&wrk)
                    .args(["-t1", "-c1", &format!("-d{seconds}s"), "--latency"])
                    .arg(format!("http://{}/metrics", exporter.address))
                    .output()
                    .expect("run wrk");
                assert!(output.status.success(), "wrk failed");
                let report = String::from_utf8_lossy(&output.stdout).into_owned();
                assert!(
                    !report.contains("Socket errors") && !report.contains("Non-2xx"),
                    "{report}"
                );
                runs.push(TargetRun {
                    case,
                    label: label.clone(),
                    p50: wrk_percentile(&report, "50%"),
                    p90: wrk_percentile(&report, "90%"),
                    p99: wrk_percentile(&report, "99%"),
                    requests: report
                        .split_once(" requests in ")
                        .and_then(|(before, _)| before.split_whitespace().last())
                        .and_then(|count| count.parse().ok())
                        .unwrap_or(0),
                    in_exporter: summarize(inside).median,
                });
            }
        }
    }
    println!("\n## targets: wrk -t1 -c1 -d{seconds}s --latency against /metrics (two rounds)");
    println!("| case | build | requests | p50 us | p90 us | p99 us | in-exporter median us |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for run in &runs {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            run.case,
            run.label,
            run.requests,
            micros(run.p50),
            micros(run.p90),
            micros(run.p99),
            micros(run.in_exporter),
        );
    }
    drop(child);
}
