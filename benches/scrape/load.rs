//! Load from outside: `wrk` with many connections, and the speed targets under `wrk -c1`.

use crate::helpers;
use crate::helpers::{exporter_binary, Holder, Rig};
use crate::serve::{
    check_body, cpu_seconds, memory_kib, mib, micros, open_files, sample_sum, scenario,
    scenario_with_orphan, start_binary, start_with, summarize, threads, wait_for_open_files,
    Connection,
};
use crate::{CHARGED, MAX_GPUS, MAX_OWNERS};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one wrk run against one build gave.
pub(crate) struct WrkRun {
    pub(crate) label: String,
    pub(crate) requests: u64,
    pub(crate) per_second: f64,
    /// The exporter's CPU seconds (user and system) during the run.
    pub(crate) cpu: f64,
    /// connect, read, write, timeout, non-2xx.
    pub(crate) errors: [u64; 5],
    pub(crate) side: Vec<SideScrape>,
}

/// One scrape on a connection of its own, sent beside wrk's connections.
pub(crate) struct SideScrape {
    pub(crate) result: Result<(), String>,
    pub(crate) waited: Duration,
}

/// A new connection, one `GET /metrics`, `Connection: close`: what it got.
pub(crate) fn side_scrape(address: SocketAddr) -> SideScrape {
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
pub(crate) fn wrk_number(report: &str, key: &str) -> Option<f64> {
    let rest = &report[report.find(key)? + key.len()..];
    let number: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().ok()
}

pub(crate) fn wrk(
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

pub(crate) fn wrk_summary(runs: &[WrkRun]) {
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
pub(crate) struct TargetRun {
    pub(crate) case: &'static str,
    pub(crate) label: String,
    pub(crate) p50: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) requests: u64,
    pub(crate) in_exporter: Duration,
}

/// A latency of wrk's distribution (`50%  241.00us`) as a duration.
pub(crate) fn wrk_percentile(report: &str, percent: &str) -> Duration {
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
pub(crate) fn targets(rig: &Rig, pids: &[u32], baseline: Option<&Path>, seconds: usize) {
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
