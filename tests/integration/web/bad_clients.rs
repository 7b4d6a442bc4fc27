//! Bad clients: slow connections (slowloris) beside a scrape, hostile and broken
//! requests, and a hung NVML call answered at once.

use super::{assert_metrics, raw_exchange, still_running};
use crate::helpers::*;
use serde_json::json;
use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn slow_clients_do_not_stop_a_scrape() {
    const SLOW: usize = 100;
    const MAX_CONNECTIONS: usize = 64;
    const SCRAPES: usize = 5;
    let rig = Rig::new();
    let exporter = rig.start(&["--web.max-connections", &MAX_CONNECTIONS.to_string()]);
    let address = exporter.address;
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| {
            let stream = TcpStream::connect(address).expect("connect");
            stream
                .set_write_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            stream
        })
        .collect();
    // Each sends its request headers one byte at a time (slowloris).
    let request = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nUser-Agent: slowloris\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let stop = Arc::new(AtomicBool::new(false));
    let dripping = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            // One byte per stream every 50 ms: the whole request takes about 5 s, and
            // never ends its headers.
            let mut position = 0;
            while !stop.load(Ordering::SeqCst) && position < request.len() {
                for stream in &mut slow {
                    let _ = stream.write_all(&request[position..=position]);
                }
                position += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            slow
        })
    };
    wait_until(
        "the slow connections fill every slot",
        Duration::from_secs(20),
        || exporter.log().contains("connection limit reached"),
    );
    for _ in 0..SCRAPES {
        assert_metrics(&exporter.get("/metrics"));
    }
    stop.store(true, Ordering::SeqCst);
    let slow = dripping.join().unwrap();
    // Counted, not timed: the scrapes were served by closing the oldest slow connection
    // to make room, not by waiting for slow clients to hit their 10 s header deadline,
    // which would have closed them all (they connected together). So the exporter still
    // holds as many as it has slots, less at most one per scrape.
    let open = slow.iter().filter(|stream| still_open(stream)).count();
    assert!(
        (MAX_CONNECTIONS - SCRAPES..=MAX_CONNECTIONS).contains(&open),
        "{open} of {SLOW} slow connections are still open after {SCRAPES} scrapes with {MAX_CONNECTIONS} slots"
    );
}

/// Whether the other end has neither closed nor reset `stream` (nothing to read yet).
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    matches!(stream.peek(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
}

/// Requests a hostile or broken client might send, each with what it must get: a status,
/// or `None` when closing the connection (with or without an error status) is fine.
fn hostile_requests() -> Vec<(&'static str, Vec<u8>, Option<u16>)> {
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let many_headers = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect::<String>()
    );
    let huge_url = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    vec![
        ("oversized header", huge_header.into_bytes(), Some(431)),
        ("too many headers", many_headers.into_bytes(), Some(431)),
        ("huge URL", huge_url.into_bytes(), None),
        ("garbage bytes", garbage, None),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00".to_vec(),
            None,
        ),
        (
            "path traversal",
            b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "encoded traversal",
            b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "metrics traversal",
            b"GET /metrics/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "unknown method",
            b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "POST with a body",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
            Some(405),
        ),
        (
            "GET with a body",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nxxxx".to_vec(),
            Some(413),
        ),
        (
            "chunked GET",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n"
                .to_vec(),
            Some(413),
        ),
        (
            "bad content length",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(),
            Some(400),
        ),
        (
            "NUL in a header",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n".to_vec(),
            Some(400),
        ),
        ("bare newlines", b"\r\n\r\n\r\n\r\n".to_vec(), None),
        ("HTTP/0.9", b"GET /metrics\r\n\r\n".to_vec(), None),
        (
            "CONNECT",
            b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "OPTIONS *",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "unicode path",
            "GET /m\u{e9}trics HTTP/1.1\r\nHost: x\r\n\r\n"
                .as_bytes()
                .to_vec(),
            None,
        ),
        ("truncated request", b"GET /metr".to_vec(), None),
    ]
}

#[test]
fn hostile_requests_leave_the_exporter_serving() {
    const REQUESTS: usize = 1000;
    const THREADS: usize = 8;
    let rig = Rig::new();
    let mut exporter = rig.start(&[]);
    let address = exporter.address;
    let kinds = Arc::new(hostile_requests());
    let workers: Vec<_> = (0..THREADS)
        .map(|worker| {
            let kinds = Arc::clone(&kinds);
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for index in (worker..REQUESTS).step_by(THREADS) {
                    let (what, bytes, expected) = &kinds[index % kinds.len()];
                    let raw = raw_exchange(address, bytes, Duration::from_secs(15));
                    let text = String::from_utf8_lossy(&raw);
                    if text.contains("root:") {
                        failures.push(format!("{what}: leaked a file"));
                    }
                    if let Some(status) = expected {
                        let got = parse_response(&raw).map(|response| response.status);
                        if got != Some(*status) {
                            failures.push(format!("{what}: expected {status}, got {got:?}"));
                        }
                    }
                }
                failures
            })
        })
        .collect();
    // Correct metrics all along, not only at the end.
    for _ in 0..5 {
        assert_metrics(&exporter.get("/metrics"));
    }
    let mut failures = Vec::new();
    for worker in workers {
        failures.extend(worker.join().unwrap());
    }
    failures.sort();
    failures.dedup();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(still_running(&mut exporter), "the exporter died");
    assert_metrics(&exporter.get("/metrics"));
    assert_eq!(exporter.get("/-/healthy").status, 200);
}

// ---------------------------------------------------------------------------------------
// A hung NVML call

const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";

fn memory_calls(log: &Path) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == MEMORY_CALL)
        .count()
}

#[test]
fn hung_nvml_call_is_answered_at_once_not_stacked_and_the_exporter_recovers() {
    const HANG_MS: u64 = 6000;
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let mut command = rig.command();
    command.env("FAKE_NVML_CALL_LOG", &calls).args([
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.collection-timeout",
        "500ms",
    ]);
    let exporter = start(command);
    assert_metrics(&exporter.get("/metrics"));

    // NVML's memory call starts hanging.
    let mut gpu = Gpu::idle(0);
    gpu.0["delays_ms"][MEMORY_CALL] = json!(HANG_MS);
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let before = memory_calls(&calls);
    let not_answering = |response: &Response| {
        assert_eq!(response.status, 200, "{}", response.body);
        let metrics = Metrics::parse(&response.body);
        metrics.value("vram_gpu_error", &[("gpu", "0"), ("error", "timeout")]) == 1.0
    };
    // The scrape waits for the GPU for its share of the wait, then answers without it,
    // saying it does not answer.
    assert!(not_answering(&exporter.get("/metrics")));
    // Later scrapes do not ask it again while the call hangs: still one NVML memory call,
    // made while the stuck call had not yet returned (it would be reported answering).
    for _ in 0..3 {
        assert!(not_answering(&exporter.get("/metrics")));
    }
    assert_eq!(memory_calls(&calls) - before, 1, "one call in flight");
    // Health does not depend on NVML.
    assert_eq!(exporter.get("/-/healthy").status, 200);

    // NVML stops hanging: once the stuck call returns, the GPU is read again.
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    wait_until("the GPU answers again", Duration::from_secs(20), || {
        !not_answering(&exporter.get("/metrics"))
    });
    assert_metrics(&exporter.get("/metrics"));
    let log = exporter.log();
    assert_eq!(
        log.matches("GPU does not answer NVML").count(),
        1,
        "logged once:\n{log}"
    );
}
