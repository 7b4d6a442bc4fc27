//! Eight GPUs on a slow driver, read side by side (what the exporter does: a reader thread
//! per GPU) and one after another (the hidden `--test.nvml-one-gpu-at-a-time`), by two
//! exporters of the same build scraped in turn, so both see the same machine; then the
//! scrape latency while one GPU hangs, and the exporter's threads over 100 scrapes of the
//! hang.
//!
//! `cargo bench --bench gpus` (the binary and the fake NVML are built with the release
//! settings). Without `--bench` (as `cargo test --benches` runs it) it only checks that
//! every section serves a correct body.
//!
//! The driver is the fake NVML with every call taking `GPUS_CALL_MS` (default 2 ms; an
//! H200 answers most calls in 0.08 ms, a busy or older driver in milliseconds); each GPU
//! has one live owner (a model CUDA process), so its process lists are not empty.
//! Environment: `GPUS_SAMPLES` (scrapes timed per exporter, default 200),
//! `GPUS_CALL_MS`, `GPUS_HANG_SCRAPES` (scrapes timed during the hang, default 100).

// The integration tests' rig, fake NVML scenario and model owners.
use test_helpers as helpers;
// What the benches read from the environment.
mod settings;

use helpers::{exporter_binary, start, thread_count, Exporter, Gpu, Gpus, Holder, Metrics, Rig};
use settings::env_number;
use std::fs;
use std::time::{Duration, Instant};

const GPUS: u32 = 8;
/// The GPU that hangs in the last section.
const HUNG: u32 = 5;
const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";

fn main() {
    let measure = std::env::args().any(|arg| arg == "--bench");
    let samples = if measure {
        env_number("GPUS_SAMPLES", 200)
    } else {
        3
    };
    let hang_scrapes = if measure {
        env_number("GPUS_HANG_SCRAPES", 100)
    } else {
        3
    };
    let call_ms = env_number("GPUS_CALL_MS", 2) as u64;

    let rig = Rig::new().with_gpu_nodes(GPUS);
    let owners: Vec<Holder> = (0..GPUS)
        .map(|minor| Holder::spawn(&rig.device(minor)))
        .collect();
    let scenario = |hang: Option<&std::path::Path>, call_ms: u64| {
        let mut gpus = Gpus::new();
        for (index, owner) in (0..GPUS).zip(&owners) {
            let mut gpu = Gpu::one_owner(index, owner.pid);
            if let (true, Some(until)) = (index == HUNG, hang) {
                gpu = gpu.hang(MEMORY_CALL, until);
            }
            gpus = gpus.gpu(gpu);
        }
        let mut scenario = gpus.into_json();
        // A slow driver: every NVML call sleeps `call_ms` first.
        scenario["delays_ms"]["*"] = serde_json::json!(call_ms);
        scenario
    };
    println!(
        "machine: {} cores; binary {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        exporter_binary().display()
    );

    // Side by side and one after another, scraped in turn.
    rig.write_scenario(&scenario(None, call_ms));
    let side_by_side = serve(&rig, &[]);
    let one_at_a_time = serve(&rig, &["--test.nvml-one-gpu-at-a-time"]);
    for exporter in [&side_by_side, &one_at_a_time] {
        check(&exporter.scrape());
    }
    let (mut parallel, mut serial) = (Vec::new(), Vec::new());
    let (mut parallel_own, mut serial_own) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let (took, own) = timed_scrape(&side_by_side);
        parallel.push(took);
        parallel_own.push(own);
        let (took, own) = timed_scrape(&one_at_a_time);
        serial.push(took);
        serial_own.push(own);
    }
    drop((side_by_side, one_at_a_time));
    println!("\n{GPUS} GPUs, every NVML call {call_ms} ms, one owner per GPU, {samples} scrapes each, in turn:\n");
    println!("| GPUs read | scrape p50 | p90 | max | vram_scrape_duration_seconds p50 |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, took, own) in [
        ("side by side (the exporter)", parallel, parallel_own),
        ("one after another", serial, serial_own),
    ] {
        let took = summarize(took);
        let own = summarize(own);
        println!(
            "| {name} | {} | {} | {} | {} |",
            millis(took.p50),
            millis(took.p90),
            millis(took.max),
            millis(own.p50)
        );
    }

    // One GPU hangs, at the driver's own speed otherwise: the scrape that finds it waits
    // for it half of --web.collection-timeout, the later ones not at all.
    let hang_ends = rig.dir.path().join("gpu-5-answers-again");
    rig.write_scenario(&scenario(None, 0));
    let exporter = serve(&rig, &["--web.collection-timeout", "10s"]);
    check(&exporter.scrape());
    let mut healthy = Vec::new();
    for _ in 0..hang_scrapes {
        healthy.push(timed_scrape(&exporter).0);
    }
    rig.write_scenario(&scenario(Some(&hang_ends), 0));
    let started = Instant::now();
    let first = exporter.scrape();
    let first_took = started.elapsed();
    assert_eq!(first.value("vram_gpu_up", &[("gpu", "5")]), 0.0);
    let pid = exporter.child.id();
    let threads_before = thread_count(pid);
    let mut during = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..hang_scrapes {
        during.push(timed_scrape(&exporter).0);
        threads.push(thread_count(pid));
    }
    fs::write(&hang_ends, "").unwrap();
    let healthy = summarize(healthy);
    let during = summarize(during);
    println!("\n{GPUS} GPUs, one owner each, the driver at the fake's own speed; GPU {HUNG} hangs in {MEMORY_CALL} (--web.collection-timeout 10s):\n");
    println!("| scrape | p50 | p90 | max |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| healthy, {hang_scrapes} scrapes | {} | {} | {} |",
        millis(healthy.p50),
        millis(healthy.p90),
        millis(healthy.max)
    );
    println!(
        "| the first after the hang began | {} | | |",
        millis(first_took)
    );
    println!(
        "| the next {hang_scrapes}, during the hang | {} | {} | {} |",
        millis(during.p50),
        millis(during.p90),
        millis(during.max)
    );
    println!(
        "\nthreads of the exporter: {threads_before} after the first scrape of the hang, {}..{} over the next {hang_scrapes}",
        threads.iter().min().unwrap(),
        threads.iter().max().unwrap()
    );
    drop(owners);
}

fn serve(rig: &Rig, extra: &[&str]) -> Exporter {
    let mut command = rig.command();
    command
        .args(["--web.listen-address", "127.0.0.1:0"])
        .args(extra);
    start(command)
}

/// A scrape's time from outside, and what the exporter measured of it.
fn timed_scrape(exporter: &Exporter) -> (Duration, Duration) {
    let started = Instant::now();
    let metrics = exporter.scrape();
    let took = started.elapsed();
    let own = metrics.value("vram_scrape_duration_seconds", &[]);
    (took, Duration::from_secs_f64(own))
}

/// Every GPU read, with its owner live.
fn check(metrics: &Metrics) {
    for gpu in 0..GPUS {
        let gpu = gpu.to_string();
        assert_eq!(metrics.value("vram_gpu_up", &[("gpu", &gpu)]), 1.0);
        assert_eq!(
            metrics.value(
                "vram_owner_processes",
                &[("gpu", &gpu), ("state", "running")]
            ),
            1.0
        );
    }
}

struct Summary {
    p50: Duration,
    p90: Duration,
    max: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let at = |share: f64| samples[((samples.len() - 1) as f64 * share).round() as usize];
    Summary {
        p50: at(0.5),
        p90: at(0.9),
        max: *samples.last().unwrap(),
    }
}

fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}
