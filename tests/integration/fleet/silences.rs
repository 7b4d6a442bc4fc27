//! The example Alertmanager configuration's inhibitions, with alerts posted to a real
//! Alertmanager: what a hung GPU or a node without NVML cannot see is silenced.

use super::{env_number, label, notified_alerts, start_alertmanager, JOB, PACKAGES};
use crate::helpers::*;
use crate::monitoring::Webhook;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// POST a JSON body over HTTP/1.0; the status.
fn post_json(address: std::net::SocketAddr, path: &str, body: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .expect("connect to Alertmanager");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"))
}

#[test]
fn the_example_alertmanager_silences_what_a_hung_gpu_or_a_node_without_nvml_cannot_see() {
    let alertmanager_binary = require_tool("prometheus-alertmanager", PACKAGES);
    let divisor = env_number("VRAM_FLEET_TIME_DIVISOR", 15);
    let webhook = Webhook::start();
    let config = tempfile::tempdir().expect("temporary folder");
    let (alertmanager, durations) =
        start_alertmanager(&alertmanager_binary, config.path(), divisor, &webhook);

    // (alert, cluster, node, gpu, whether the example must silence it). Node n1's GPU 0
    // does not answer; node n2 of cluster a has no NVML; cluster b has a node named n2
    // too, whose NVML is fine.
    let alerts = [
        ("VRAMGpuNotAnswering", "a", "n1:9077", "0", false),
        ("VRAMOrphanedMemory", "a", "n1:9077", "0", true),
        ("VRAMUnlistedHolder", "a", "n1:9077", "0", true),
        ("VRAMOrphanedMemory", "a", "n1:9077", "1", false),
        ("VRAMNvmlDown", "a", "n2:9077", "", false),
        ("VRAMLeftBehindMemory", "a", "n2:9077", "3", true),
        ("VRAMGpuDown", "a", "n2:9077", "4", true),
        ("VRAMOrphanedMemory", "b", "n2:9077", "3", false),
    ];
    let body: Vec<Value> = alerts
        .iter()
        .map(|(name, cluster, node, gpu, _)| {
            let mut labels = serde_json::json!({
                "alertname": name, "cluster": cluster, "instance": node,
                "job": JOB, "severity": "critical",
            });
            if !gpu.is_empty() {
                labels["gpu"] = Value::from(*gpu);
            }
            serde_json::json!({ "labels": labels })
        })
        .collect();
    let body = Value::from(body).to_string();
    assert_eq!(
        post_json(alertmanager.address, "/api/v2/alerts", &body),
        200
    );

    let key = |alert: &Value| {
        (
            label(alert, "alertname").to_string(),
            label(alert, "cluster").to_string(),
            label(alert, "instance").to_string(),
            label(alert, "gpu").to_string(),
        )
    };
    let expected: BTreeMap<_, bool> = alerts
        .iter()
        .map(|(name, cluster, node, gpu, silenced)| {
            (
                (
                    name.to_string(),
                    cluster.to_string(),
                    node.to_string(),
                    gpu.to_string(),
                ),
                *silenced,
            )
        })
        .collect();
    let mut seen = BTreeMap::new();
    wait_until(
        "Alertmanager has judged every alert",
        Duration::from_secs(30),
        || {
            seen = alertmanager
                .api("/api/v2/alerts")
                .as_array()
                .unwrap()
                .iter()
                .map(|alert| {
                    let inhibited = alert["status"]["inhibitedBy"]
                        .as_array()
                        .is_some_and(|by| !by.is_empty());
                    (key(alert), inhibited)
                })
                .collect();
            seen == expected
        },
    );
    // The ones not silenced are notified after group_wait; the silenced never are.
    let notified = |webhook: &Webhook| -> BTreeSet<_> {
        notified_alerts(webhook)
            .iter()
            .map(|(_, _, alert)| key(alert))
            .collect()
    };
    let loud: BTreeSet<_> = expected
        .iter()
        .filter(|(_, silenced)| !**silenced)
        .map(|(key, _)| key.clone())
        .collect();
    wait_until(
        "every alert that is not silenced is notified",
        Duration::from_secs_f64(durations["group_wait"] + 30.0),
        || notified(&webhook) == loud,
    );
    // One more group_wait for a silenced one that would come late.
    std::thread::sleep(Duration::from_secs_f64(durations["group_wait"] + 1.0));
    assert_eq!(notified(&webhook), loud);
}
