//! A fleet, not a node: N exporters (the fake NVML, 8 H200s each) in 4 clusters, each
//! cluster scraped by a real Prometheus in agent mode that remote-writes to one central
//! Prometheus, which evaluates the shipped rules and notifies a real Alertmanager running
//! the shipped example configuration (deploy/alertmanager/alertmanager.yml), whose
//! webhook receiver is an HTTP listener inside this test.
//!
//! Nodes are idle, busy (a live model process owns every GPU), orphaned (two GPUs charged
//! to a PID that no longer exists), hung beside an orphan (GPU 0's memory call never
//! returns, GPU 1 is orphaned) or lose NVML (the driver stops initialising). Once the
//! fleet is scraped, the incident starts on every such node at the same moment, and the
//! test asserts what the on-call receives:
//! - every orphaned node pages exactly once (VRAMOrphanedMemory, both GPUs in one
//!   notification), within the bound docs/fleet.md derives;
//! - the NVML outage sends at most two notifications per cluster, names every node that
//!   lost NVML, and no memory alert of those nodes is notified;
//! - a hung GPU beside an orphan pages for both, once each;
//! - nothing else is notified.
//!
//! Then it runs the dashboard's Fleet row against the central Prometheus, and prints the
//! figures docs/fleet.md quotes: series per node, samples per second, the central
//! Prometheus's memory, orphan-to-notification times and the fleet queries' latency.
//!
//! Size and time are set from the environment:
//! - `VRAM_FLEET_NODES` (default 16): how many exporters; a quarter of them lose NVML.
//! - `VRAM_FLEET_TIME_DIVISOR` (default 15): every shipped duration (the 15 s scrape and
//!   evaluation interval, the rules' `for:`, Alertmanager's group_wait and
//!   group_interval, the remote write's 5 s batch deadline) is divided by it, in the
//!   test's copies only, so the default run takes a scaled 1 s scrape and `for: 8s` in
//!   place of `for: 2m`. 1 runs the shipped durations.
//!
//! `tests/run.sh` runs the default. The 200-node run of docs/fleet.md is
//! `VRAM_FLEET_NODES=200 cargo test --test integration fleet -- --nocapture`.
//!
//! Prometheus and Alertmanager are required: a machine without them fails, never skips.
//!
//! This module holds the nodes, their scenarios and the example Alertmanager the tests
//! share; the fleet's incident is `incidents.rs`, and `silences.rs` posts alerts to the
//! example Alertmanager and checks what it inhibits.

mod incidents;
mod silences;

use super::monitoring::{duration_ms, Server, Webhook};
use crate::helpers::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PACKAGES: &str = "prometheus prometheus-alertmanager";
const CLUSTERS: usize = 4;
const GPUS: u32 = 8;
/// The scrape job; VRAMExporterAbsent expects this name (a SITE SETTING of the rules).
const JOB: &str = "vram-exporter";
/// The shipped scrape and evaluation interval the fleet documents assume.
const SHIPPED_INTERVAL_MS: u64 = 15_000;
/// Prometheus's default remote-write batch deadline.
const SHIPPED_BATCH_DEADLINE_MS: u64 = 5_000;
/// The hung GPU's call: it returns only once the test ends.
const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";
/// Seconds each bound may be exceeded on a loaded 2-core machine, at any scale.
const SLACK_S: f64 = 10.0;

/// What a node is, and what happens to it when the incident starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Idle,
    /// A live model process owns every GPU; nothing changes.
    Busy,
    /// GPUs 0 and 3 get memory charged to a PID that does not exist.
    Orphaned,
    /// GPU 0's memory call hangs; GPU 1 gets orphaned memory.
    HungBesideOrphan,
    /// A model server started a worker that owns GPU 0's memory; the server is SIGKILLed
    /// and the worker lives on, left behind.
    LeftBehind,
    /// The driver goes away (as a driver update unloads it): NVML answers nothing and
    /// does not initialise again.
    NvmlDown,
}

/// How many nodes of each kind a fleet of `nodes` has: a quarter lose NVML (50 of 200),
/// one in twenty is orphaned, one in a hundred hangs beside an orphan, one in ten is
/// busy, one in fifty is left behind; at least one of each but the outage, which needs a
/// node per cluster.
fn kinds(nodes: usize) -> Vec<Kind> {
    let down = (nodes / 4).max(CLUSTERS);
    let orphaned = (nodes / 20).max(2);
    let hung = (nodes / 100).max(1);
    let busy = (nodes / 10).max(1);
    let left = (nodes / 50).max(1);
    assert!(
        down + orphaned + hung + busy + left < nodes,
        "VRAM_FLEET_NODES={nodes} is too small for every kind of node; take at least 12"
    );
    let mut kinds = Vec::with_capacity(nodes);
    kinds.extend(std::iter::repeat_n(Kind::NvmlDown, down));
    kinds.extend(std::iter::repeat_n(Kind::Orphaned, orphaned));
    kinds.extend(std::iter::repeat_n(Kind::HungBesideOrphan, hung));
    kinds.extend(std::iter::repeat_n(Kind::Busy, busy));
    kinds.extend(std::iter::repeat_n(Kind::LeftBehind, left));
    kinds.resize(nodes, Kind::Idle);
    kinds
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name}={text:?} is not a positive whole number")),
        Err(_) => default,
    }
}

/// A Prometheus duration of `ms` milliseconds.
fn duration_text(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// One GPU node: its world and its exporter.
struct Node {
    kind: Kind,
    cluster: usize,
    rig: Rig,
    exporter: Exporter,
    /// The live owner of a busy node's GPUs.
    _owner: Option<Holder>,
    /// A left-behind node's server, until the incident kills it.
    server: Option<Holder>,
    /// A left-behind node's worker, which owns GPU 0.
    _workers: Vec<Holder>,
    /// The hung call returns once this file exists.
    hang_ends: PathBuf,
}

impl Node {
    fn instance(&self) -> String {
        self.exporter.address.to_string()
    }

    /// An H200 as NVML answers it: MIG supported but off, a recovery action and remapped
    /// rows to report.
    fn gpu(index: u32) -> Gpu {
        Gpu::idle(index)
            .mig_disabled()
            .recovery_action(0)
            .remapped_rows(0, 0, false, false)
    }

    /// The scenario before the incident: `owner` owns every GPU of a busy node and GPU 0
    /// of a left-behind one.
    fn before(kind: Kind, owner: Option<u32>) -> Value {
        let mut gpus = Gpus::new();
        for index in 0..GPUS {
            let owned = |pid| Node::gpu(index).used(USED).process(pid, Some(CHARGED));
            gpus = gpus.gpu(match (kind, owner, index) {
                (Kind::Busy, Some(pid), _) | (Kind::LeftBehind, Some(pid), 0) => owned(pid),
                _ => Node::gpu(index),
            });
        }
        gpus.into_json()
    }

    /// The scenario once the incident has started.
    fn during(&self, dead: u32) -> Value {
        let orphaned = |index| Node::gpu(index).used(USED).process(dead, Some(CHARGED));
        let mut gpus = Gpus::new();
        for index in 0..GPUS {
            gpus = gpus.gpu(match (self.kind, index) {
                (Kind::Orphaned, 0 | 3) | (Kind::HungBesideOrphan, 1) => orphaned(index),
                (Kind::HungBesideOrphan, 0) => Node::gpu(0).hang(MEMORY_CALL, &self.hang_ends),
                _ => Node::gpu(index),
            });
        }
        gpus.into_json()
    }

    /// Start the incident on this node.
    fn break_down(&mut self, dead: u32) {
        match self.kind {
            Kind::Idle | Kind::Busy => {}
            // The server dies as a SIGKILL ends it; its worker, adopted by this test (a
            // subreaper, as init adopts it on a host), keeps the memory.
            // Reaped at once, as its parent would: a zombie server still has its /proc
            // entry, and the exporter rightly takes it for alive.
            Kind::LeftBehind => self.server.take().expect("a left-behind server").kill(),
            // Without its scenario the fake NVML answers every call with an error and
            // refuses to initialise (docs/fake-nvml.md), as a driver that is gone.
            Kind::NvmlDown => std::fs::remove_file(&self.rig.scenario).unwrap(),
            _ => self.rig.write_scenario(&self.during(dead)),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Let a hung call return, so the exporter's reader thread is not left blocked.
        let _ = std::fs::write(&self.hang_ends, b"");
    }
}

/// The `for:` of `alert` in the rules text, in seconds.
fn shipped_for(rules: &str, alert: &str) -> f64 {
    let mut current = "";
    for line in rules.lines() {
        let body = line.trim_start();
        if let Some(name) = body.strip_prefix("- alert:") {
            current = name.trim();
        } else if let Some(value) = body.strip_prefix("for:") {
            if current == alert {
                return duration_ms(value.trim()) as f64 / 1000.0;
            }
        }
    }
    panic!("the rules have no `for:` for {alert}");
}

/// The shipped Alertmanager example with its durations divided by `divisor` and its
/// receiver pointed at `webhook`; nothing else may differ.
fn alertmanager_config(divisor: u64, webhook: &str) -> (String, BTreeMap<String, f64>) {
    let shipped =
        std::fs::read_to_string(repository().join("deploy/alertmanager/alertmanager.yml"))
            .expect("deploy/alertmanager/alertmanager.yml");
    let mut copy = String::new();
    let mut durations = BTreeMap::new();
    let mut changed = 0;
    for line in shipped.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let key = body.split(':').next().unwrap_or("");
        let new = match key {
            "group_wait" | "group_interval" | "repeat_interval" => {
                let ms = duration_ms(body[key.len() + 1..].trim());
                durations.insert(key.to_string(), ms as f64 / divisor as f64 / 1000.0);
                format!("{indent}{key}: {}", duration_text(ms / divisor))
            }
            "- url" => format!("{indent}- url: http://{webhook}/alerts"),
            _ => line.to_string(),
        };
        if new != line {
            changed += 1;
        }
        copy.push_str(&new);
        copy.push('\n');
    }
    assert!(
        changed >= 1 && durations.len() == 3,
        "the example names its receiver and its three durations once each: {durations:?}"
    );
    (copy, durations)
}

/// Alertmanager running the shipped example as `alertmanager_config` rewrites it for
/// `divisor` and `webhook`, with its configuration and storage in `config`; the durations
/// it runs with, in seconds.
fn start_alertmanager(
    binary: &Path,
    config: &Path,
    divisor: u64,
    webhook: &Webhook,
) -> (Server, BTreeMap<String, f64>) {
    let (am_text, am_durations) = alertmanager_config(divisor, &webhook.address.to_string());
    let am_config = config.join("alertmanager.yml");
    std::fs::write(&am_config, am_text).unwrap();
    let am_data = config.join("alertmanager");
    let alertmanager = Server::start("alertmanager", |address| {
        let mut command = Command::new(binary);
        command
            .arg(format!("--config.file={}", am_config.display()))
            .arg(format!("--storage.path={}", am_data.display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--cluster.listen-address=");
        command
    });
    (alertmanager, am_durations)
}

/// Every alert of every notification: (arrival, notification's group key, alert).
fn notified_alerts(webhook: &Webhook) -> Vec<(Instant, String, Value)> {
    webhook
        .notifications()
        .into_iter()
        .flat_map(|(at, notification)| {
            let key = notification["groupKey"].as_str().unwrap_or("").to_string();
            notification["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |alert| (at, key.clone(), alert))
        })
        .collect()
}

fn label<'a>(alert: &'a Value, name: &str) -> &'a str {
    alert["labels"][name].as_str().unwrap_or("")
}
