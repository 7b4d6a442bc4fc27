//! End to end: the real exporter (fake NVML, real processes) scraped every second by a
//! real Prometheus that evaluates the shipped rules and notifies a real Alertmanager,
//! whose webhook receiver is an HTTP listener inside this test.
//!
//! The fork-inherited orphan must reach Alertmanager as VRAMOrphanedMemory with the
//! GPU's index and UUID and the live holder's PID, and resolve once the holder dies. The
//! seconds from the orphan's appearance to the alert's arrival are asserted against the
//! bounds its intervals explain, with a generous slack, and printed (run with
//! `--nocapture`; docs/benchmarks.md quotes them). Every PromQL query of the dashboard
//! must parse and return data against the same Prometheus while the orphan exists.
//!
//! The rules file is used as shipped except for its `for:` durations, the documented site
//! setting, which are divided by 60 (one minute becomes one second) in a temporary copy;
//! the test checks that nothing else differs.
//!
//! Prometheus and Alertmanager are required: a machine without them fails, never skips.

use super::monitoring::{
    assert_only_for_lines_differ, duration_ms, shorten_for_durations, unix_now, unix_seconds,
    Server, Webhook,
};
use crate::helpers::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The packages that install `prometheus` (with promtool) and `prometheus-alertmanager`.
const PACKAGES: &str = "prometheus prometheus-alertmanager";

/// Prometheus scrapes and evaluates rules this often (seconds).
const SCRAPE_AND_EVALUATION_INTERVAL: &str = "1s";
/// Alertmanager waits this long before a new group's first notification, and between
/// two notifications of a group (so a resolution is sent this long after it arrives).
const GROUP_WAIT: &str = "1s";
const GROUP_INTERVAL: &str = "1s";
/// The scrape job; VRAMExporterAbsent expects this name (a SITE SETTING of the rules).
const JOB: &str = "vram-exporter";
/// The shipped `for:` durations are divided by this in the test's copy of the rules.
const FOR_DIVISOR: u64 = 60;

/// A bound on every wait for the servers, the alert and its resolution.
const WAIT: Duration = Duration::from_secs(30);
/// Seconds each measured step of the alert's path may take beyond what its scrape,
/// evaluation, `for:` and grouping intervals explain: generous, for a loaded machine.
const LATENCY_SLACK: f64 = 5.0;

fn rules_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("alerts/vram-exporter.rules.yml")
}

#[test]
fn fork_orphan_alert_reaches_alertmanager_resolves_and_the_dashboard_has_data() {
    let prometheus_binary = require_tool("prometheus", PACKAGES);
    let alertmanager_binary = require_tool("prometheus-alertmanager", PACKAGES);
    let test_started = Instant::now();

    // Host A: the host the orphan appears on, an exporter with the rights to read /proc.
    let rig = Rig::new();
    let host_a = rig.start(&[]);
    // Host B: a degraded host that has data for the panels about failures: its exporter
    // may not read root's descriptors (PID 1 is listed as an owner: /proc read errors)
    // and its GPU 1 fails with an NVML error. Nothing on it is orphaned. Its driver
    // reports a recovery action and row remapping, and its GPU 2 runs MIG, for the GPU
    // health panels.
    let rig_b = Rig::new();
    rig_b.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::one_owner(0, 1)
                    .recovery_action(0)
                    .remapped_rows(0, 0, false, false),
            )
            .gpu(Gpu::idle(1).error("nvmlDeviceGetMemoryInfo_v2", "Unknown"))
            .gpu(Gpu::idle(2).mig(vec![MigDevice::new(2, 1)]))
            .into_json(),
    );
    let host_b = start(rig_b.unprivileged_command(&["--web.listen-address", "127.0.0.1:0"]));

    let webhook = Webhook::start();
    let config = tempfile::tempdir().expect("temporary folder");
    let shipped = read(&rules_path());
    let (shortened, orphan_for_shipped) = shorten_for_durations(&shipped, FOR_DIVISOR);
    assert_only_for_lines_differ(&shipped, &shortened);
    let rules_copy = config.path().join("vram-exporter.rules.yml");
    std::fs::write(&rules_copy, &shortened).unwrap();

    let alertmanager_config = config.path().join("alertmanager.yml");
    std::fs::write(
        &alertmanager_config,
        format!(
            "route:\n  receiver: test\n  group_by: ['...']\n  group_wait: {GROUP_WAIT}\n  \
             group_interval: {GROUP_INTERVAL}\n  repeat_interval: 1h\n\
             receivers:\n  - name: test\n    webhook_configs:\n      - url: http://{}/alerts\n        \
             send_resolved: true\n",
            webhook.address
        ),
    )
    .unwrap();
    let alertmanager_data = config.path().join("alertmanager");
    let alertmanager = Server::start("alertmanager", |address| {
        let mut command = Command::new(&alertmanager_binary);
        command
            .arg(format!("--config.file={}", alertmanager_config.display()))
            .arg(format!("--storage.path={}", alertmanager_data.display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--cluster.listen-address=");
        command
    });

    let prometheus_config = config.path().join("prometheus.yml");
    std::fs::write(
        &prometheus_config,
        format!(
            "global:\n  scrape_interval: {i}\n  scrape_timeout: {i}\n  evaluation_interval: {i}\n\
             rule_files:\n  - {rules}\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['{a}', '{b}']\n",
            i = SCRAPE_AND_EVALUATION_INTERVAL,
            rules = rules_copy.display(),
            am = alertmanager.address,
            a = host_a.address,
            b = host_b.address,
        ),
    )
    .unwrap();
    let prometheus_data = config.path().join("prometheus");
    let prometheus = Server::start("prometheus", |address| {
        let mut command = Command::new(&prometheus_binary);
        command
            .arg(format!("--config.file={}", prometheus_config.display()))
            .arg(format!("--storage.tsdb.path={}", prometheus_data.display()))
            .arg(format!("--web.listen-address={address}"));
        command
    });

    // Prometheus runs the shortened rules, scrapes both hosts and knows Alertmanager.
    let rules = prometheus.api("/api/v1/rules");
    let orphan_rule = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .find(|rule| rule["name"] == "VRAMOrphanedMemory")
        .unwrap_or_else(|| panic!("Prometheus did not load VRAMOrphanedMemory: {rules}"));
    let orphan_for = orphan_rule["duration"].as_f64().unwrap();
    assert_eq!(orphan_for, orphan_for_shipped / FOR_DIVISOR as f64);
    wait_until("Prometheus scrapes both hosts", WAIT, || {
        prometheus.query(&format!("up{{job=\"{JOB}\"}} == 1")).len() == 2
    });
    wait_until("Prometheus has discovered Alertmanager", WAIT, || {
        prometheus.api("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
            .as_array()
            .is_some_and(|active| !active.is_empty())
    });
    let instance_a = host_a.address.to_string();
    let selector_a = format!("job=\"{JOB}\",instance=\"{instance_a}\",gpu=\"0\"");
    let owner_gone_a = format!("vram_orphaned_bytes{{{selector_a},reason=\"owner_gone\"}}");
    assert_eq!(
        prometheus.query(&format!("{owner_gone_a} == 0")).len(),
        1,
        "before the orphan, host A's GPU 0 has nothing orphaned"
    );
    assert!(orphan_alerts(&alertmanager).is_empty());

    // The fork-inherited orphan: the owner dies while the child it forked keeps the device
    // file, and NVML keeps charging the dead PID. It appears when the scenario says so.
    let (dead_owner, holder) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let orphan_appeared = Instant::now();
    let orphan_appeared_wall = unix_now();

    let mut arrived = None;
    let mut notified = None;
    let deadline = orphan_appeared + WAIT;
    while arrived.is_none() || notified.is_none() {
        assert!(
            Instant::now() < deadline,
            "VRAMOrphanedMemory did not reach Alertmanager within {WAIT:?} \
             (in its API: {arrived:?}, notified: {notified:?}); Prometheus has {}",
            prometheus.api("/api/v1/alerts")
        );
        if arrived.is_none() {
            let alerts = orphan_alerts(&alertmanager);
            if !alerts.is_empty() {
                arrived = Some((Instant::now(), alerts));
            }
        }
        if notified.is_none() {
            notified = webhook.first(|alert| {
                alert["labels"]["alertname"] == "VRAMOrphanedMemory" && alert["status"] == "firing"
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (arrived, alerts) = arrived.unwrap();
    let (notified, notification) = notified.unwrap();

    let holder_text = format!("pid {} (dataloader, running)", holder.pid);
    assert_eq!(
        alerts.len(),
        1,
        "one orphan alert, for host A's GPU 0: {alerts:#?}"
    );
    let alert = &alerts[0];
    for (alert, source) in [
        (alert, "Alertmanager's API"),
        (&notification, "the webhook"),
    ] {
        let labels = &alert["labels"];
        assert_eq!(labels["gpu"], "0", "{source}: {alert:#}");
        assert_eq!(labels["uuid"], Gpu::uuid(0).as_str(), "{source}: {alert:#}");
        assert_eq!(
            labels["instance"],
            instance_a.as_str(),
            "{source}: {alert:#}"
        );
        assert_eq!(labels["job"], JOB, "{source}: {alert:#}");
        assert_eq!(labels["reason"], "owner_gone", "{source}: {alert:#}");
        assert_eq!(labels["severity"], "critical", "{source}: {alert:#}");
        let description = alert["annotations"]["description"].as_str().unwrap();
        assert!(
            description.contains(&holder_text) && description.contains(&Gpu::uuid(0)),
            "{source}: the description names the GPU's UUID and the holder ({holder_text}): \
             {description}"
        );
        assert!(
            !description.contains(&format!("pid {dead_owner} ")),
            "{source}: the dead owner is not a holder: {description}"
        );
    }
    // Its companion names the process whose end frees the memory.
    let mut unlisted = None;
    wait_until("VRAMUnlistedHolder is notified", WAIT, || {
        unlisted = webhook.first(|alert| {
            alert["labels"]["alertname"] == "VRAMUnlistedHolder" && alert["status"] == "firing"
        });
        unlisted.is_some()
    });
    let (_, unlisted) = unlisted.unwrap();
    let labels = &unlisted["labels"];
    assert_eq!(
        labels["pid"],
        holder.pid.to_string().as_str(),
        "{unlisted:#}"
    );
    assert_eq!(labels["comm"], "dataloader", "{unlisted:#}");
    assert_eq!(labels["gpu"], "0", "{unlisted:#}");
    assert_eq!(labels["uuid"], Gpu::uuid(0).as_str(), "{unlisted:#}");
    assert_eq!(labels["instance"], instance_a.as_str(), "{unlisted:#}");

    // Where the time went: Prometheus's activeAt is the first evaluation that saw the
    // orphan (after a scrape had collected it), startsAt the evaluation that found it
    // pending for `for:` and fired it.
    let prometheus_alerts = prometheus.api("/api/v1/alerts");
    let active_at = prometheus_alerts["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|alert| {
            alert["labels"]["alertname"] == "VRAMOrphanedMemory" && alert["state"] == "firing"
        })
        .map(|alert| unix_seconds(alert["activeAt"].as_str().unwrap()))
        .unwrap_or_else(|| {
            panic!("Prometheus does not show the firing alert: {prometheus_alerts}")
        });
    let pending_after = active_at - orphan_appeared_wall;
    let fired_after = unix_seconds(alert["startsAt"].as_str().unwrap()) - orphan_appeared_wall;
    let to_alertmanager = (arrived - orphan_appeared).as_secs_f64();
    let to_webhook = (notified - orphan_appeared).as_secs_f64();

    // Every dashboard query parses and has data while the orphan exists. The template
    // variables' own series (vram_build_info, vram_gpu_info) are checked with them.
    // The Fleet row is left to fleet/incidents.rs, which has left-behind workers and
    // clusters to show; this host has neither.
    let fleet_row = super::dashboard::fleet_row_queries();
    let mut queries = super::dashboard::dashboard_queries();
    queries.retain(|query| !fleet_row.contains(query));
    assert!(!queries.is_empty(), "the dashboard has no queries");
    queries.push(r#"vram_build_info{job=~".*"}"#.to_string());
    queries.push(r#"vram_gpu_info{job=~".*", instance=~".*"}"#.to_string());
    let mut empty: Vec<&String> = queries.iter().collect();
    let dashboard_deadline = Instant::now() + WAIT;
    loop {
        empty.retain(|query| prometheus.query(query).is_empty());
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < dashboard_deadline,
            "with the orphan present these dashboard queries return no data:\n{empty:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let holders_panel = queries
        .iter()
        .find(|query| query.starts_with("vram_holder_info"))
        .expect("the dashboard lists the unlisted holders");
    assert!(
        prometheus
            .query(holders_panel)
            .iter()
            .any(|series| series["metric"]["pid"] == holder.pid.to_string().as_str()),
        "the holders panel names the live holder {}",
        holder.pid
    );
    let dashboard_checked = Instant::now();

    // The operator ends the holder; the driver frees the memory and drops the dead PID.
    holder.kill();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    let freed = Instant::now();
    let mut gone_from_api = None;
    let mut resolved = None;
    let deadline = freed + WAIT;
    while gone_from_api.is_none() || resolved.is_none() {
        assert!(
            Instant::now() < deadline,
            "VRAMOrphanedMemory did not resolve within {WAIT:?} (gone from the API: \
             {gone_from_api:?}, resolved notification: {resolved:?})"
        );
        if gone_from_api.is_none() && orphan_alerts(&alertmanager).is_empty() {
            gone_from_api = Some(Instant::now());
        }
        if resolved.is_none() {
            resolved = webhook.first(|alert| {
                alert["labels"]["alertname"] == "VRAMOrphanedMemory"
                    && alert["labels"]["instance"] == instance_a.as_str()
                    && alert["status"] == "resolved"
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone_from_api = (gone_from_api.unwrap() - freed).as_secs_f64();
    let (resolved, _) = resolved.unwrap();
    let resolved = (resolved - freed).as_secs_f64();

    // The printed figures are asserted, not only shown: each step follows the structure
    // docs/benchmarks.md ("Alert latency") derives, with a generous slack for a loaded
    // machine. Clocks: Prometheus's timestamps and this test's wall clock are the same
    // host's, so a few tens of milliseconds of rounding are allowed below.
    let interval = duration_ms(SCRAPE_AND_EVALUATION_INTERVAL) as f64 / 1000.0;
    let group_wait = duration_ms(GROUP_WAIT) as f64 / 1000.0;
    let group_interval = duration_ms(GROUP_INTERVAL) as f64 / 1000.0;
    let rounding = 0.1;
    let seen_by = 2.0 * interval + LATENCY_SLACK;
    let latencies = [
        // Seen at the next scrape, pending at the next evaluation after it.
        ("pending", pending_after, -rounding, seen_by),
        // Fired at the first evaluation at least for: after it became pending.
        (
            "fired after pending",
            fired_after - pending_after,
            orphan_for - rounding,
            orphan_for + interval + LATENCY_SLACK,
        ),
        // Sent to Alertmanager at once (arrival is measured by polling its API).
        (
            "in Alertmanager after firing",
            to_alertmanager - fired_after,
            -rounding,
            LATENCY_SLACK,
        ),
        // Notified after group_wait.
        (
            "notified after arriving",
            to_webhook - to_alertmanager,
            group_wait / 2.0,
            group_wait + LATENCY_SLACK,
        ),
        (
            "gone from Alertmanager after the kill",
            gone_from_api,
            0.0,
            seen_by + group_interval,
        ),
        (
            "resolved notification after the kill",
            resolved,
            0.0,
            seen_by + group_interval,
        ),
    ];
    for (step, seconds, at_least, at_most) in latencies {
        assert!(
            (at_least..=at_most).contains(&seconds),
            "{step}: {seconds:.2} s, outside {at_least:.2}..={at_most:.2} s"
        );
    }

    let scrape = SCRAPE_AND_EVALUATION_INTERVAL;
    eprintln!(
        "\nalert latency, fork-inherited orphan -> VRAMOrphanedMemory \
         (scrape and evaluation every {scrape}, for: {orphan_for}s, group_wait {GROUP_WAIT}):\n  \
         orphan appears -> first evaluation that sees it (pending):  {pending_after:.2} s\n  \
         orphan appears -> evaluation that fires it (startsAt):      {fired_after:.2} s\n  \
         orphan appears -> alert in Alertmanager's API:              {to_alertmanager:.2} s\n  \
         orphan appears -> webhook notification (firing):            {to_webhook:.2} s\n  \
         holder killed  -> alert gone from Alertmanager's API:       {gone_from_api:.2} s\n  \
         holder killed  -> webhook notification (resolved):          {resolved:.2} s\n  \
         {} dashboard queries had data after {:.2} s; whole test {:.1} s\n  \
         alerts seen by the webhook: {}",
        queries.len(),
        (dashboard_checked - orphan_appeared).as_secs_f64(),
        test_started.elapsed().as_secs_f64(),
        webhook.alert_names().join(", "),
    );
}

/// The orphan alerts Alertmanager holds as active (resolved ones are not listed).
fn orphan_alerts(alertmanager: &Server) -> Vec<Value> {
    let alerts = alertmanager.api("/api/v2/alerts");
    alerts
        .as_array()
        .unwrap_or_else(|| panic!("Alertmanager's alert list is not a list: {alerts}"))
        .iter()
        .filter(|alert| alert["labels"]["alertname"] == "VRAMOrphanedMemory")
        .cloned()
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()))
}
