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
//! section scrapes once a second, and first idles, default 180), the cpu section's
//! `SCRAPE_CPU_GPUS` and `SCRAPE_CPU_OWNERS` (default 1 and 1, the H200's one-owner
//! scenario), `SCRAPE_CPU_FAST` (scrapes back to back, default 2000), `SCRAPE_CPU_SLOW`
//! (scrapes at a steady pace, default 20), `SCRAPE_CPU_INTERVAL_MS` (that pace, default
//! 1000) and `SCRAPE_CPU_ROUNDS` (default 2),
//! `SCRAPE_WRK_SECONDS` (default 30), `SCRAPE_WRK_CONNECTIONS` (default 64),
//! `SCRAPE_WRK_BESIDE` (default 1: one more connection a second beside wrk's, as a
//! Prometheus server beside a load test; 0: wrk alone) and
//! `SCRAPE_BASELINE_BINARY` (an earlier build of the exporter: the wrk section then
//! measures it the same way, alternating with this build over two rounds, for a
//! before-and-after in one run; the targets, latency and cpu sections too). `SCRAPE_TARGET_SECONDS`
//! (default 20) is how long each wrk run of the targets section lasts. A positional
//! argument filters the sections by name: latency, breakdown, soak, interval, cpu, wrk,
//! targets. The `hold` section, run only when named, measures nothing: it starts the
//! targets' scenario (`SCRAPE_HOLD_ORPHAN=1`: during the fork-orphan episode;
//! `SCRAPE_HOLD_GPUS` and `SCRAPE_HOLD_OWNERS` for another) and keeps the exporter up for
//! `SCRAPE_HOLD_SECONDS` (default 60) for a profiler.

// The integration tests' rig, fake NVML scenario and model owners. The bench uses a few of
// them; the tests use them all, and there the compiler finds any that nothing uses.
use test_helpers as helpers;
// What the benches read from the environment.
#[path = "../settings/mod.rs"]
mod settings;

mod cpu;
mod hold;
mod latency;
mod load;
mod serve;
mod steady;

use cpu::cpu;
use latency::{breakdown, latency};
use load::{targets, wrk, wrk_summary};
use steady::{interval, soak};

use helpers::{exporter_binary, Holder, Rig};
use settings::env_number;
use std::fs;

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
    if ![
        "latency",
        "breakdown",
        "soak",
        "interval",
        "cpu",
        "wrk",
        "targets",
    ]
    .iter()
    .any(|section| wanted(section))
        && !filters.contains(&"hold")
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
    if wanted("cpu") {
        let gpus = env_number("SCRAPE_CPU_GPUS", 1) as u32;
        let pids = owners.pids(&rig, gpus);
        let count = env_number("SCRAPE_CPU_OWNERS", 1).min(MAX_OWNERS);
        let baseline = std::env::var_os("SCRAPE_BASELINE_BINARY").map(std::path::PathBuf::from);
        let pace = (
            env_number("SCRAPE_CPU_FAST", 2_000),
            env_number("SCRAPE_CPU_SLOW", 20),
            std::time::Duration::from_millis(env_number("SCRAPE_CPU_INTERVAL_MS", 1_000) as u64),
        );
        let rounds = env_number("SCRAPE_CPU_ROUNDS", 2);
        cpu(&rig, gpus, &pids[..count], baseline, rounds, pace);
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
    if filters.contains(&"hold") {
        let gpus = env_number("SCRAPE_HOLD_GPUS", MAX_GPUS as usize) as u32;
        let count = env_number("SCRAPE_HOLD_OWNERS", MAX_OWNERS).min(MAX_OWNERS);
        let pids = owners.pids(&rig, gpus);
        hold::hold(
            &rig,
            gpus,
            &pids[..count],
            env_number("SCRAPE_HOLD_ORPHAN", 0) != 0,
            env_number("SCRAPE_HOLD_SECONDS", 60) as u64,
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
