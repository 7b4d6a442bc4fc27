//! The exporter under the bench: the fake NVML's scenarios, starting a build, the
//! keep-alive connection Prometheus scrapes through, and what `/proc` says of the process.

use crate::helpers;
use crate::helpers::{Exporter, Gpu, Gpus, Rig};
use crate::{CHARGED, OVERHEAD};
use std::fs;
use std::io::BufReader;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `gpus` GPUs with `owners` of `pids` spread over them round-robin, all live.
pub(crate) fn scenario(gpus: u32, pids: &[u32]) -> serde_json::Value {
    scenario_with_orphan(gpus, pids, None)
}

/// Like [`scenario`], with GPU 0 also charging `dead_owner`, when given, for memory.
pub(crate) fn scenario_with_orphan(
    gpus: u32,
    pids: &[u32],
    dead_owner: Option<u32>,
) -> serde_json::Value {
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

pub(crate) fn start(rig: &Rig, gpus: u32, pids: &[u32]) -> Exporter {
    rig.write_scenario(&scenario(gpus, pids));
    rig.start(&[])
}

/// Like [`start`], with another build of the exporter (an earlier one, to compare).
pub(crate) fn start_binary(rig: &Rig, binary: &Path, gpus: u32, pids: &[u32]) -> Exporter {
    start_with(rig, binary, &scenario(gpus, pids))
}

/// `binary` serving the fake NVML's `scenario`.
pub(crate) fn start_with(rig: &Rig, binary: &Path, scenario: &serde_json::Value) -> Exporter {
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
pub(crate) struct Connection {
    pub(crate) reader: BufReader<TcpStream>,
    pub(crate) writer: TcpStream,
    pub(crate) request: Vec<u8>,
}

impl Connection {
    pub(crate) fn open(address: SocketAddr) -> Connection {
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
    pub(crate) fn scrape(&mut self, body: &mut Vec<u8>) -> Duration {
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
pub(crate) fn scrape_new_connection(address: SocketAddr) -> Duration {
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
pub(crate) fn sample_sum(body: &str, name: &str, with: &str) -> f64 {
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
pub(crate) fn check_body(body: &str, gpus: u32, owners: usize) {
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

pub(crate) struct Summary {
    pub(crate) median: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    pub(crate) mean: Duration,
}

pub(crate) fn summarize(mut samples: Vec<Duration>) -> Summary {
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

pub(crate) fn micros(duration: Duration) -> String {
    format!("{:.0}", duration.as_secs_f64() * 1e6)
}

/// VmRSS and VmHWM in KiB.
pub(crate) fn memory_kib(pid: u32) -> (u64, u64) {
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

pub(crate) fn open_files(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

pub(crate) fn threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
}

/// User plus system CPU time of `pid`, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // After the command: state is field 3, utime field 14 and stime field 15.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / per_second
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// Each thread of `pid`: its name and CPU ticks (user and system) so far.
pub(crate) fn thread_ticks(pid: u32) -> std::collections::BTreeMap<u32, (String, u64)> {
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

pub(crate) fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// Wait until `pid` has at most `count` descriptors open (closed connections are let go).
pub(crate) fn wait_for_open_files(pid: u32, count: usize) {
    helpers::wait_until(
        "the exporter has closed the finished connections",
        Duration::from_secs(30),
        || open_files(pid) <= count,
    );
}
