//! Any JSON that reads as an observation (a snapshot's, or NVML and /proc garbage) goes
//! through the whole verdict path without a panic: classify, then every renderer. The
//! bounds the README promises for garbage readings are asserted on the way.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use vram_exporter::classify::{classify, Report, Settings};
use vram_exporter::observe::{Observation, Snapshot};
use vram_exporter::render::json::check_document;
use vram_exporter::render::prometheus::{encode_report, BuildInfo, RenderOptions, ScrapeTiming};
use vram_exporter::render::text::check_text;

#[derive(Debug)]
struct Rendered(Report);

impl Collector for Rendered {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let options = RenderOptions {
            per_process_limit: Some(64),
        };
        encode_report(
            &mut encoder,
            &self.0,
            &BuildInfo::current(),
            &options,
            ScrapeTiming {
                total_seconds: 0.001,
                scan_seconds: None,
            },
        )
    }
}

fn check(observation: &Observation) {
    let settings = Settings {
        agent_comms: vec!["agent".into()],
        ..Settings::default()
    };
    let report = classify(observation, &settings);
    for gpu in &report.gpus {
        if let Some(account) = gpu.account() {
            let memory = account.memory;
            assert!(memory.reserved <= memory.total, "{memory:?}");
            assert!(memory.used <= memory.total - memory.reserved, "{memory:?}");
            assert!(
                memory.free <= memory.total - memory.reserved - memory.used,
                "{memory:?}"
            );
            assert!(account.orphaned_bytes() <= memory.used, "{account:?}");
            assert!(
                account.orphaned_owner_gone_bytes <= memory.used,
                "{account:?}"
            );
        }
    }
    let gpus: Vec<_> = report.gpus.iter().collect();
    // What check exits with is what its document says.
    let status = report.check_status(&gpus);
    for gpu in &report.gpus {
        if let Some(account) = gpu.account() {
            // Only a GPU with orphaned memory blames anyone.
            if account.orphaned_bytes() == 0 {
                assert!(account.culprits.is_empty() && account.bystanders.is_empty());
            }
        }
    }
    let selection = report.select(&[]).expect("every GPU");
    let _ = check_text(&selection);
    let document = check_document(&selection);
    assert_eq!(document.status, status);
    serde_json::to_string(&document).expect("the JSON document");
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Rendered(report)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("OpenMetrics");
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("Prometheus text");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(observation) = serde_json::from_slice::<Observation>(data) {
        check(&observation);
    }
    if let Ok(snapshot) = serde_json::from_slice::<Snapshot>(data) {
        check(&snapshot.observation);
    }
});
