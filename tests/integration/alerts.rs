//! Static checks of the alerting rules in `alerts/`: promtool accepts the rules file and
//! passes its unit tests, every alert carries what the on-call needs (severity, summary,
//! description, a runbook anchor that exists), and the rules ask only for the exporter's
//! metrics. promtool is required: a machine without it fails these tests, it never skips
//! them.

use crate::helpers::promtool;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rules_path() -> PathBuf {
    repo().join("alerts/vram-exporter.rules.yml")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()))
}

/// Run promtool in the repository root; (success, stdout and stderr together).
pub(crate) fn run_promtool(args: &[&str]) -> (bool, String) {
    let tool = promtool();
    let output = Command::new(&tool)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", tool.display()));
    let text = format!(
        "$ promtool {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The unit-test files, `alerts/tests/*.yml`, sorted.
fn rule_test_files() -> Vec<PathBuf> {
    let dir = repo().join("alerts/tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yml"))
        .collect();
    files.sort();
    files
}

/// One rule of the rules file, as far as these checks need it.
#[derive(Debug, Default)]
struct Rule {
    /// "alert" or "record".
    kind: String,
    name: String,
    expr: String,
    /// `key: value` lines of the rule other than expr (labels, annotations, for), trimmed.
    fields: Vec<(String, String)>,
}

impl Rule {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn unquote(value: &str) -> String {
    let value = value.trim();
    for quote in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(quote) && value.ends_with(quote) {
            return value[1..value.len() - 1].to_string();
        }
    }
    value.to_string()
}

/// Read the rules out of the rules file. Not a YAML parser: it reads the layout this
/// repository's rules file uses (one `- alert:` / `- record:` item per rule, `key: value`
/// lines, block scalars for long values), which `promtool check rules` validates as YAML.
fn parse_rules(text: &str) -> Vec<Rule> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let kind = ["alert", "record"]
            .into_iter()
            .find(|kind| trimmed.starts_with(&format!("- {kind}:")));
        let Some(kind) = kind else {
            i += 1;
            continue;
        };
        let item_indent = indentation(lines[i]);
        let mut rule = Rule {
            kind: kind.to_string(),
            name: unquote(&trimmed[kind.len() + 3..]),
            ..Rule::default()
        };
        i += 1;
        while i < lines.len() {
            let line = lines[i];
            let body = line.trim_start();
            if body.is_empty() || body.starts_with('#') {
                i += 1;
                continue;
            }
            if indentation(line) <= item_indent {
                break;
            }
            let key_indent = indentation(line);
            let (key, value) = match body.split_once(':') {
                Some((key, value)) => (key.trim().to_string(), value.trim().to_string()),
                None => (body.to_string(), String::new()),
            };
            i += 1;
            let value = if value.starts_with('|') || value.starts_with('>') {
                let mut block = Vec::new();
                while i < lines.len()
                    && (lines[i].trim().is_empty() || indentation(lines[i]) > key_indent)
                {
                    block.push(lines[i].trim());
                    i += 1;
                }
                block.join("\n").trim().to_string()
            } else {
                unquote(&value)
            };
            if key == "expr" {
                rule.expr = value;
            } else {
                rule.fields.push((key, value));
            }
        }
        rules.push(rule);
    }
    rules
}

fn alerts() -> Vec<Rule> {
    let rules = parse_rules(&read(&rules_path()));
    let alerts: Vec<Rule> = rules.into_iter().filter(|r| r.kind == "alert").collect();
    assert!(!alerts.is_empty(), "no alert found in the rules file");
    alerts
}

/// GitHub's anchor for a Markdown heading.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors GitHub gives the headings of a Markdown text: lines of code blocks are
/// not headings, and a repeated anchor gets `-1`, `-2`, ...
pub(crate) fn markdown_anchors(text: &str) -> Vec<String> {
    let mut anchors = Vec::new();
    let mut bases: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if in_code || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = heading_anchor(&line[hashes..]);
        let repeats = bases.iter().filter(|seen| **seen == base).count();
        anchors.push(if repeats == 0 {
            base.clone()
        } else {
            format!("{base}-{repeats}")
        });
        bases.push(base);
    }
    anchors
}

fn runbook_anchors() -> Vec<String> {
    markdown_anchors(&read(&repo().join("docs/runbook.md")))
}

#[test]
fn anchors_are_named_as_github_names_them() {
    let text = "# vram-exporter runbook\n## Containers: the process that outlived its container\n\
                ```sh\n# not a heading\n```\n## VRAMGpuLost\n## Resetting a GPU\n## Resetting\n## Resetting a GPU\n#hashtag\n";
    assert_eq!(
        markdown_anchors(text),
        [
            "vram-exporter-runbook",
            "containers-the-process-that-outlived-its-container",
            "vramgpulost",
            "resetting-a-gpu",
            "resetting",
            "resetting-a-gpu-1",
        ]
    );
}

#[test]
fn alert_rules_pass_promtool_check() {
    let (ok, output) = run_promtool(&["check", "rules", "alerts/vram-exporter.rules.yml"]);
    assert!(ok, "promtool check rules failed:\n{output}");
}

#[test]
fn alert_rule_unit_tests_pass() {
    let files = rule_test_files();
    assert!(!files.is_empty(), "alerts/tests/ has no *.yml unit tests");
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(repo())
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let mut args = vec!["test", "rules"];
    args.extend(names.iter().map(String::as_str));
    let (ok, output) = run_promtool(&args);
    assert!(ok, "promtool test rules failed:\n{output}");
    assert_eq!(
        output.matches("SUCCESS").count(),
        files.len(),
        "not every unit-test file reported SUCCESS:\n{output}"
    );
}

#[test]
fn every_alert_has_severity_summary_description_and_runbook() {
    for alert in alerts() {
        let severity = alert.field("severity").unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{}: severity {severity:?} is not critical, warning or info",
            alert.name
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                alert.field(key).is_some_and(|v| !v.is_empty()),
                "{} has no {key} annotation",
                alert.name
            );
        }
        let description = alert.field("description").unwrap();
        // absent() has no instance to name; every other alert is about one target.
        assert!(
            alert.expr.contains("absent(") || description.contains("$labels.instance"),
            "{}: the description must name the instance",
            alert.name
        );
        if alert.expr.contains("vram_") && description.contains("$labels.gpu") {
            assert!(
                description.contains("$labels.uuid"),
                "{}: a description that names the GPU index must give its uuid too",
                alert.name
            );
        }
        assert!(
            alert.field("for").is_some(),
            "{} has no for: duration",
            alert.name
        );
    }
}

/// The Thresholds section of `docs/runbook.md` (empty when there is none).
fn runbook_thresholds() -> String {
    let runbook = read(&repo().join("docs/runbook.md"));
    runbook
        .split("## Thresholds")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_default()
        .to_string()
}

/// The runbook URL of the SITE SETTINGS block: the `runbook URL` row's value.
pub(crate) fn runbook_url_setting() -> String {
    let rules = read(&rules_path());
    let row = rules
        .lines()
        .find_map(|line| line.strip_prefix("#   runbook URL"))
        .expect("SITE SETTINGS has no `runbook URL` row");
    let url = row.trim().to_string();
    assert!(
        url.starts_with("https://") && !url.contains(' ') && !url.contains('#'),
        "the runbook URL setting {url:?} is not one https URL without an anchor"
    );
    url
}

#[test]
fn the_runbook_url_is_a_documented_site_setting() {
    let url = runbook_url_setting();
    // Documented in the runbook's thresholds table with the same default.
    let table = runbook_thresholds();
    let row = table
        .lines()
        .find(|line| line.contains("`runbook_url`"))
        .expect("the runbook's thresholds table has no runbook_url row");
    assert!(row.contains(&format!("`{url}`")), "{row}");
    // The runbook shows the one command that sets it everywhere, and the chart's value.
    assert!(
        table.contains("\ndeploy/set-runbook-url.sh https://") && table.contains("runbookBaseUrl"),
        "the thresholds section shows neither deploy/set-runbook-url.sh nor the chart's runbookBaseUrl"
    );
    // The alerts' unit tests and the dashboard's Runbook link carry the same URL.
    for file in rule_test_files() {
        for line in read(&file)
            .lines()
            .filter(|line| line.contains("runbook_url:"))
        {
            assert!(
                line.contains(&format!("runbook_url: {url}#")),
                "{}: {line}",
                file.display()
            );
        }
    }
    let dashboard = read(&repo().join("dashboards/vram-exporter.json"));
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let links: Vec<&str> = dashboard["links"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|link| link["title"] == "Runbook")
        .filter_map(|link| link["url"].as_str())
        .collect();
    assert_eq!(links, [url.as_str()], "the dashboard's Runbook link");
}

#[test]
fn every_runbook_url_points_at_a_runbook_heading() {
    let anchors = runbook_anchors();
    let setting = runbook_url_setting();
    for alert in alerts() {
        let url = alert.field("runbook_url").unwrap_or_default();
        let (page, anchor) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{}: runbook_url {url} has no #anchor", alert.name));
        assert_eq!(
            page, setting,
            "{}: runbook_url {url} is not the runbook URL of SITE SETTINGS",
            alert.name
        );
        assert_eq!(
            anchor,
            alert.name.to_lowercase(),
            "{}: the anchor should be the alert's name",
            alert.name
        );
        assert!(
            anchors.iter().any(|a| a == anchor),
            "{}: docs/runbook.md has no heading for #{anchor}",
            alert.name
        );
    }
}

#[test]
fn thresholds_are_documented_in_the_rules_file_and_the_runbook() {
    let rules = read(&rules_path());
    let settings = rules
        .split("SITE SETTINGS")
        .nth(1)
        .and_then(|rest| rest.split("\ngroups:").next())
        .expect("the rules file has no SITE SETTINGS comment block");
    assert!(
        runbook_anchors().iter().any(|a| a == "thresholds"),
        "docs/runbook.md has no Thresholds section"
    );
    let table = runbook_thresholds();
    for alert in alerts() {
        assert!(
            settings.contains(&alert.name),
            "{} is missing from the SITE SETTINGS block of the rules file",
            alert.name
        );
        assert!(
            table.contains(&alert.name),
            "{} is missing from the runbook's thresholds table",
            alert.name
        );
        let duration = alert.field("for").unwrap_or_default();
        assert!(
            settings.contains(duration),
            "{}: for: {duration} does not appear in SITE SETTINGS",
            alert.name
        );
    }
}

#[test]
fn only_the_absent_alert_names_a_job() {
    for rule in parse_rules(&read(&rules_path())) {
        let expr: String = rule.expr.chars().filter(|c| !c.is_whitespace()).collect();
        let names_job = ["job=", "job!=", "job=~", "job!~"]
            .iter()
            .any(|m| expr.contains(&format!("{m}\"")));
        let names_instance = expr.contains("instance=\"") || expr.contains("instance=~\"");
        assert!(
            !names_instance,
            "{}: rules must not select a particular instance",
            rule.name
        );
        if names_job {
            assert!(
                rule.kind == "alert" && rule.name.ends_with("Absent") && expr.contains("absent("),
                "{}: only the absent() alert may name a job; join on (job, instance) instead",
                rule.name
            );
        }
    }
}

#[test]
fn rules_ask_only_for_exporter_metrics_and_up() {
    let rules = parse_rules(&read(&rules_path()));
    let recorded: Vec<&str> = rules
        .iter()
        .filter(|r| r.kind == "record")
        .map(|r| r.name.as_str())
        .collect();
    for rule in &rules {
        let names = super::dashboard::metric_names(&rule.expr);
        assert!(
            !names.is_empty(),
            "{}: no metric found in {}",
            rule.name,
            rule.expr
        );
        for name in names {
            assert!(
                name == "up"
                    || super::dashboard::CONTRACT_METRICS.contains(&name.as_str())
                    || recorded.contains(&name.as_str()),
                "{}: {name} is not an exporter metric",
                rule.name
            );
        }
    }
}

#[test]
fn every_alert_is_tested_firing_and_not_firing() {
    // (alert name, whether the case expects alerts) for every alert_rule_test case.
    let mut cases: Vec<(String, bool)> = Vec::new();
    for file in rule_test_files() {
        let text = read(&file);
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let Some(at) = line.find("alertname:") else {
                continue;
            };
            let name: String = line[at + "alertname:".len()..]
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let expects_alerts = if line.contains("exp_alerts") {
                !line.contains("exp_alerts: []")
            } else {
                lines[n + 1..]
                    .iter()
                    .find(|l| l.contains("exp_alerts"))
                    .is_some_and(|l| !l.trim_end().ends_with("[]"))
            };
            cases.push((name, expects_alerts));
        }
    }
    for alert in alerts() {
        assert!(
            cases.iter().any(|(n, fires)| *n == alert.name && *fires),
            "{}: no unit test in alerts/tests/ expects it to fire",
            alert.name
        );
        assert!(
            cases.iter().any(|(n, fires)| *n == alert.name && !*fires),
            "{}: no unit test in alerts/tests/ expects it to stay quiet",
            alert.name
        );
    }
}
