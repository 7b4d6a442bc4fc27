//! Every panel against a real Prometheus that scrapes the real exporter while a real
//! child process holds a fork orphan's memory.

use super::{
    all_panels, fleet_row_panels, load_dashboard, metric_names, substitute_with, targets,
    REQUIRED_VARIABLES,
};
use crate::helpers::*;
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

/// Panels that return nothing in the live test's scenario, each with why. Every target of
/// such a panel must then return nothing (an entry cannot go stale), and every other
/// panel's targets must return data.
const EMPTY_IN_THE_LIVE_SCENARIO: &[(&str, &str)] = &[(
    "/proc entries unreadable per scrape (top 10 targets)",
    "the exporter runs as root and reads every /proc entry it looks at; e2e.rs's host B, \
     which may not read root's, gives this panel data",
)];

/// Panels, each with its targets' PromQL, in the dashboard's order; the Fleet row is left
/// to fleet/incidents.rs, which runs it over clusters of nodes and the recording rules it
/// reads.
fn panel_queries(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    let fleet: Vec<&Value> = fleet_row_panels(dashboard);
    all_panels(dashboard)
        .into_iter()
        .filter(|panel| targets(panel).next().is_some())
        .filter(|panel| {
            !fleet
                .iter()
                .any(|fleet_panel| std::ptr::eq(*fleet_panel, *panel))
        })
        .map(|panel| {
            (
                panel["title"].as_str().unwrap_or("untitled").to_string(),
                targets(panel)
                    .filter_map(|target| target["expr"].as_str())
                    .map(str::to_string)
                    .collect(),
            )
        })
        .collect()
}

/// One value as Grafana writes it into a `=~` matcher of a Prometheus query: regular
/// expression characters escaped, and the escapes doubled for the PromQL string.
fn regex_value(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if c == '\\' {
            out.push_str("\\\\\\\\");
        } else if "$^*{}[]'+?.()|".contains(c) {
            out.push_str("\\\\");
            out.push(c);
        } else {
            out.push(c);
        }
    }
    out
}

/// A selection of several values, as Grafana writes a multi-value variable.
fn regex_selection(values: &[String]) -> String {
    match values {
        [one] => regex_value(one),
        many => format!(
            "({})",
            many.iter()
                .map(|value| regex_value(value))
                .collect::<Vec<_>>()
                .join("|")
        ),
    }
}

/// The values `label_values(SELECTOR, LABEL)` offers, asked the way Grafana asks.
fn label_values(prometheus: &crate::monitoring::Server, query: &str) -> Vec<String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let answer = prometheus.api(&format!(
        "/api/v1/label/{}/values?match[]={}",
        label.trim(),
        crate::monitoring::percent_encode(selector.trim())
    ));
    answer["data"]
        .as_array()
        .unwrap_or_else(|| panic!("{query}: {answer}"))
        .iter()
        .map(|value| value.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_panel_has_data_from_a_real_prometheus_scraping_a_fork_orphan() {
    const JOB: &str = "vram-exporter";
    const WAIT: Duration = Duration::from_secs(30);
    let prometheus_binary = require_tool("prometheus", "prometheus");

    // The fork-inherited orphan on GPU 0, held by a live child; GPU 1 fails, so the
    // panels about failing GPUs have something to show.
    let rig = Rig::new();
    let (dead_owner, holder) = Holder::fork_orphan(&rig.device(0));
    let scenario = Gpus::new()
        .gpu(
            Gpu::one_owner(0, dead_owner)
                .recovery_action(0)
                .remapped_rows(0, 0, false, false),
        )
        .gpu(Gpu::idle(1).error("nvmlDeviceGetMemoryInfo_v2", "Unknown"))
        .gpu(Gpu::idle(2).mig(vec![MigDevice::new(2, 1)]))
        .into_json();
    rig.write_scenario(&scenario);
    // A kubelet that assigned GPU 0 to a pod, for the panels that name pods.
    let kubelet = StandInKubelet::start(Behaviour::Answer(vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&Gpu::uuid(0)])])
    ]));
    let exporter = rig.start(&[
        "--kubelet.pod-resources-path",
        &kubelet.socket_arg(),
        "--kubelet.refresh-interval",
        "100ms",
    ]);
    // A critical Xid after the exporter started watching: the event panels have data.
    wait_until("the exporter watches Xid events", WAIT, || {
        exporter.scrape().value("vram_xid_watched", &[("gpu", "0")]) == 1.0
    });
    rig.write_scenario(&with_xid_events(scenario, &[(1, 0, 79)]));

    let config = tempfile::tempdir().expect("temporary folder");
    let prometheus_config = config.path().join("prometheus.yml");
    std::fs::write(
        &prometheus_config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['{}']\n",
            exporter.address
        ),
    )
    .unwrap();
    let data = config.path().join("data");
    let prometheus = crate::monitoring::Server::start("prometheus", |address| {
        let mut command = Command::new(&prometheus_binary);
        command
            .arg(format!("--config.file={}", prometheus_config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={address}"));
        command
    });
    let holder_series = format!("vram_holder_info{{pid=\"{}\"}}", holder.pid);
    wait_until(
        "Prometheus has scraped the holder and the GPU's pod",
        WAIT,
        || {
            !prometheus.query(&holder_series).is_empty()
                && !prometheus.query("vram_gpu_pod_info").is_empty()
        },
    );

    // The variables, each asked with the ones before it selected, as Grafana chains them.
    let dashboard = load_dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let mut chosen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in REQUIRED_VARIABLES {
        let variable = variables.iter().find(|var| var["name"] == *name).unwrap();
        let query = variable["query"]["query"].as_str().unwrap();
        let asked = substitute_with(query, |earlier| regex_selection(&chosen[earlier]));
        let mut values = label_values(&prometheus, &asked);
        values.sort();
        chosen.insert(name.to_string(), values);
    }
    assert_eq!(chosen["job"], [JOB]);
    assert_eq!(chosen["instance"], [exporter.address.to_string()]);
    assert_eq!(chosen["gpu"], ["0", "1", "2"]);

    let panels = panel_queries(&dashboard);
    for (title, _) in EMPTY_IN_THE_LIVE_SCENARIO {
        assert!(
            panels.iter().any(|(panel, _)| panel == title),
            "EMPTY_IN_THE_LIVE_SCENARIO names {title:?}, which the dashboard does not have"
        );
    }
    // Every value of every variable selected, then "All" (`.*`): what a person sees.
    type Selection<'a> = (&'a str, &'a dyn Fn(&str) -> String);
    let selections: [Selection; 2] = [
        ("every value selected", &|name| {
            regex_selection(&chosen[name])
        }),
        ("All", &|_| ".*".to_string()),
    ];
    for (selection, value) in selections {
        for (title, queries) in &panels {
            let empty_because = EMPTY_IN_THE_LIVE_SCENARIO
                .iter()
                .find(|(panel, _)| panel == title)
                .map(|(_, why)| *why);
            for query in queries {
                let query = substitute_with(query, value);
                match empty_because {
                    None => wait_until(
                        &format!("panel {title:?} ({selection}) has data: {query}"),
                        Duration::from_secs(10),
                        || !prometheus.query(&query).is_empty(),
                    ),
                    Some(why) => assert_eq!(
                        prometheus.query(&query),
                        Vec::<Value>::new(),
                        "panel {title:?} ({selection}) is listed as empty here ({why}), but {query} has data"
                    ),
                }
            }
        }
    }

    // `or vector(0)` must not hide a metric that is not there: every metric a panel
    // reads is in Prometheus.
    let metrics: BTreeSet<String> = panels
        .iter()
        .flat_map(|(_, queries)| queries.iter().flat_map(|query| metric_names(query)))
        .collect();
    for metric in &metrics {
        assert!(
            !prometheus
                .query(&format!("count({{__name__=\"{metric}\"}})"))
                .is_empty(),
            "the dashboard reads {metric}, which the exporter does not export"
        );
    }

    // Two panels checked for their figures, not only for having some.
    let first_query = |title: &str| -> Vec<Value> {
        let (_, queries) = panels
            .iter()
            .find(|(panel, _)| panel == title)
            .unwrap_or_else(|| panic!("the dashboard has no panel {title:?}"));
        prometheus.query(&substitute_with(&queries[0], |_| ".*".to_string()))
    };
    let orphaned = first_query("Orphaned memory");
    assert_eq!(orphaned.len(), 1, "{orphaned:?}");
    assert_eq!(orphaned[0]["value"][1], CHARGED.to_string().as_str());
    let holders = first_query("Culprits (the processes to end)");
    assert!(
        holders
            .iter()
            .any(|series| series["metric"]["pid"] == holder.pid.to_string().as_str()),
        "the holders table names the live holder {}: {holders:?}",
        holder.pid
    );
}
