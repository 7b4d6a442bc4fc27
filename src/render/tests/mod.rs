//! The three renderers on reports the classifier makes from fixed hosts: what each says,
//! and that all three say the same of one report.

mod all_three;
mod json;
mod mps;
mod prometheus;
mod text;

use super::json::check_document;
use super::prometheus::{encode_report, BuildInfo, RenderOptions, ScrapeTiming};
use super::text::{check_text, gpu_table, verdict, Verdict};
use crate::classify::tests::fixtures::*;
use crate::classify::{
    classify, NamespaceInit, RecoveryAction, References, Report, Settings, XidReading,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::collections::BTreeMap;

// Helpers.

/// `check --json` of every GPU of `report`.
fn json_of(report: &Report) -> Value {
    serde_json::to_value(check_document(&report.select(&[]).unwrap())).unwrap()
}

/// `check`'s text of every GPU of `report`.
fn text_of(report: &Report) -> String {
    check_text(&report.select(&[]).unwrap())
}

#[derive(Debug)]
struct Encoded(Report);

impl Collector for Encoded {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let options = RenderOptions {
            per_process_limit: Some(64),
        };
        let timing = ScrapeTiming {
            total_seconds: 0.25,
            scan_seconds: None,
        };
        let build = BuildInfo {
            version: "1.2.3",
            revision: "abc",
        };
        encode_report(&mut encoder, &self.0, &build, &options, timing)
    }
}

/// The Prometheus text of `report`.
fn metrics_of(report: &Report) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Encoded(report.clone())));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    text
}

/// One sample: family, labels in order, value.
type Sample = (String, Vec<(String, String)>, f64);

/// The samples of a Prometheus text (label values here hold no quote or backslash).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once("=\"").unwrap();
                    (key.to_string(), value.trim_end_matches('"').to_string())
                })
                .collect();
            (name.to_string(), labels, value.parse().unwrap())
        })
        .collect()
}

/// The samples of `family` whose labels include `with`.
fn find<'a>(samples: &'a [Sample], family: &str, with: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|(name, labels, _)| {
            name == family
                && with
                    .iter()
                    .all(|(key, value)| labels.iter().any(|(k, v)| k == key && v == value))
        })
        .collect()
}

// Families that write only their non-zero members: a missing member reads as 0, and a
// written one must not be 0. One list, the integration tests' (docs/reference.md).
use test_helpers::SPARSE_FAMILIES;

/// The one value of `family` with `with` (0 for a missing member of a sparse family).
fn value(samples: &[Sample], family: &str, with: &[(&str, &str)]) -> f64 {
    match find(samples, family, with).as_slice() {
        [one] if SPARSE_FAMILIES.contains(&family) => {
            assert_ne!(one.2, 0.0, "{family} {with:?} writes no zeros");
            one.2
        }
        [one] => one.2,
        [] if SPARSE_FAMILIES.contains(&family) => 0.0,
        other => panic!("{family} {with:?}: {other:?}"),
    }
}

/// The PIDs a text names as `PID 524 (...)`, in order.
fn pids_named(text: &str) -> Vec<u32> {
    text.match_indices("PID ")
        .filter_map(|(at, _)| {
            let rest = &text[at + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[digits.len()..]
                .starts_with(" (")
                .then(|| digits.parse().ok())?
        })
        .collect()
}

/// The PIDs a JSON list of holders names.
fn json_pids(holders: &Value) -> Vec<u32> {
    holders
        .as_array()
        .unwrap()
        .iter()
        .map(|holder| holder["pid"].as_u64().unwrap() as u32)
        .collect()
}

/// The fork-inherited orphan, its child 524 in a container that has ended, an NVML client
/// 467 beside it, the driver asking for a reset, and an idle GPU 1.
fn stuck_in_an_ended_container() -> Host {
    Host::idle()
        .gpu(1)
        .used(USED_ONE_OWNER)
        .owner(503, Some(CHARGED_ONE_OWNER), ProcessLookup::Missing)
        .holder(contained(
            cuda(524, &[0]).child_of(503).started(150_000),
            Some(NamespaceInit::Exited { pid: 9 }),
        ))
        .holder(nvml_client(467, "nvidia-smi", &[0]))
        .health(recovery(RecoveryAction::GpuReset))
}
