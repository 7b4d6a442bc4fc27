//! Concurrent scrapes share one collection: NVML is asked once for all the scrapes that
//! arrive while a collection is in flight, and every one of them gets the full body.

use crate::helpers::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Barrier};

/// How long the fake NVML's memory call sleeps: long enough that every parallel scrape
/// arrives while the first collection is still in flight.
const MEMORY_CALL_DELAY_MS: u64 = 400;
const PARALLEL_SCRAPES: usize = 16;
const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";

/// An exporter whose fake NVML logs every call and answers the memory call slowly.
fn slow_exporter(rig: &Rig, calls: &Path) -> Exporter {
    let mut gpu = Gpu::idle(0);
    gpu.0["delays_ms"][MEMORY_CALL] = json!(MEMORY_CALL_DELAY_MS);
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let mut command = rig.command();
    command
        .env("FAKE_NVML_CALL_LOG", calls)
        .args(["--web.listen-address", "127.0.0.1:0"]);
    start(command)
}

/// How many times NVML was asked for memory, i.e. how many collections ran.
fn collections(calls: &Path) -> usize {
    fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == MEMORY_CALL)
        .count()
}

/// The body a scrape of the idle GPU must give.
fn assert_correct(response: &Response) {
    assert_eq!(response.status, 200, "{}", response.body);
    let metrics = Metrics::parse(&response.body);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "0")]), 1.0);
    assert_eq!(
        metrics.value("vram_total_bytes", &[("gpu", "0")]),
        TOTAL as f64
    );
    assert_eq!(
        metrics.value("vram_reserved_bytes", &[("gpu", "0")]),
        RESERVED as f64
    );
    // Shared bodies are whole: the last family is there too.
    assert!(
        metrics.has("vram_scrape_duration_seconds"),
        "{}",
        response.body
    );
}

#[test]
fn parallel_scrapes_share_one_collection() {
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let exporter = slow_exporter(&rig, &calls);
    // The first scrape loads NVML; count from after it.
    assert_correct(&exporter.get("/metrics"));
    assert_eq!(collections(&calls), 1);

    let responses = parallel_scrapes(exporter.address, PARALLEL_SCRAPES, &[]);
    for response in &responses {
        assert_correct(response);
    }
    let shared = collections(&calls) - 1;
    // One collection, or two when a scrape lands just as the first one finishes; without
    // coalescing every scrape collects on its own, one after the other.
    assert!(
        (1..=2).contains(&shared),
        "{PARALLEL_SCRAPES} parallel scrapes ran {shared} collections"
    );
    // Counted on the HTTP side too: each collection times itself once, so the bodies
    // carry no more distinct durations than NVML saw collections.
    let durations: BTreeSet<String> = responses
        .iter()
        .map(|response| {
            let metrics = Metrics::parse(&response.body);
            metrics
                .value("vram_scrape_duration_seconds", &[])
                .to_string()
        })
        .collect();
    assert!(
        durations.len() <= shared,
        "{PARALLEL_SCRAPES} bodies carry {} collections' durations, NVML saw {shared}: {durations:?}",
        durations.len()
    );
}

#[test]
fn each_format_collects_once_and_later_scrapes_collect_afresh() {
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let exporter = slow_exporter(&rig, &calls);
    assert_correct(&exporter.get("/metrics"));

    // Scrapes in both formats at once: one collection per format, each body in its format.
    let address = exporter.address;
    let openmetrics = std::thread::spawn(move || {
        parallel_scrapes(
            address,
            8,
            &["Accept: application/openmetrics-text; version=1.0.0"],
        )
    });
    let text = parallel_scrapes(address, 8, &[]);
    let openmetrics = openmetrics.join().unwrap();
    for response in &text {
        assert_correct(response);
        assert!(!response.body.contains("# EOF"));
    }
    for response in &openmetrics {
        assert_eq!(response.status, 200);
        assert!(
            response
                .header("content-type")
                .is_some_and(|value| value.starts_with("application/openmetrics-text")),
            "{:?}",
            response.headers
        );
        assert!(response.body.ends_with("# EOF\n"), "{}", response.body);
    }
    let both = collections(&calls) - 1;
    assert!(
        (2..=4).contains(&both),
        "16 scrapes in two formats ran {both} collections"
    );

    // Coalescing is not caching: a scrape after the last collection finished gets a new one.
    let before = collections(&calls);
    for _ in 0..3 {
        assert_correct(&exporter.get("/metrics"));
    }
    assert_eq!(collections(&calls) - before, 3);
}

/// Send `count` scrapes to `address` at once, each on its own connection, with `headers`.
fn parallel_scrapes(
    address: SocketAddr,
    count: usize,
    headers: &'static [&'static str],
) -> Vec<Response> {
    let barrier = Arc::new(Barrier::new(count));
    let scrapers: Vec<_> = (0..count)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                http(address, "GET", "/metrics", headers)
            })
        })
        .collect();
    scrapers
        .into_iter()
        .map(|scraper| scraper.join().expect("scraper thread"))
        .collect()
}
