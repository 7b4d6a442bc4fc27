//! `dashboards/vram-exporter.json`: what grafana.com's import flow needs (`__inputs` for
//! the data source, `__requires`, schema version, unique panel ids, a datasource variable
//! every query goes through, chained `job`/`instance`/`gpu` variables, no hard-coded
//! instance), PromQL that parses and asks only for the exporter's metrics, and every
//! panel's queries run against a real Prometheus that scrapes the real exporter while a
//! real child process holds a fork orphan's memory.

use crate::helpers::*;
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Every metric the exporter promises (its metric contract); dashboards and rules may ask
/// for these and for Prometheus's own `up`, nothing else.
pub(crate) const CONTRACT_METRICS: &[&str] = &[
    "vram_gpu_info",
    "vram_gpu_up",
    "vram_gpu_error",
    "vram_gpu_stuck_seconds",
    "vram_total_bytes",
    "vram_used_bytes",
    "vram_reserved_bytes",
    "vram_free_bytes",
    "vram_owner_processes",
    "vram_owned_bytes",
    "vram_orphaned_bytes",
    "vram_left_behind_bytes",
    "vram_left_behind_since_timestamp_seconds",
    "vram_unattributed_bytes",
    "vram_left_behind_bytes",
    "vram_left_behind_since_timestamp_seconds",
    "vram_owner_processes_usage_unavailable",
    "vram_holder_processes",
    "vram_gone_owner_processes",
    "vram_procfs_own_pid_namespace",
    "vram_exited_container_processes",
    "vram_memory_inconsistent",
    "vram_holder_info",
    "vram_holder_scan_duration_seconds",
    "vram_holder_scan_complete",
    "vram_host_pid_namespace",
    "vram_nvml_up",
    "vram_nvml_error",
    "vram_nvml_stuck_seconds",
    "vram_scrape_duration_seconds",
    "vram_build_info",
    "vram_scrape_procfs_unreadable_entries",
    "vram_procfs_stuck_seconds",
    "vram_process_used_bytes",
    // Kubernetes: the kubelet's view.
    "vram_gpu_pod_info",
    "vram_kubelet_up",
    "vram_kubelet_error",
    "vram_kubelet_last_success_timestamp_seconds",
    "vram_kubelet_unmatched_devices",
    // Container engines: their health.
    "vram_container_engine_up",
    "vram_container_engine_error",
    "vram_container_engine_last_success_timestamp_seconds",
    // MIG devices and what the driver says a GPU needs.
    "vram_gpu_mig_mode",
    "vram_gpu_mig_mode_pending",
    "vram_mig_info",
    "vram_mig_up",
    "vram_mig_total_bytes",
    "vram_mig_used_bytes",
    "vram_mig_reserved_bytes",
    "vram_mig_free_bytes",
    "vram_mig_processes",
    "vram_mig_process_list_denied",
    "vram_gpu_process_list_denied",
    "vram_gpu_recovery_action",
    "vram_gpu_remapped_rows",
    "vram_gpu_row_remap_pending",
    "vram_gpu_row_remap_failure",
    "vram_gpu_retired_pages",
    "vram_gpu_retired_pages_pending",
    "vram_gpu_memory_os_managed",
    "vram_xid_watched",
    "vram_xid_errors_total",
];

/// Template variables the dashboard must offer, besides the datasource, in their chain's
/// order: each one's query selects by every variable before it.
const REQUIRED_VARIABLES: &[&str] = &["job", "instance", "gpu"];

fn dashboard_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards/vram-exporter.json")
}

fn load_dashboard() -> Value {
    let path = dashboard_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{} is not valid JSON: {err}", path.display()))
}

/// Every panel, including those nested in (collapsed) rows.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The title of the row that holds the fleet's panels: they read the fleet recording
/// rules, by cluster and node, over a central store (fleet.rs runs them against one).
const FLEET_ROW: &str = "Fleet (clusters and nodes, from the fleet recording rules)";

/// The panels of the Fleet row: those that follow it, up to the next row.
fn fleet_row_panels(dashboard: &Value) -> Vec<&Value> {
    let top = dashboard["panels"].as_array().unwrap();
    let row = top
        .iter()
        .position(|panel| panel["type"] == "row" && panel["title"] == FLEET_ROW)
        .unwrap_or_else(|| panic!("the dashboard has no row {FLEET_ROW:?}"));
    top[row + 1..]
        .iter()
        .take_while(|panel| panel["type"] != "row")
        .collect()
}

/// The Fleet row's PromQL with every variable as "All" (`.*`), for a live Prometheus.
pub fn fleet_row_queries() -> Vec<String> {
    let dashboard = load_dashboard();
    fleet_row_panels(&dashboard)
        .into_iter()
        .flat_map(targets)
        .filter_map(|target| target["expr"].as_str())
        .map(substitute_variables)
        .collect()
}

/// The names the shipped rules record (`record:`), which dashboards may read besides the
/// exporter's metrics.
fn recorded_names() -> Vec<String> {
    let rules = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("alerts/vram-exporter.rules.yml"),
    )
    .expect("the rules file");
    rules
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- record:"))
        .map(|name| name.trim().to_string())
        .collect()
}

fn panel_name(panel: &Value) -> String {
    format!(
        "panel {} ({:?})",
        panel["id"],
        panel["title"].as_str().unwrap_or("untitled")
    )
}

fn targets(panel: &Value) -> impl Iterator<Item = &Value> {
    panel["targets"].as_array().into_iter().flatten()
}

/// Every PromQL expression of the dashboard exactly as Grafana sends it (variables left in).
fn raw_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in all_panels(dashboard) {
        for target in targets(panel) {
            if let Some(expr) = target["expr"].as_str() {
                out.push((panel_name(panel), expr.to_string()));
            }
        }
    }
    out
}

/// Replace Grafana's template variables so that the query runs as it is against a live
/// Prometheus: the interval variables become `5m`, every other variable `.*` (each one
/// stands inside a `=~` matcher, where `.*` selects everything).
fn substitute_variables(expr: &str) -> String {
    substitute_with(expr, |_| ".*".to_string())
}

/// Replace every template variable (`$name`, `${name}`, `${name:format}`, `[[name]]`) of
/// `expr` with `value(name)`; Grafana's interval variables (`$__...`) become `5m`.
fn substitute_with(expr: &str, value: impl Fn(&str) -> String) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len());
    let mut i = 0;
    while i < chars.len() {
        let (name, next) = if chars[i] == '$' && chars.get(i + 1) == Some(&'{') {
            match chars[i + 2..].iter().position(|&c| c == '}') {
                Some(len) => {
                    let inner: String = chars[i + 2..i + 2 + len].iter().collect();
                    let name = inner.split(':').next().unwrap_or("").to_string();
                    (Some(name), i + 3 + len)
                }
                None => (None, i + 1),
            }
        } else if chars[i] == '$' {
            let len = chars[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                .count();
            if len == 0 {
                (None, i + 1)
            } else {
                (
                    Some(chars[i + 1..i + 1 + len].iter().collect()),
                    i + 1 + len,
                )
            }
        } else if chars[i] == '[' && chars.get(i + 1) == Some(&'[') {
            match chars[i + 2..].windows(2).position(|w| w == [']', ']']) {
                Some(len) => (
                    Some(chars[i + 2..i + 2 + len].iter().collect()),
                    i + 4 + len,
                ),
                None => (None, i + 1),
            }
        } else {
            (None, i + 1)
        };
        match name {
            Some(name) if name.starts_with("__") => out.push_str("5m"),
            Some(name) => out.push_str(&value(&name)),
            None => out.push(chars[i]),
        }
        i = next;
    }
    out
}

/// Every PromQL expression of the dashboard with its template variables substituted, ready
/// to run against a live Prometheus (see `substitute_variables`).
pub fn dashboard_queries() -> Vec<String> {
    raw_queries(&load_dashboard())
        .into_iter()
        .map(|(_, expr)| substitute_variables(&expr))
        .collect()
}

/// Functions and aggregation operators: identifiers that are never metric names.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords that take a parenthesised label list.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Other keywords and literals.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end",
];

/// The metric names a PromQL expression selects (a small tokenizer: it skips strings,
/// label matchers, ranges, template variables, functions, aggregations and keywords, and
/// what remains are metric names).
pub(crate) fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_string = |mut i: usize| -> usize {
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            if chars[i] == '\\' && quote != '`' {
                i += 1;
            }
            i += 1;
        }
        i + 1
    };
    let skip_group = |mut i: usize, open: char, close: char| -> usize {
        let mut depth = 0usize;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => {
                    i = skip_string(i);
                    continue;
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i
    };
    let is_ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(i);
        } else if c == '{' {
            i = skip_group(i, '{', '}');
        } else if c == '[' {
            i = skip_group(i, '[', ']');
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(i, '{', '}');
            } else {
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let followed_by_paren = chars.get(next) == Some(&'(');
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                if followed_by_paren {
                    i = skip_group(next, '(', ')');
                }
            } else if followed_by_paren
                || AGGREGATIONS.contains(&lower.as_str())
                || KEYWORDS.contains(&lower.as_str())
            {
                // a function call, an aggregation or a keyword
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The first imbalance of (), {} and [] outside string literals, if any.
pub(crate) fn unbalanced(expr: &str) -> Option<String> {
    let mut stack = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let quote = c;
                let mut closed = false;
                while let Some(d) = chars.next() {
                    if d == '\\' && quote != '`' {
                        chars.next();
                    } else if d == quote {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Some(format!("unterminated string starting with {quote}"));
                }
            }
            '(' | '{' | '[' => stack.push(c),
            ')' | '}' | ']' => {
                let open = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                if stack.pop() != Some(open) {
                    return Some(format!("unexpected {c}"));
                }
            }
            _ => {}
        }
    }
    stack.last().map(|open| format!("unclosed {open}"))
}

/// The name of the datasource variable (type `datasource`, plugin `prometheus`).
fn datasource_variable(dashboard: &Value) -> String {
    let list = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list is missing");
    let vars: Vec<&Value> = list
        .iter()
        .filter(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .collect();
    assert_eq!(
        vars.len(),
        1,
        "need exactly one template variable of type datasource with query \"prometheus\""
    );
    vars[0]["name"]
        .as_str()
        .expect("datasource variable has no name")
        .to_string()
}

/// Whether a panel's, target's or variable's `datasource` refers to the variable.
fn refers_to(datasource: &Value, variable: &str) -> bool {
    let wanted = [format!("${{{variable}}}"), format!("${variable}")];
    match datasource {
        Value::String(s) => wanted.contains(s),
        Value::Object(o) => {
            o.get("uid")
                .and_then(Value::as_str)
                .is_some_and(|uid| wanted.iter().any(|w| w == uid))
                && o.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("prometheus")
                    == "prometheus"
        }
        _ => false,
    }
}

#[test]
fn dashboard_has_a_schema_version_grafana_imports() {
    let dashboard = load_dashboard();
    let version = dashboard["schemaVersion"]
        .as_u64()
        .expect("schemaVersion is missing or not a number");
    assert!(version >= 36, "schemaVersion {version} is below 36");
    assert!(
        dashboard["title"].as_str().is_some_and(|t| !t.is_empty()),
        "the dashboard needs a title"
    );
    assert!(
        dashboard["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40),
        "the dashboard needs a stable uid of at most 40 characters"
    );
    assert!(
        dashboard["id"].is_null(),
        "an importable dashboard has \"id\": null"
    );
}

#[test]
fn dashboard_panel_ids_are_unique_including_nested_panels() {
    let dashboard = load_dashboard();
    let panels = all_panels(&dashboard);
    assert!(!panels.is_empty(), "the dashboard has no panels");
    let mut seen = HashSet::new();
    for panel in &panels {
        let id = panel["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("{} has no numeric id", panel_name(panel)));
        assert!(seen.insert(id), "panel id {id} is used twice");
        assert!(
            panel["type"].as_str().is_some(),
            "{} has no type",
            panel_name(panel)
        );
        let grid = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(
                grid[key].as_u64().is_some(),
                "{} has no gridPos.{key}",
                panel_name(panel)
            );
        }
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{} is wider than the 24-column grid",
            panel_name(panel)
        );
    }
}

#[test]
fn dashboard_queries_go_through_the_datasource_variable() {
    let dashboard = load_dashboard();
    let variable = datasource_variable(&dashboard);
    for panel in all_panels(&dashboard) {
        let has_targets = targets(panel).next().is_some();
        let datasource = &panel["datasource"];
        if has_targets || !datasource.is_null() {
            assert!(
                refers_to(datasource, &variable),
                "{} has datasource {datasource} instead of ${{{variable}}}",
                panel_name(panel)
            );
        }
        for target in targets(panel) {
            assert!(
                refers_to(&target["datasource"], &variable),
                "a target of {} has datasource {} instead of ${{{variable}}}",
                panel_name(panel),
                target["datasource"]
            );
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if var["type"] == "query" {
            assert!(
                refers_to(&var["datasource"], &variable),
                "template variable {} has datasource {} instead of ${{{variable}}}",
                var["name"],
                var["datasource"]
            );
        }
    }
}

#[test]
fn dashboard_offers_chained_job_instance_and_gpu_variables_from_label_values() {
    let dashboard = load_dashboard();
    let list = dashboard["templating"]["list"].as_array().unwrap();
    let names: Vec<&str> = list.iter().filter_map(|v| v["name"].as_str()).collect();
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "template variable names repeat: {names:?}"
    );
    for wanted in REQUIRED_VARIABLES {
        let var = list
            .iter()
            .find(|v| v["name"] == *wanted)
            .unwrap_or_else(|| panic!("template variable {wanted} is missing"));
        assert_eq!(
            var["type"], "query",
            "variable {wanted} must be a query variable"
        );
        let query = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .or_else(|| var["definition"].as_str())
            .unwrap_or_else(|| panic!("variable {wanted} has no query"));
        let query = query.trim();
        assert!(
            query.starts_with("label_values(") && query.ends_with(&format!(", {wanted})")),
            "variable {wanted} must come from label_values(..., {wanted}), not {query:?}"
        );
        let inner = &query["label_values(".len()..query.len() - format!(", {wanted})").len()];
        // The chain: each variable offers only what the ones before it select.
        let position = REQUIRED_VARIABLES
            .iter()
            .position(|name| name == wanted)
            .unwrap();
        for earlier in &REQUIRED_VARIABLES[..position] {
            assert!(
                inner.contains(&format!("{earlier}=~\"${earlier}\"")),
                "variable {wanted} must select {earlier}=~\"${earlier}\": {query}"
            );
        }
        for metric in metric_names(inner) {
            assert!(
                CONTRACT_METRICS.contains(&metric.as_str()),
                "variable {wanted} reads {metric}, which the exporter does not export"
            );
        }
    }
    // A repeated panel must repeat over a variable that exists.
    for panel in all_panels(&dashboard) {
        if let Some(repeat) = panel["repeat"].as_str() {
            assert!(
                unique.contains(repeat),
                "{} repeats over unknown variable {repeat}",
                panel_name(panel)
            );
        }
    }
}

#[test]
fn dashboard_queries_name_no_instance() {
    for (panel, expr) in raw_queries(&load_dashboard()) {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("instance") {
            let before_ok = at == 0 || {
                let c = rest.as_bytes()[at - 1] as char;
                !(c.is_ascii_alphanumeric() || c == '_')
            };
            let after = rest[at + "instance".len()..].trim_start();
            rest = &rest[at + "instance".len()..];
            if !before_ok {
                continue;
            }
            let Some(op) = ["=~", "!~", "!=", "="]
                .iter()
                .find(|op| after.starts_with(**op))
            else {
                continue; // a label name in by (...), on (...), or a legend
            };
            let value = after[op.len()..].trim_start();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.split('"').next())
                .unwrap_or(value);
            // The Fleet row names the same label its node.
            assert!(
                *op == "=~" && ["$instance", "${instance}", "$node", "${node}"].contains(&value),
                "{panel}: instance must be selected as instance=~\"$instance\" (or $node), found instance{op}\"{value}\" in {expr}"
            );
        }
        assert!(
            !expr.contains(":9077"),
            "{panel}: hard-coded exporter address in {expr}"
        );
    }
}

#[test]
fn dashboard_queries_ask_only_for_exporter_metrics_and_up() {
    let queries = raw_queries(&load_dashboard());
    assert!(!queries.is_empty(), "the dashboard has no queries");
    let recorded = recorded_names();
    for (panel, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{panel}: no metric found in {expr}");
        for name in names {
            assert!(
                name == "up"
                    || CONTRACT_METRICS.contains(&name.as_str())
                    || recorded.contains(&name),
                "{panel}: {name} is not an exporter metric (in {expr})"
            );
        }
    }
}

#[test]
fn dashboard_byte_panels_use_iec_bytes() {
    let dashboard = load_dashboard();
    for panel in all_panels(&dashboard) {
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        assert_ne!(
            unit,
            Some("decbytes"),
            "{}: use the IEC unit \"bytes\"",
            panel_name(panel)
        );
        let kind = panel["type"].as_str().unwrap_or("");
        if kind != "timeseries" && kind != "stat" {
            continue;
        }
        let metrics: BTreeSet<String> = targets(panel)
            .filter_map(|t| t["expr"].as_str())
            .flat_map(metric_names)
            .collect();
        let counts = targets(panel)
            .filter_map(|t| t["expr"].as_str())
            .any(|e| e.contains("count("));
        if !counts && !metrics.is_empty() && metrics.iter().all(|m| m.ends_with("_bytes")) {
            assert_eq!(
                unit,
                Some("bytes"),
                "{} shows only byte metrics but its unit is {unit:?}",
                panel_name(panel)
            );
        }
    }
}

#[test]
fn dashboard_queries_are_balanced_and_fully_substituted() {
    let queries = dashboard_queries();
    assert!(!queries.is_empty(), "the dashboard has no queries");
    for query in &queries {
        if let Some(problem) = unbalanced(query) {
            panic!("{problem} in {query}");
        }
        assert!(
            !query.contains('$') && !query.contains("[["),
            "a template variable is left in {query}"
        );
    }
}

#[test]
fn dashboard_queries_parse_as_promql() {
    // promtool has no command that parses a bare query, but it parses every expression of
    // a rules file: wrap each query in a recording rule and let `promtool check rules`
    // judge them.
    let queries = dashboard_queries();
    let mut rules = String::from("groups:\n  - name: dashboard-queries\n    rules:\n");
    for (n, query) in queries.iter().enumerate() {
        let quoted = serde_json::to_string(query).expect("a string serialises");
        let _ = writeln!(
            rules,
            "      - record: dashboard_query_{n}\n        expr: {quoted}"
        );
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!(
        "vram-exporter-dashboard-queries-{}-{stamp}.yml",
        std::process::id()
    ));
    std::fs::write(&path, &rules).expect("write the temporary rules file");
    let path_text = path.to_string_lossy().into_owned();
    let (ok, output) = super::alerts::run_promtool(&["check", "rules", path_text.as_str()]);
    let _ = std::fs::remove_file(&path);
    assert!(
        ok,
        "promtool rejected a dashboard query:\n{output}\nqueries, numbered as in the message:\n{}",
        queries
            .iter()
            .enumerate()
            .map(|(n, q)| format!("  dashboard_query_{n}: {q}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn metric_names_tokenizer_finds_metrics_and_skips_the_rest() {
    let names = metric_names(
        r#"topk(10, sum by (instance) (vram_orphaned_bytes{job=~"$job", reason!="x{y}"}[5m] offset 1m)) > 0 or on (job) vector(0) and up unless rate(vram_used_bytes[$__rate_interval])"#,
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(names, ["up", "vram_orphaned_bytes", "vram_used_bytes"]);
    assert_eq!(
        substitute_variables(
            r#"x{a=~"$a", b=~"${b}", c=~"${c:regex}", d=~"[[d]]"}[$__rate_interval]"#
        ),
        r#"x{a=~".*", b=~".*", c=~".*", d=~".*"}[5m]"#
    );
    assert!(unbalanced(r#"sum(x{a="(]"})"#).is_none());
    assert!(unbalanced("sum(x{a=\"b\"}").is_some());
}

// ---------------------------------------------------------------------------------------
// grafana.com's import flow

/// Every string of `value`, with where it is.
fn strings<'a>(value: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::String(text) => out.push((at, text)),
        Value::Array(items) => {
            for (n, item) in items.iter().enumerate() {
                strings(item, format!("{at}[{n}]"), out);
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                strings(item, format!("{at}.{key}"), out);
            }
        }
        _ => {}
    }
}

/// A model, written here, of what Grafana's importer does with the inputs the user chose:
/// every `${NAME}` of a declared input is replaced in every string, and `__inputs` is
/// dropped. It is not Grafana's code: the test below checks the dashboard's side of the
/// import (every placeholder is a declared input, and the variable starts on it).
fn import(dashboard: &Value, inputs: &BTreeMap<&str, &str>) -> Value {
    match dashboard {
        Value::String(text) => {
            let mut text = text.clone();
            for (name, chosen) in inputs {
                text = text.replace(&format!("${{{name}}}"), chosen);
            }
            Value::String(text)
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| import(item, inputs)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(key, _)| *key != "__inputs")
                .map(|(key, item)| (key.clone(), import(item, inputs)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn dashboard_declares_its_data_source_input_and_what_it_requires() {
    let dashboard = load_dashboard();
    let inputs = dashboard["__inputs"].as_array().expect(
        "__inputs is missing: grafana.com's import flow asks for the data source through it",
    );
    assert_eq!(
        inputs.len(),
        1,
        "one input, the Prometheus data source: {inputs:#?}"
    );
    let input = &inputs[0];
    assert_eq!(input["name"], "DS_PROMETHEUS");
    assert_eq!(input["type"], "datasource");
    assert_eq!(input["pluginId"], "prometheus");
    assert!(input["label"]
        .as_str()
        .is_some_and(|label| !label.is_empty()));

    // Every ${DS_...} reference is a declared input, and the input is used.
    let mut all = Vec::new();
    strings(&dashboard, String::new(), &mut all);
    let references: Vec<&(String, &str)> = all
        .iter()
        .filter(|(at, text)| !at.starts_with(".__inputs") && text.contains("${DS_"))
        .collect();
    assert!(!references.is_empty(), "nothing uses ${{DS_PROMETHEUS}}");
    for (at, text) in &references {
        assert_eq!(*text, "${DS_PROMETHEUS}", "{at}");
    }

    // __requires: Grafana itself, the Prometheus data source, and exactly the panel types
    // the dashboard uses (rows are not plugins).
    let requires = dashboard["__requires"]
        .as_array()
        .expect("__requires is missing");
    let of_type = |kind: &str| -> BTreeSet<String> {
        requires
            .iter()
            .filter(|required| required["type"] == kind)
            .map(|required| required["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(of_type("grafana"), BTreeSet::from(["grafana".to_string()]));
    assert_eq!(
        of_type("datasource"),
        BTreeSet::from(["prometheus".to_string()])
    );
    let used: BTreeSet<String> = all_panels(&dashboard)
        .iter()
        .filter_map(|panel| panel["type"].as_str())
        .filter(|kind| *kind != "row")
        .map(str::to_string)
        .collect();
    assert_eq!(
        of_type("panel"),
        used,
        "__requires lists the panel types used"
    );
    for required in requires {
        assert!(required["name"].as_str().is_some(), "{required}");
        assert!(required["version"].as_str().is_some(), "{required}");
    }
    let grafana = requires
        .iter()
        .find(|required| required["type"] == "grafana")
        .unwrap();
    assert!(
        grafana["version"]
            .as_str()
            .is_some_and(|version| version.starts_with(char::is_numeric)),
        "{grafana}"
    );
}

#[test]
fn filling_in_the_ds_prometheus_input_leaves_no_placeholder_and_starts_the_variable_on_it() {
    let dashboard = load_dashboard();
    let imported = import(
        &dashboard,
        &BTreeMap::from([("DS_PROMETHEUS", "chosen-uid")]),
    );
    let mut all = Vec::new();
    strings(&imported, String::new(), &mut all);
    for (at, text) in &all {
        assert!(
            !text.contains("${DS_"),
            "{at} is left as {text} after the import"
        );
    }
    assert!(imported.get("__inputs").is_none());
    // The data source chosen at import is where the dashboard starts; panels keep going
    // through the variable, so the data source can still be switched afterwards (and a
    // provisioned copy, which no import rewrites, falls back to the default one).
    let variable = datasource_variable(&imported);
    let current = imported["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|var| var["name"] == variable.as_str())
        .map(|var| &var["current"])
        .unwrap();
    assert_eq!(current["value"], "chosen-uid", "{current}");
    for panel in all_panels(&imported) {
        for target in targets(panel) {
            assert!(
                refers_to(&target["datasource"], &variable),
                "{}",
                panel_name(panel)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Every panel against a real Prometheus

/// Panels that return nothing in the live test's scenario, each with why. Every target of
/// such a panel must then return nothing (an entry cannot go stale), and every other
/// panel's targets must return data.
const EMPTY_IN_THE_LIVE_SCENARIO: &[(&str, &str)] = &[(
    "/proc entries unreadable per scrape (top 10 targets)",
    "the exporter runs as root and reads every /proc entry it looks at; e2e.rs's host B, \
     which may not read root's, gives this panel data",
)];

/// Panels, each with its targets' PromQL, in the dashboard's order; the Fleet row is left
/// to fleet.rs, which runs it over clusters of nodes and the recording rules it reads.
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
fn label_values(prometheus: &super::monitoring::Server, query: &str) -> Vec<String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let answer = prometheus.api(&format!(
        "/api/v1/label/{}/values?match[]={}",
        label.trim(),
        super::monitoring::percent_encode(selector.trim())
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
    let prometheus = super::monitoring::Server::start("prometheus", |address| {
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
