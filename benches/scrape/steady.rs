//! Steady state: memory over many scrapes, and the CPU of one scrape a second.

use crate::helpers::{exporter_binary, Rig};
use crate::serve::{
    check_body, clock_ticks_per_second, cpu_seconds, memory_kib, mib, micros, open_files,
    sample_sum, start, summarize, thread_ticks, threads, wait_for_open_files, Connection,
};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub(crate) fn soak(rig: &Rig, gpus: u32, pids: &[u32], scrapes: usize) {
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

pub(crate) fn stripped_size(binary: &Path) -> Option<u64> {
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
pub(crate) fn interval(rig: &Rig, gpus: u32, pids: &[u32], seconds: usize) {
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
