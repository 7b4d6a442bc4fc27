//! The CPU one scrape costs, to the nanosecond: each thread's time on a CPU from its
//! `schedstat` (the clock-tick counts of `stat` are 10 ms coarse), summed over the
//! exporter's threads, across scrapes back to back and then at a steady interval (one a
//! second, as Prometheus scrapes, by default). A scrape that comes after its threads
//! slept costs more than one that follows another at once: their caches are cold and
//! each wake is a full switch, which is what a node's exporter pays.
//!
//! With `SCRAPE_BASELINE_BINARY` both builds run, alternating, in every round, so that
//! whatever else loads the machine falls on both.

use crate::helpers::{exporter_binary, Rig};
use crate::serve::{check_body, start_binary, Connection};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a thread's name says it does, for the table: tokio's threads (HTTP, and the
/// collection with classify and encode on the blocking pool), the GPUs' NVML threads, the
/// `/proc` reader, the rest of a scrape's threads (the library's NVML thread, the main
/// thread, the holder scan's helpers), and the threads that run whether anyone scrapes
/// or not (Xid events: the fake NVML's event wait polls, which a driver's does not; the
/// kubelet's and container engines' watches), which are left out of a scrape's total.
fn group(name: &str) -> usize {
    match name {
        _ if name.starts_with("tokio") => 0,
        _ if name.starts_with("nvml-gpu-") => 1,
        "procfs-reader" => 2,
        "xid-events" | "kubelet-refresh" | "container-engin" => 4,
        _ => 3,
    }
}

const GROUPS: [&str; 5] = [
    "tokio",
    "GPUs' NVML",
    "/proc reader",
    "library, main, scan",
    "events and watches (not counted)",
];

/// The groups counted in a scrape's total.
const COUNTED: usize = 4;

/// Each thread of `pid`: its name and its time on a CPU so far, in nanoseconds.
fn on_cpu(pid: u32) -> BTreeMap<u32, (String, u64)> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let name = fs::read_to_string(task.path().join("comm")).ok()?;
            let schedstat = fs::read_to_string(task.path().join("schedstat")).ok()?;
            let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
            Some((tid, (name.trim().to_string(), nanos)))
        })
        .collect()
}

/// Microseconds on a CPU per scrape by thread group (as [`GROUPS`] orders them), and
/// of the groups a scrape counts, between two readings of [`on_cpu`] (a thread that
/// ended between them is not counted; one that started counts from zero).
fn per_scrape(
    before: &BTreeMap<u32, (String, u64)>,
    after: &BTreeMap<u32, (String, u64)>,
    scrapes: usize,
) -> ([f64; GROUPS.len()], f64) {
    let mut groups = [0.0; GROUPS.len()];
    for (tid, (name, nanos)) in after {
        let earlier = before.get(tid).map_or(0, |(_, nanos)| *nanos);
        groups[group(name)] += nanos.saturating_sub(earlier) as f64 / 1e3 / scrapes as f64;
    }
    let counted = groups[..COUNTED].iter().sum();
    (groups, counted)
}

/// One build's figures in one round.
struct Run {
    build: &'static str,
    back_to_back: ([f64; GROUPS.len()], f64),
    paced: ([f64; GROUPS.len()], f64),
}

/// `binary` with `gpus` GPUs and `pids` owners: `fast` scrapes back to back, then `slow`
/// scrapes `interval` apart (after one interval of rest), each on a connection kept
/// alive, as Prometheus keeps it.
fn measure(
    rig: &Rig,
    build: &'static str,
    binary: &Path,
    gpus: u32,
    pids: &[u32],
    (fast, slow, interval): (usize, usize, Duration),
) -> Run {
    let exporter = start_binary(rig, binary, gpus, pids);
    let pid = exporter.child.id();
    let mut connection = Connection::open(exporter.address);
    let mut body = Vec::new();
    // NVML loaded, the threads started, the owners first read.
    for _ in 0..50 {
        connection.scrape(&mut body);
    }
    check_body(std::str::from_utf8(&body).unwrap(), gpus, pids.len());
    let before = on_cpu(pid);
    for _ in 0..fast {
        connection.scrape(&mut body);
    }
    let back_to_back = per_scrape(&before, &on_cpu(pid), fast);
    std::thread::sleep(interval);
    let before = on_cpu(pid);
    let started = Instant::now();
    for tick in 0..slow {
        // Paced by the clock, as Prometheus paces its scrapes; not a synchronisation.
        let next = started + interval * tick as u32;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        connection.scrape(&mut body);
    }
    let paced = per_scrape(&before, &on_cpu(pid), slow);
    check_body(std::str::from_utf8(&body).unwrap(), gpus, pids.len());
    Run {
        build,
        back_to_back,
        paced,
    }
}

/// The section: `rounds` rounds of this build (and the baseline's, when given), `gpus`
/// GPUs and `pids` owners.
pub(crate) fn cpu(
    rig: &Rig,
    gpus: u32,
    pids: &[u32],
    baseline: Option<PathBuf>,
    rounds: usize,
    (fast, slow, interval): (usize, usize, Duration),
) {
    let mut builds = vec![("this build", exporter_binary())];
    if let Some(baseline) = baseline {
        builds.insert(0, ("baseline", baseline));
    }
    println!(
        "\n## CPU per scrape (threads' schedstat), {gpus} GPUs and {} owners: {fast} scrapes back to back, then {slow} at one every {} ms; {rounds} rounds",
        pids.len(),
        interval.as_millis()
    );
    println!(
        "| round | build | scrapes | us per scrape (counted) | {} |",
        GROUPS.join(" | ")
    );
    println!("| --- | --- | --- | --- |{}", " --- |".repeat(GROUPS.len()));
    let mut all: Vec<Run> = Vec::new();
    for round in 1..=rounds {
        for (build, binary) in &builds {
            let run = measure(rig, build, binary, gpus, pids, (fast, slow, interval));
            for (label, (groups, sum)) in
                [("back to back", &run.back_to_back), ("paced", &run.paced)]
            {
                let by_group: Vec<String> = groups.iter().map(|us| format!("{us:.0}")).collect();
                println!(
                    "| {round} | {build} | {label} | **{sum:.0}** | {} |",
                    by_group.join(" | ")
                );
            }
            all.push(run);
        }
    }
    for (build, _) in &builds {
        let mine: Vec<&Run> = all.iter().filter(|run| run.build == *build).collect();
        let median = |pick: fn(&Run) -> f64| {
            let mut values: Vec<f64> = mine.iter().map(|run| pick(run)).collect();
            values.sort_by(f64::total_cmp);
            let middle = values.len() / 2;
            match values.len() % 2 {
                0 => (values[middle - 1] + values[middle]) / 2.0,
                _ => values[middle],
            }
        };
        println!(
            "{build}: median of {} rounds, {:.0} us a scrape back to back, {:.0} us a scrape at one every {} ms ({:.3} ms of CPU a second at one scrape a second)",
            mine.len(),
            median(|run| run.back_to_back.1),
            median(|run| run.paced.1),
            interval.as_millis(),
            median(|run| run.paced.1) / 1e3,
        );
    }
}
