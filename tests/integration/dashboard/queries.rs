//! The dashboard as written: its schema version, unique panel ids, the datasource
//! variable every query goes through, the chained `job`/`instance`/`gpu` variables, and
//! PromQL that names no instance, asks only for the exporter's metrics (and the rules'
//! recordings), is balanced and parses.

use super::{
    all_panels, dashboard_queries, datasource_variable, load_dashboard, metric_names, panel_name,
    raw_queries, refers_to, substitute_variables, targets, unbalanced, CONTRACT_METRICS,
    REQUIRED_VARIABLES,
};
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;

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
    let (ok, output) = crate::alerts::run_promtool(&["check", "rules", path_text.as_str()]);
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
