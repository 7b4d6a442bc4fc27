//! `dashboards/vram-exporter.json`: what grafana.com's import flow needs (`__inputs` for
//! the data source, `__requires`, schema version, unique panel ids, a datasource variable
//! every query goes through, chained `job`/`instance`/`gpu` variables, no hard-coded
//! instance), PromQL that parses and asks only for the exporter's metrics, and every
//! panel's queries run against a real Prometheus that scrapes the real exporter while a
//! real child process holds a fork orphan's memory.
//!
//! This module reads the dashboard and its PromQL for the tests: `queries.rs` checks the
//! panels, variables and queries as written, `import.rs` grafana.com's import of them,
//! and `live.rs` runs every panel against a real Prometheus. The end-to-end and fleet
//! tests run its queries too, and the alert rules' tests its metric contract.

mod import;
mod live;
mod queries;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

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
/// rules, by cluster and node, over a central store (fleet/incidents.rs runs them against
/// one).
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
