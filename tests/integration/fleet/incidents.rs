//! The fleet's incident: every node of a kind breaks at once, and the on-call gets one
//! page per node incident and a bounded number for the fleet's NVML outage; then the
//! dashboard's Fleet row runs against the central Prometheus, and the figures
//! docs/fleet.md quotes are printed.

use super::{
    duration_text, env_number, kinds, label, notified_alerts, shipped_for, start_alertmanager,
    Kind, Node, CLUSTERS, GPUS, JOB, PACKAGES, SHIPPED_BATCH_DEADLINE_MS, SHIPPED_INTERVAL_MS,
    SLACK_S,
};
use crate::helpers::*;
use crate::monitoring::{
    assert_only_for_lines_differ, get, shorten_for_durations, unix_now, unix_seconds, Server,
    Webhook,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A process's resident memory in bytes, from `/proc/PID/status`.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a live process");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// CPU seconds (user and system) a process has used, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a live process");
    let fields: Vec<&str> = stat.rsplit_once(") ").expect("comm").1.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One metric of a Prometheus server's own /metrics, summed over its label sets.
fn own_metric(server: &Server, name: &str) -> f64 {
    let (status, body) =
        get(server.address, "/metrics", Duration::from_secs(10)).expect("Prometheus's /metrics");
    assert_eq!(status, 200);
    let values: Vec<f64> = body
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .collect();
    assert!(!values.is_empty(), "Prometheus's /metrics has no {name}");
    values.iter().sum()
}

/// The exporter's series (sample lines) at this moment.
fn series_count(exporter: &Exporter) -> usize {
    exporter
        .get("/metrics")
        .body
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .count()
}

#[test]
fn a_fleet_pages_once_per_node_incident_and_boundedly_for_a_fleet_incident() {
    let prometheus_binary = require_tool("prometheus", PACKAGES);
    let alertmanager_binary = require_tool("prometheus-alertmanager", PACKAGES);
    let started = Instant::now();
    let nodes_wanted = env_number("VRAM_FLEET_NODES", 16) as usize;
    let divisor = env_number("VRAM_FLEET_TIME_DIVISOR", 15);
    let interval_ms = SHIPPED_INTERVAL_MS / divisor;
    assert!(
        interval_ms >= 500,
        "VRAM_FLEET_TIME_DIVISOR={divisor} makes the scrape interval shorter than 500 ms"
    );
    let interval = duration_text(interval_ms);
    let interval_s = interval_ms as f64 / 1000.0;
    let batch_deadline_s = (SHIPPED_BATCH_DEADLINE_MS / divisor) as f64 / 1000.0;

    // The nodes. Busy ones own their GPUs through a live model process each.
    let dead = nonexistent_pid();
    let mut nodes = Vec::with_capacity(nodes_wanted);
    for (index, kind) in kinds(nodes_wanted).into_iter().enumerate() {
        let rig = Rig::new().with_gpu_nodes(GPUS);
        // An inference server as vLLM starts one: its worker holds GPU 0's context.
        let server = (kind == Kind::LeftBehind)
            .then(|| Model::cuda("api-server", &rig.device(0)).spawn_server(1, "engine-core"));
        // A training job on all eight GPUs: one process with a context (a mapping) on
        // each, as NVML lists it as their owner.
        let owner = (kind == Kind::Busy).then(|| {
            (1..GPUS)
                .fold(Model::cuda("cuda-job", &rig.device(0)), |model, minor| {
                    model.also_mapping(&rig.device(minor))
                })
                .spawn()
        });
        let (server, workers) = match server {
            Some(crate::helpers::Server { server, workers }) => (Some(server), workers),
            None => (None, Vec::new()),
        };
        let owner_pid = owner
            .as_ref()
            .or(workers.first())
            .map(|process| process.pid);
        rig.write_scenario(&Node::before(kind, owner_pid));
        let exporter = rig.start(&[]);
        let hang_ends = rig.dir.path().join("gpu-0-answers-again");
        nodes.push(Node {
            kind,
            cluster: index % CLUSTERS,
            rig,
            exporter,
            _owner: owner,
            server,
            _workers: workers,
            hang_ends,
        });
    }
    let nodes_started = started.elapsed().as_secs_f64();

    // Alertmanager with the shipped example, the central Prometheus with the shipped
    // rules (shortened `for:` only), and one agent per cluster.
    let webhook = Webhook::start();
    let config = tempfile::tempdir().expect("temporary folder");
    let (alertmanager, am_durations) =
        start_alertmanager(&alertmanager_binary, config.path(), divisor, &webhook);
    let shipped_rules =
        std::fs::read_to_string(repository().join("alerts/vram-exporter.rules.yml")).unwrap();
    let (rules, orphan_for_shipped) = shorten_for_durations(&shipped_rules, divisor);
    assert_only_for_lines_differ(&shipped_rules, &rules);
    let orphan_for_s = orphan_for_shipped / divisor as f64;
    let hold = |alert: &str| shipped_for(&shipped_rules, alert) / divisor as f64;
    let nvml_down_for_s = hold("VRAMNvmlDown");
    let hung_for_s = hold("VRAMGpuNotAnswering");
    let left_behind_for_s = hold("VRAMLeftBehindMemory");
    let rules_file = config.path().join("vram-exporter.rules.yml");
    std::fs::write(&rules_file, rules).unwrap();
    let central_config = config.path().join("central.yml");
    std::fs::write(
        &central_config,
        format!(
            "global:\n  evaluation_interval: {interval}\n\
             rule_files:\n  - {rules}\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n",
            rules = rules_file.display(),
            am = alertmanager.address,
        ),
    )
    .unwrap();
    let central_data = config.path().join("central");
    let central = Server::start("central prometheus", |address| {
        let mut command = Command::new(&prometheus_binary);
        command
            .arg(format!("--config.file={}", central_config.display()))
            .arg(format!("--storage.tsdb.path={}", central_data.display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--web.enable-remote-write-receiver");
        command
    });
    let mut agents = Vec::new();
    for cluster in 0..CLUSTERS {
        let targets: Vec<String> = nodes
            .iter()
            .filter(|node| node.cluster == cluster)
            .map(|node| format!("'{}'", node.instance()))
            .collect();
        let agent_config = config.path().join(format!("agent-{cluster}.yml"));
        std::fs::write(
            &agent_config,
            format!(
                "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  \
                 external_labels:\n    cluster: cluster-{cluster}\n\
                 scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: [{targets}]\n\
                 remote_write:\n  - url: http://{central}/api/v1/write\n    queue_config:\n      \
                 batch_send_deadline: {deadline}\n",
                targets = targets.join(", "),
                central = central.address,
                deadline = duration_text(SHIPPED_BATCH_DEADLINE_MS / divisor),
            ),
        )
        .unwrap();
        let agent_data = config.path().join(format!("agent-{cluster}"));
        agents.push(Server::start("agent prometheus", |address| {
            let mut command = Command::new(&prometheus_binary);
            command
                .arg("--enable-feature=agent")
                .arg(format!("--config.file={}", agent_config.display()))
                .arg(format!("--storage.agent.path={}", agent_data.display()))
                .arg(format!("--web.listen-address={address}"));
            command
        }));
    }

    // The whole fleet reaches the central Prometheus, and it knows Alertmanager.
    let setup_wait = Duration::from_secs_f64(60.0 + 4.0 * interval_s + nodes.len() as f64 * 0.2);
    let up_query = format!("count(up{{job=\"{JOB}\"}} == 1)");
    wait_until(
        "every node is up in the central Prometheus",
        setup_wait,
        || {
            central
                .query(&up_query)
                .first()
                .is_some_and(|sample| sample["value"][1] == nodes.len().to_string().as_str())
        },
    );
    wait_until(
        "the central Prometheus has discovered Alertmanager",
        setup_wait,
        || {
            central.api("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
                .as_array()
                .is_some_and(|active| !active.is_empty())
        },
    );
    let clusters = central.query("count by (cluster) (vram_build_info)");
    assert_eq!(
        clusters.len(),
        CLUSTERS,
        "every agent adds its cluster: {clusters:?}"
    );

    // Series per node before the incident.
    let idle_node = nodes.iter().find(|node| node.kind == Kind::Idle).unwrap();
    let busy_node = nodes.iter().find(|node| node.kind == Kind::Busy).unwrap();
    let idle_series = series_count(&idle_node.exporter);
    let busy_series = series_count(&busy_node.exporter);
    assert!(
        webhook.notifications().is_empty(),
        "a healthy fleet notifies nothing: {:?}",
        webhook.alert_names()
    );

    // The incident, on every node at once.
    for node in &mut nodes {
        node.break_down(dead);
    }
    let incident = Instant::now();
    let incident_wall = unix_now();

    // What the on-call must receive: (alert name, instance, gpu) firing, each expected
    // once. The NVML outage is one alert per node too, grouped per cluster.
    let mut expected: BTreeSet<(String, String, String)> = BTreeSet::new();
    for node in &nodes {
        let instance = node.instance();
        let mut expect = |name: &str, gpu: &str| {
            expected.insert((name.to_string(), instance.clone(), gpu.to_string()));
        };
        match node.kind {
            Kind::Orphaned => {
                expect("VRAMOrphanedMemory", "0");
                expect("VRAMOrphanedMemory", "3");
            }
            Kind::HungBesideOrphan => {
                expect("VRAMGpuNotAnswering", "0");
                expect("VRAMOrphanedMemory", "1");
            }
            Kind::NvmlDown => expect("VRAMNvmlDown", ""),
            Kind::LeftBehind => expect("VRAMLeftBehindMemory", "0"),
            Kind::Idle | Kind::Busy => {}
        }
    }
    // The bounds docs/fleet.md derives: the next scrape, the next remote-write batch, the
    // evaluation that sees it (pending), `for:`, the evaluation that fires it, then
    // Alertmanager's group_wait.
    let group_wait = am_durations["group_wait"];
    let group_interval = am_durations["group_interval"];
    let path_s = interval_s + batch_deadline_s + 2.0 * interval_s + group_wait;
    let bound = |for_s: f64| path_s + for_s + SLACK_S;
    let orphan_bound = bound(orphan_for_s);
    let hung_bound = bound(hung_for_s);
    let nvml_bound = bound(nvml_down_for_s);
    let left_behind_bound = bound(left_behind_for_s);
    let slowest_bound = [orphan_bound, hung_bound, nvml_bound, left_behind_bound]
        .into_iter()
        .fold(0.0, f64::max);
    let deadline = incident + Duration::from_secs_f64(slowest_bound + 5.0);
    let key = |alert: &Value| {
        (
            label(alert, "alertname").to_string(),
            label(alert, "instance").to_string(),
            label(alert, "gpu").to_string(),
        )
    };
    loop {
        let seen: BTreeSet<_> = notified_alerts(&webhook)
            .iter()
            .filter(|(_, _, alert)| alert["status"] == "firing")
            .map(|(_, _, alert)| key(alert))
            .collect();
        let missing: Vec<_> = expected.difference(&seen).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} expected alerts were not notified within {:.1} s, e.g. {:?}; notified: {:?}",
            missing.len(),
            deadline.duration_since(incident).as_secs_f64(),
            &missing[..missing.len().min(5)],
            webhook.alert_names()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let all_notified = incident.elapsed().as_secs_f64();
    // Anything sent twice or late would come at the next group_interval: wait it out.
    let quiet = Duration::from_secs_f64(group_interval + 2.0 * interval_s + batch_deadline_s + 2.0);
    std::thread::sleep(quiet);

    let notified = notified_alerts(&webhook);
    let firing: Vec<&(Instant, String, Value)> = notified
        .iter()
        .filter(|(_, _, alert)| alert["status"] == "firing")
        .collect();
    // Nothing unexpected, and each expected alert once.
    let mut times: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for (at, _, alert) in &firing {
        times
            .entry(key(alert))
            .or_default()
            .push(at.duration_since(incident).as_secs_f64());
    }
    let unexpected: Vec<_> = times.keys().filter(|k| !expected.contains(*k)).collect();
    assert!(
        unexpected.is_empty(),
        "notified although nothing should say so: {unexpected:?}"
    );
    let repeated: Vec<_> = times.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(repeated.is_empty(), "notified more than once: {repeated:?}");

    // Each orphaned node: one notification, both GPUs in it, within the bound.
    let mut orphan_seconds = Vec::new();
    for node in nodes.iter().filter(|node| node.kind == Kind::Orphaned) {
        let instance = node.instance();
        let notifications: BTreeSet<&String> = firing
            .iter()
            .filter(|(_, _, alert)| label(alert, "instance") == instance)
            .map(|(_, group, _)| group)
            .collect();
        assert_eq!(
            notifications.len(),
            1,
            "{instance} pages once: {notifications:?}"
        );
        let seconds = times[&("VRAMOrphanedMemory".into(), instance.clone(), "0".into())][0];
        assert!(
            seconds <= orphan_bound,
            "{instance}: paged after {seconds:.1} s, beyond {orphan_bound:.1} s"
        );
        orphan_seconds.push(seconds);
    }
    // The hung GPU beside an orphan: both page, each once (checked above), in time.
    for node in nodes
        .iter()
        .filter(|node| node.kind == Kind::HungBesideOrphan)
    {
        let instance = node.instance();
        let hung = times[&("VRAMGpuNotAnswering".into(), instance.clone(), "0".into())][0];
        let orphan = times[&("VRAMOrphanedMemory".into(), instance.clone(), "1".into())][0];
        assert!(
            hung <= hung_bound,
            "{instance}: the hung GPU paged after {hung:.1} s"
        );
        assert!(
            orphan <= orphan_bound,
            "{instance}: its orphan paged after {orphan:.1} s"
        );
    }
    // Each left-behind node pages once, in time.
    let mut left_behind_seconds = Vec::new();
    for node in nodes.iter().filter(|node| node.kind == Kind::LeftBehind) {
        let instance = node.instance();
        let seconds = times[&("VRAMLeftBehindMemory".into(), instance.clone(), "0".into())][0];
        assert!(
            seconds <= left_behind_bound,
            "{instance}: left behind paged after {seconds:.1} s, beyond {left_behind_bound:.1} s"
        );
        left_behind_seconds.push(seconds);
    }
    // The NVML outage: at most two notifications per cluster, each node in one, nothing
    // about the memory of those nodes.
    let down: BTreeSet<String> = nodes
        .iter()
        .filter(|node| node.kind == Kind::NvmlDown)
        .map(Node::instance)
        .collect();
    let outage_notifications = webhook
        .notifications()
        .iter()
        .filter(|(_, notification)| notification["groupLabels"]["alertname"] == "VRAMNvmlDown")
        .count();
    let outage_bound = 2 * CLUSTERS;
    assert!(
        outage_notifications <= outage_bound,
        "{} nodes losing NVML sent {outage_notifications} notifications, more than {outage_bound}",
        down.len()
    );
    let mut nvml_seconds: Vec<f64> = down
        .iter()
        .map(|instance| times[&("VRAMNvmlDown".into(), instance.clone(), String::new())][0])
        .collect();
    let slowest_outage = nvml_seconds.iter().copied().fold(0.0, f64::max);
    assert!(
        slowest_outage <= nvml_bound,
        "NVML down paged after {slowest_outage:.1} s"
    );
    let about_down: Vec<_> = notified
        .iter()
        .filter(|(_, _, alert)| {
            down.contains(label(alert, "instance")) && label(alert, "alertname") != "VRAMNvmlDown"
        })
        .map(|(_, _, alert)| key(alert))
        .collect();
    assert!(
        about_down.is_empty(),
        "nodes without NVML also notified {about_down:?}"
    );

    // Where an orphan's time goes: Prometheus's activeAt (pending) and Alertmanager's
    // startsAt (firing) for the first orphaned node's GPU 0.
    let first_orphan = nodes
        .iter()
        .find(|node| node.kind == Kind::Orphaned)
        .unwrap();
    let orphan_alert = notified
        .iter()
        .find(|(_, _, alert)| {
            key(alert)
                == (
                    "VRAMOrphanedMemory".into(),
                    first_orphan.instance(),
                    "0".into(),
                )
        })
        .map(|(_, _, alert)| alert.clone())
        .unwrap();
    let fired_after = unix_seconds(orphan_alert["startsAt"].as_str().unwrap()) - incident_wall;
    let central_alerts = central.api("/api/v1/alerts");
    let pending_after = central_alerts["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|alert| {
            alert["labels"]["alertname"] == "VRAMOrphanedMemory"
                && alert["labels"]["instance"] == first_orphan.instance().as_str()
                && alert["labels"]["gpu"] == "0"
        })
        .map(|alert| unix_seconds(alert["activeAt"].as_str().unwrap()) - incident_wall)
        .unwrap_or_else(|| panic!("the central Prometheus lost the alert: {central_alerts}"));

    // The dashboard's Fleet row against the central Prometheus: every query has data, the
    // top nodes are orphaned ones, and the counts by cluster add up to the incident.
    let fleet_queries = crate::dashboard::fleet_row_queries();
    assert!(!fleet_queries.is_empty(), "the dashboard has a Fleet row");
    let mut latencies = Vec::new();
    for query in &fleet_queries {
        let mut took = Vec::new();
        let mut result = Vec::new();
        for _ in 0..5 {
            let asked = Instant::now();
            result = central.query(query);
            took.push(asked.elapsed().as_secs_f64() * 1000.0);
        }
        assert!(
            !result.is_empty(),
            "the Fleet row's query has no data: {query}"
        );
        latencies.push((median(&mut took), query.clone()));
    }
    let orphaned_instances: BTreeSet<String> = nodes
        .iter()
        .filter(|node| matches!(node.kind, Kind::Orphaned | Kind::HungBesideOrphan))
        .map(Node::instance)
        .collect();
    let top = central.query("topk(5, cluster_instance:vram_orphaned_bytes:sum)");
    for sample in &top {
        let instance = sample["metric"]["instance"].as_str().unwrap();
        assert!(
            orphaned_instances.contains(instance) || sample["value"][1] == "0",
            "{instance} ranks among the top orphaned nodes: {top:?}"
        );
    }
    let sum_of = |query: &str| -> f64 {
        central
            .query(&format!("sum({query})"))
            .first()
            .and_then(|sample| sample["value"][1].as_str()?.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(
        sum_of("cluster:vram_nodes_with_orphaned_bytes:count"),
        orphaned_instances.len() as f64
    );
    assert_eq!(
        sum_of("cluster:vram_nodes_nvml_down:count"),
        down.len() as f64
    );
    let left_behind_nodes = nodes.iter().filter(|n| n.kind == Kind::LeftBehind).count();
    assert_eq!(
        sum_of("cluster:vram_nodes_with_left_behind_bytes:count"),
        left_behind_nodes as f64
    );
    let hung_nodes = nodes
        .iter()
        .filter(|n| n.kind == Kind::HungBesideOrphan)
        .count();
    assert_eq!(
        sum_of("cluster:vram_gpus_not_answering:count"),
        hung_nodes as f64
    );

    // Figures: series per node during the incident, samples arriving at the centre,
    // the central Prometheus's memory per 1,000 series.
    let orphan_series = series_count(&first_orphan.exporter);
    let down_series = series_count(
        &nodes
            .iter()
            .find(|node| node.kind == Kind::NvmlDown)
            .unwrap()
            .exporter,
    );
    let appended_before = own_metric(&central, "prometheus_tsdb_head_samples_appended_total");
    let window = Duration::from_secs_f64(4.0 * interval_s);
    std::thread::sleep(window);
    let appended =
        own_metric(&central, "prometheus_tsdb_head_samples_appended_total") - appended_before;
    let samples_per_second = appended / window.as_secs_f64();
    let head_series = own_metric(&central, "prometheus_tsdb_head_series");
    let central_rss = resident_bytes(central.pid()) as f64;
    let agents_rss: f64 = agents
        .iter()
        .map(|agent| resident_bytes(agent.pid()) as f64)
        .sum();
    let exporters_rss: f64 = nodes
        .iter()
        .map(|node| resident_bytes(node.exporter.child.id()) as f64)
        .sum();
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    let run_seconds = started.elapsed().as_secs_f64();
    let exporters_cpu: f64 = nodes
        .iter()
        .map(|node| cpu_seconds(node.exporter.child.id()))
        .sum();
    let agents_cpu: f64 = agents.iter().map(|agent| cpu_seconds(agent.pid())).sum();
    let central_cpu = cpu_seconds(central.pid());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let counts: BTreeMap<Kind, usize> = nodes.iter().fold(BTreeMap::new(), |mut counts, node| {
        *counts.entry(node.kind).or_default() += 1;
        counts
    });
    latencies.sort_by(|a, b| b.0.total_cmp(&a.0));
    eprintln!(
        "\nfleet: {n} nodes of {GPUS} GPUs in {CLUSTERS} clusters {counts:?}, durations / {divisor} \
         (scrape and evaluation {interval}, VRAMOrphanedMemory for: {orphan_for_s}s, \
         group_wait {group_wait}s, group_interval {group_interval}s)\n  \
         exporters started in {nodes_started:.1} s; whole test {total:.1} s\n  \
         series per node: idle {idle_series}, busy {busy_series}, orphaned {orphan_series}, NVML down {down_series}\n  \
         central Prometheus: {head_series} head series, {samples_per_second:.0} samples/s appended \
         ({per_node:.2} per node), resident {central_mib:.0} MiB ({per_thousand:.2} MiB per 1,000 series)\n  \
         agents resident {agents_mib:.0} MiB together; exporters {exporters_mib:.0} MiB together\n  \
         CPU over {run_seconds:.0} s: exporters {exporters_cpu:.1} s, agents {agents_cpu:.1} s, central {central_cpu:.1} s; load average {load}\n  \
         orphan -> pending (activeAt) {pending_after:.2} s, -> firing (startsAt) {fired_after:.2} s\n  \
         orphan -> notification: min {o_min:.2} s, median {o_med:.2} s, max {o_max:.2} s (bound {orphan_bound:.1} s)\n  \
         NVML down -> notification: median {n_med:.2} s, max {slowest_outage:.2} s (bound {nvml_bound:.1} s)\n  \
         server killed -> left-behind notification: max {l_max:.2} s (bound {left_behind_bound:.1} s)\n  \
         every expected alert notified after {all_notified:.2} s\n  \
         notifications: {total_notifications} in all, {outage_notifications} for {down_n} nodes losing NVML (bound {outage_bound})\n  \
         fleet queries, median of 5 (ms): {latencies:?}",
        n = nodes.len(),
        total = run_seconds,
        load = load.trim(),
        per_node = samples_per_second / nodes.len() as f64,
        central_mib = mib(central_rss),
        per_thousand = mib(central_rss) / (head_series / 1000.0),
        agents_mib = mib(agents_rss),
        exporters_mib = mib(exporters_rss),
        o_min = orphan_seconds.iter().copied().fold(f64::MAX, f64::min),
        o_med = median(&mut orphan_seconds.clone()),
        o_max = orphan_seconds.iter().copied().fold(0.0, f64::max),
        n_med = median(&mut nvml_seconds),
        l_max = left_behind_seconds.iter().copied().fold(0.0, f64::max),
        total_notifications = webhook.notifications().len(),
        down_n = down.len(),
    );
    drop(agents);
    drop(nodes);
}
