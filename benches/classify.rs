//! The pure half of a scrape: classifying an observation and encoding the report as
//! Prometheus text. Nothing here touches NVML or `/proc`.
//!
//! `cargo bench --bench classify`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use vram_exporter::classify::{classify, Report, Settings};
use vram_exporter::exporter::{encode, report_registry, Format};
use vram_exporter::observe::Observation;
use vram_exporter::render::prometheus::{BuildInfo, RenderOptions, ScrapeTiming};

/// An H200's memory and its driver reservation.
const TOTAL: u64 = 150_754_820_096;
const RESERVED: u64 = 644_939_776;
/// What each owner is charged, and the per-context overhead nobody is charged for.
const CHARGED: u64 = 1 << 30;
const OVERHEAD: u64 = 9_240_576;

/// `gpus` H200s and `owners` live owners spread over them round-robin, every owner
/// holding its device file: nothing orphaned, as on a healthy host. Built in the snapshot
/// format (`vram-exporter snapshot`), which stays readable as the model grows.
fn observation(gpus: u32, owners: u32) -> Observation {
    let mut per_gpu: Vec<Vec<Value>> = vec![Vec::new(); gpus as usize];
    let mut processes = serde_json::Map::new();
    for owner in 0..owners {
        let pid = 10_000 + owner;
        per_gpu[(owner % gpus) as usize].push(json!({ "pid": pid, "used_bytes": CHARGED }));
        let cuda = json!({ "status": "read", "gpus": [owner % gpus], "control": true });
        let facts = json!({
            "status": "present",
            "pid": pid,
            "local_pid": pid,
            "comm": "python3",
            "state": "S",
            "ppid": 1,
            "pgid": pid,
            "sid": pid,
            "threads": 8,
            "start_time_ticks": 123_456 + owner,
            "uid": 1000,
            "descriptors": cuda,
            "mappings": cuda,
        });
        processes.insert(pid.to_string(), json!({ "first_seen": null, "now": facts }));
    }
    let gpus: Vec<Value> = per_gpu
        .into_iter()
        .enumerate()
        .map(|(index, listed)| {
            let used = (CHARGED + OVERHEAD) * listed.len() as u64;
            json!({
                "index": index,
                "uuid": format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
                "name": "NVIDIA H200",
                "pci_bus_id": format!("00000000:{:02x}:00.0", 0x19 + index),
                "minor": index,
                "state": {
                    "status": "ok",
                    "memory": {
                        "total": TOTAL,
                        "reserved": RESERVED,
                        "used": used,
                        "free": TOTAL - RESERVED - used,
                    },
                    "processes": listed,
                },
            })
        })
        .collect();
    serde_json::from_value(json!({
        "nvml": { "status": "up", "driver_version": "580.159.04", "gpus": gpus },
        "host_pid_namespace": true,
        "owners": processes,
        "procfs_errors": 0,
    }))
    .expect("an observation in the snapshot format")
}

/// The registry the exporter encodes after classifying, holding a fixed report.
fn registry(report: Report) -> Registry {
    report_registry(
        Arc::new(report),
        ScrapeTiming {
            total_seconds: 0.0003,
            scan_seconds: None,
        },
        BuildInfo::current(),
        RenderOptions::default(),
    )
}

const SHAPES: [(u32, u32); 4] = [(1, 0), (1, 64), (8, 0), (8, 64)];

fn label(gpus: u32, owners: u32) -> String {
    format!("{gpus}gpu_{owners}owners")
}

fn bench_classify(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("classify");
    for (gpus, owners) in SHAPES {
        let observation = observation(gpus, owners);
        let report = classify(&observation, &settings);
        assert_eq!(report.orphaned_bytes(), 0, "the bench host must be healthy");
        group.bench_with_input(
            BenchmarkId::from_parameter(label(gpus, owners)),
            &observation,
            |b, observation| b.iter(|| classify(black_box(observation), &settings)),
        );
    }
    group.finish();
}

fn bench_encode(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("encode");
    for (gpus, owners) in SHAPES {
        let registry = registry(classify(&observation(gpus, owners), &settings));
        for (format, name) in [
            (Format::PrometheusText, "prometheus_text"),
            (Format::OpenMetrics, "openmetrics"),
        ] {
            let body = encode(&registry, format);
            // Every GPU has its used bytes; owner series exist only where there are owners.
            assert!(body.contains("vram_used_bytes{"));
            assert_eq!(body.contains("vram_owner_processes"), owners > 0);
            group.bench_with_input(
                BenchmarkId::new(name, label(gpus, owners)),
                &registry,
                |b, registry| b.iter(|| encode(black_box(registry), format)),
            );
        }
    }
    group.finish();
}

/// Both together, from an observation to the bytes a scrape returns.
fn bench_classify_and_encode(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("classify_and_encode");
    for (gpus, owners) in SHAPES {
        let observation = observation(gpus, owners);
        group.bench_with_input(
            BenchmarkId::from_parameter(label(gpus, owners)),
            &observation,
            |b, observation| {
                b.iter(|| {
                    let report = classify(black_box(observation), &settings);
                    encode(&registry(report), Format::PrometheusText)
                })
            },
        );
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_classify, bench_encode, bench_classify_and_encode
}
criterion_main!(benches);
