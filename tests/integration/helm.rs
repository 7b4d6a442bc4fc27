//! The Helm chart in `charts/vram-exporter/`, tested with the real programs: the pinned
//! helm (`helm lint --strict`, `helm template`, the chart's values schema), the
//! Kubernetes API schemas of a current release and the Prometheus Operator's CRD schemas
//! (`tests/tools/validate.py`, offline), and promtool for the rules. `tests/tools.sh
//! install` installs helm and the validator (tests/run.sh does it first); a missing one
//! fails the test with that line.
//!
//! The chart is the source of `deploy/kubernetes/` (its render with the default values,
//! written by `deploy/generate.sh`), and `alerts/vram-exporter.rules.yml` the source of
//! its rules: the chart reads a copy kept by the same script, as data, so the Prometheus
//! templates in the annotations never pass through Helm's. Each test only compares.

use crate::helpers::promtool;
use crate::helpers::{repository, said};
use serde_norway::{Mapping, Value};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

pub(crate) const CHART: &str = "charts/vram-exporter";
/// The chart's base URL of the runbook, a placeholder until a site sets its own.
const PLACEHOLDER_RUNBOOK: &str = "https://replace-with-your-runbook-url.invalid/docs/runbook.md";

/// The one value the repository's chart requires, the image: the local build's here.
pub(crate) const LOCAL_IMAGE: [&str; 2] = ["-f", "tests/fixtures/chart/local-image.yaml"];

/// The command line `tests/tools.sh path NAME` prints: a program and its fixed arguments.
pub(crate) fn tool(name: &str) -> Command {
    let output = Command::new(repository().join("tests/tools.sh"))
        .args(["path", name])
        .output()
        .expect("run tests/tools.sh");
    assert!(output.status.success(), "{}", said(&output));
    let words: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut command = Command::new(&words[0]);
    command.args(&words[1..]).current_dir(repository());
    command
}

pub(crate) fn helm(args: &[&str]) -> Output {
    tool("helm").args(args).output().expect("run helm")
}

/// `helm template vram-exporter CHART` with the image it requires and `args`; the YAML
/// it prints.
pub(crate) fn render(chart: &Path, args: &[&str]) -> String {
    let chart = chart.to_str().unwrap();
    let output = helm(
        &[
            &["template", "vram-exporter", chart][..],
            &LOCAL_IMAGE,
            args,
        ]
        .concat(),
    );
    assert!(output.status.success(), "helm template: {}", said(&output));
    String::from_utf8(output.stdout).unwrap()
}

pub(crate) fn values_file(name: &str) -> String {
    let file = repository().join(CHART).join("ci").join(name);
    file.display().to_string()
}

/// The renders every test looks at: the defaults, and every toggle on (with the
/// ServiceMonitor, and with the PodMonitor).
fn renders() -> Vec<(&'static str, String)> {
    let chart = repository().join(CHART);
    vec![
        ("defaults", render(&chart, &[])),
        (
            "ci/all-on-values.yaml",
            render(&chart, &["-f", &values_file("all-on-values.yaml")]),
        ),
        (
            "ci/podmonitor-values.yaml",
            render(&chart, &["-f", &values_file("podmonitor-values.yaml")]),
        ),
    ]
}

pub(crate) fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n")
        .map(|document| serde_norway::from_str::<Value>(document).unwrap())
        .filter(|value| !value.is_null())
        .collect()
}

fn kinds(yaml: &str) -> BTreeSet<String> {
    documents(yaml)
        .iter()
        .map(|object| object["kind"].as_str().unwrap().to_string())
        .collect()
}

fn object(yaml: &str, kind: &str) -> Value {
    documents(yaml)
        .into_iter()
        .find(|object| object["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in:\n{yaml}"))
}

fn read_yaml(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn alert_rules() -> Value {
    read_yaml(&repository().join("alerts/vram-exporter.rules.yml"))
}

#[test]
fn helm_lint_strict_passes_with_the_defaults_and_every_toggle() {
    for values in [
        None,
        Some("all-on-values.yaml"),
        Some("podmonitor-values.yaml"),
    ] {
        let mut args = vec!["lint".to_string(), "--strict".into(), CHART.into()];
        if let Some(values) = values {
            args.extend(["-f".into(), values_file(values)]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = helm(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint --strict with {values:?}: {}",
            said(&output)
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "{stdout}"
        );
    }
}

#[test]
fn every_rendered_object_passes_the_kubernetes_and_operator_schemas() {
    let expected: [&[&str]; 3] = [
        &["DaemonSet", "PrometheusRule", "Service", "ServiceMonitor"],
        &[
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "PrometheusRule",
            "Secret",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ],
        &["ConfigMap", "DaemonSet", "PodMonitor", "PrometheusRule"],
    ];
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for ((name, yaml), expected) in renders().into_iter().zip(expected) {
        let wanted: BTreeSet<String> = expected.iter().map(|kind| kind.to_string()).collect();
        assert_eq!(kinds(&yaml), wanted, "{name}");
        let file = scratch.path().join("rendered.yaml");
        fs::write(&file, &yaml).unwrap();
        let output = tool("validate").arg(&file).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{name}: {}", said(&output));
        // One verdict per object, every one a pass against a schema (none skipped).
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), documents(&yaml).len(), "{name}: {stdout}");
        for line in lines {
            assert!(
                line.starts_with("passed ")
                    && (line.ends_with("against Kubernetes 1.37")
                        || line.ends_with("against the CRD of monitoring.coreos.com/v1")),
                "{name}: {line}"
            );
        }
    }
}

#[test]
fn the_validator_refuses_a_field_the_api_does_not_have() {
    // The values schema lets extra volume mounts and TLS settings through as objects; the
    // API's schemas must catch what they carry (strict, as the API server is).
    let yaml = render(
        &repository().join(CHART),
        &[
            "--set",
            "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/x,extraVolumeMounts[0].readonly=true",
            "--set",
            "serviceMonitor.tlsConfig.insecureSkipVerfy=true",
        ],
    );
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = scratch.path().join("rendered.yaml");
    fs::write(&file, yaml).unwrap();
    let output = tool("validate").arg(&file).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{}", said(&output));
    assert!(
        stdout.contains(
            "failed DaemonSet/vram-exporter: spec.template.spec.containers.0.volumeMounts.4:"
        ) && stdout.contains("'readonly' was unexpected"),
        "{stdout}"
    );
    assert!(
        stdout.contains("failed ServiceMonitor/vram-exporter: spec.endpoints.0.tlsConfig:")
            && stdout.contains("'insecureSkipVerfy' was unexpected"),
        "{stdout}"
    );
}

#[test]
fn a_wrong_value_is_refused_at_install_with_what_is_wrong() {
    for (set, said_what) in [
        ("hostPID=maybe", "/hostPID"),
        ("image.digest=latest", "/image/digest"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("port=90770", "/port"),
        (
            "serviceMonitor.interval=30 seconds",
            "/serviceMonitor/interval",
        ),
        ("serviceMonitor.scheme=ftp", "/serviceMonitor/scheme"),
        (
            "prometheusRule.unattributedMinBytes=-1",
            "/prometheusRule/unattributedMinBytes",
        ),
        (
            "prometheusRule.alerts.VRAMOrphanedMemory.for=soon",
            "/prometheusRule/alerts/VRAMOrphanedMemory/for",
        ),
        (
            "prometheusRule.alerts.VRAMNoSuchAlert.for=5m",
            "VRAMNoSuchAlert",
        ),
        ("runbookBaseUrl=runbook.md", "/runbookBaseUrl"),
        ("kubelet.podLogsDir=var/log/pods", "/kubelet/podLogsDir"),
        ("extraArgs[0]=log.level=debug", "/extraArgs/0"),
        ("serviceMonitor.intervall=30s", "intervall"),
        ("dashbord.enabled=true", "dashbord"),
        // Not the schema's, the templates': combinations that cannot work.
        (
            "podMonitor.enabled=true",
            "every node would be scraped twice",
        ),
        (
            "service.enabled=false",
            "serviceMonitor.enabled needs service.enabled",
        ),
        (
            "webConfig.enabled=true",
            "webConfig.enabled needs webConfig.config",
        ),
    ] {
        let output = helm(
            &[
                &["template", "vram-exporter", CHART][..],
                &LOCAL_IMAGE,
                &["--set", set],
            ]
            .concat(),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(said_what),
            "--set {set} should be refused naming {said_what:?}: {}",
            said(&output)
        );
    }
}

/// `spec.groups` of the PrometheusRule in `yaml`.
fn rendered_groups(yaml: &str) -> Value {
    object(yaml, "PrometheusRule")["spec"]["groups"].clone()
}

/// `promtool check rules` of `groups`, and `promtool test rules` of `alerts/tests/` with
/// them in place of `alerts/vram-exporter.rules.yml`.
fn promtool_checks_and_tests(groups: &Value, run_unit_tests: bool) {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut file = Mapping::new();
    file.insert("groups".into(), groups.clone());
    let rules = scratch.path().join("vram-exporter.rules.yml");
    fs::write(
        &rules,
        serde_norway::to_string(&Value::Mapping(file)).unwrap(),
    )
    .unwrap();
    let output = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool check rules: {}",
        said(&output)
    );
    if !run_unit_tests {
        return;
    }
    // The unit tests name their rules file as ../vram-exporter.rules.yml.
    let tests = scratch.path().join("tests");
    fs::create_dir(&tests).unwrap();
    let mut copied = Vec::new();
    let entries = fs::read_dir(repository().join("alerts/tests")).unwrap();
    for entry in entries.flatten() {
        let target = tests.join(entry.file_name());
        fs::copy(entry.path(), &target).unwrap();
        copied.push(target);
    }
    assert!(copied.len() >= 5, "{copied:?}");
    let output = Command::new(promtool())
        .args(["test", "rules"])
        .args(&copied)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool test rules: {}",
        said(&output)
    );
}

#[test]
fn the_rendered_prometheusrule_carries_exactly_the_rules_of_alerts() {
    let yaml = &renders()[0].1;
    let groups = rendered_groups(yaml);
    assert_eq!(groups, alert_rules()["groups"]);
    // And promtool reads them as it reads alerts/: every unit test of the rules passes
    // against the rendered copy.
    promtool_checks_and_tests(&groups, true);
}

/// The alert named `name` in `groups`.
fn alert<'a>(groups: &'a mut Value, name: &str) -> &'a mut Mapping {
    groups
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .flat_map(|group| group["rules"].as_sequence_mut().unwrap().iter_mut())
        .find(|rule| rule["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"))
        .as_mapping_mut()
        .unwrap()
}

fn set_text(rule: &mut Mapping, path: &[&str], change: impl Fn(&str) -> String) {
    let mut value = rule.get_mut(path[0]).unwrap();
    for key in &path[1..] {
        value = value.get_mut(*key).unwrap();
    }
    let changed = change(value.as_str().unwrap());
    assert_ne!(value.as_str().unwrap(), changed, "{path:?} unchanged");
    *value = Value::String(changed);
}

#[test]
fn the_rule_values_change_what_they_name_and_nothing_else() {
    // ci/all-on-values.yaml sets every rule value; what it renders is alerts/ with
    // exactly these edits.
    let values = read_yaml(&repository().join(CHART).join("ci/all-on-values.yaml"));
    let base = values["runbookBaseUrl"].as_str().unwrap();
    let mut expected = alert_rules()["groups"].clone();
    for group in expected.as_sequence_mut().unwrap() {
        let rules = group["rules"].as_sequence_mut().unwrap();
        rules.retain(|rule| rule["alert"] != "VRAMRecoveryActionOther");
        for rule in rules {
            if let Some(url) = rule["annotations"]["runbook_url"].as_str() {
                let anchor = url.split_once('#').unwrap().1;
                rule["annotations"]["runbook_url"] = Value::String(format!("{base}#{anchor}"));
            }
        }
    }
    let orphaned = alert(&mut expected, "VRAMOrphanedMemory");
    orphaned.insert("for".into(), "4m".into());
    set_text(orphaned, &["expr"], |expr| {
        expr.replace("> 0", "> 268435456")
    });
    set_text(orphaned, &["annotations", "description"], |text| {
        text.replace("for more than 2 minutes", "for more than 4m")
    });
    let stopped = alert(&mut expected, "VRAMOwnerStopped");
    stopped.insert("for".into(), "2h".into());
    set_text(stopped, &["annotations", "description"], |text| {
        text.replace("for more than 30 minutes", "for more than 2h")
    });
    let failure = alert(&mut expected, "VRAMRowRemapFailure");
    set_text(failure, &["labels", "severity"], |_| "critical".into());
    let unattributed = alert(&mut expected, "VRAMUnattributedMemory");
    set_text(unattributed, &["expr"], |expr| {
        expr.replace("> 1073741824", "> 2147483648")
    });
    set_text(unattributed, &["annotations", "description"], |text| {
        text.replace("(threshold 1GiB,", "(threshold 2GiB,")
    });
    // The job the ServiceMonitor names after the app.kubernetes.io/name label.
    let absent = alert(&mut expected, "VRAMExporterAbsent");
    set_text(absent, &["expr"], |expr| {
        expr.replace("job=\"vram-exporter\"", "job=\"gpu-vram\"")
    });

    for (name, yaml) in &renders()[1..] {
        let groups = rendered_groups(yaml);
        assert_eq!(groups, expected, "{name}");
        promtool_checks_and_tests(&groups, false);
        let daemonset = object(yaml, "DaemonSet");
        assert_eq!(
            daemonset["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "gpu-vram",
            "{name}"
        );
    }
}

#[test]
fn every_toggle_does_what_its_value_says() {
    let all = renders();
    let (with_service, with_pods) = (&all[1].1, &all[2].1);

    let pod = &object(with_service, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["runtimeClassName"], "nvidia-legacy");
    assert_eq!(pod["priorityClassName"], "gpu-monitoring");
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.org/gpu/vram-exporter:0.1.0-test@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap())
        .collect();
    for wanted in [
        "--web.listen-address=:9400",
        "--kubelet.pod-resources-path=/var/lib/k0s/kubelet/pod-resources/kubelet.sock",
        "--path.pod-logs=/var/log/k0s-pods",
        "--web.config.file=/etc/vram-exporter/web/web-config.yml",
        "--log.level=debug",
    ] {
        assert!(args.contains(&wanted), "{wanted} in {args:?}");
    }
    // With TLS and basic auth the kubelet's probes can only open the port.
    assert_eq!(container["livenessProbe"]["tcpSocket"]["port"], "metrics");
    assert_eq!(container["livenessProbe"]["failureThreshold"], 5);
    assert!(container["readinessProbe"]["httpGet"].is_null());
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|mount| mount["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        mounts,
        [
            "/host/proc",
            "/var/lib/k0s/kubelet/pod-resources",
            "/var/log/k0s-pods",
            "/run/vram-exporter",
            "/etc/vram-exporter/web",
            "/etc/vram-exporter/tls",
            "/run/nvidia/driver"
        ]
    );

    let secret = object(with_service, "Secret");
    let config: Value =
        serde_norway::from_str(secret["stringData"]["web-config.yml"].as_str().unwrap()).unwrap();
    assert_eq!(
        config["tls_server_config"]["cert_file"],
        "/etc/vram-exporter/tls/tls.crt"
    );
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    assert!(pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|volume| volume["secret"]["secretName"] == secret_name));
    // A Secret of the user's own is used as it is.
    let pod_with_pods = &object(with_pods, "DaemonSet")["spec"]["template"]["spec"];
    assert!(!kinds(with_pods).contains("Secret"));
    assert!(pod_with_pods["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|volume| volume["secret"]["secretName"] == "vram-exporter-web-config"));

    for (yaml, kind, endpoints) in [
        (with_service, "ServiceMonitor", "endpoints"),
        (with_pods, "PodMonitor", "podMetricsEndpoints"),
    ] {
        let monitor = object(yaml, kind);
        assert_eq!(
            monitor["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );
        assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name");
        let endpoint = &monitor["spec"][endpoints][0];
        assert_eq!(endpoint["interval"], "15s");
        assert_eq!(endpoint["scrapeTimeout"], "5s");
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["basicAuth"]["password"]["key"], "password");
        assert_eq!(endpoint["relabelings"][0]["targetLabel"], "node");
        assert!(endpoint["relabelings"][1].is_mapping(), "{kind}");
        assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    }

    let dashboard = object(with_service, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "GPUs"
    );
    let json: serde_json::Value =
        serde_json::from_str(dashboard["data"]["vram-exporter.json"].as_str().unwrap()).unwrap();
    let shipped: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(repository().join("dashboards/vram-exporter.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json["panels"], shipped["panels"]);
    assert_eq!(
        json["links"][0]["url"],
        "https://git.example.org/gpu/vram-exporter/-/blob/main/docs/runbook.md"
    );
    // The import flow's placeholder is filled in: the sidecar has no import dialog.
    assert!(!json.to_string().contains("${DS_PROMETHEUS}"));
    assert_eq!(
        json["templating"]["list"][0]["current"]["value"],
        "prometheus-main"
    );
}

#[test]
fn helm_template_with_defaults_reproduces_deploy_kubernetes() {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = Command::new(repository().join("deploy/generate.sh"))
        .arg("--out")
        .arg(scratch.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "deploy/generate.sh: {}",
        said(&output)
    );
    let files = |root: &Path, folder: &str| -> BTreeSet<String> {
        fs::read_dir(root.join(folder))
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_type().unwrap().is_file())
            .map(|entry| format!("{folder}/{}", entry.file_name().to_string_lossy()))
            .collect()
    };
    for folder in [
        "deploy/kubernetes",
        "deploy/kubernetes/podmonitor",
        "charts/vram-exporter/files",
    ] {
        let generated = files(scratch.path(), folder);
        assert_eq!(files(&repository(), folder), generated, "{folder}");
        for file in generated {
            assert!(
                fs::read(repository().join(&file)).unwrap()
                    == fs::read(scratch.path().join(&file)).unwrap(),
                "{file} differs from what the chart renders; run deploy/generate.sh and commit what it writes"
            );
        }
    }
}

#[test]
fn the_runbook_url_is_one_setting_everywhere() {
    // In the repository: the chart's default, every alert and the dashboard agree.
    let values = read_yaml(&repository().join(CHART).join("values.yaml"));
    assert_eq!(values["runbookBaseUrl"], PLACEHOLDER_RUNBOOK);
    let mut groups = alert_rules()["groups"].clone();
    let mut alerts = 0;
    for group in groups.as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            if let Some(name) = rule["alert"].as_str() {
                alerts += 1;
                assert_eq!(
                    rule["annotations"]["runbook_url"].as_str(),
                    Some(format!("{PLACEHOLDER_RUNBOOK}#{}", name.to_lowercase()).as_str())
                );
            }
        }
    }
    assert!(alerts >= 20, "{alerts}");

    // One command sets it for the plain files, the rules, their tests, the dashboard and
    // the chart; afterwards the chart still renders the plain files exactly, and the
    // rules' unit tests still pass.
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let copy = scratch.path().join("repository");
    for folder in [
        "alerts",
        "dashboards",
        "charts",
        "deploy",
        "tests/tools",
        "docs",
    ] {
        fs::create_dir_all(copy.join(folder).parent().unwrap()).unwrap();
        let status = Command::new("cp")
            .arg("-r")
            .arg(repository().join(folder))
            .arg(copy.join(folder))
            .status()
            .unwrap();
        assert!(status.success());
    }
    fs::copy(
        repository().join("tests/tools.sh"),
        copy.join("tests/tools.sh"),
    )
    .unwrap();
    let url = "https://gitlab.example.com/ops/vram-exporter/-/blob/main/docs/runbook.md";
    let output = Command::new(copy.join("deploy/set-runbook-url.sh"))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "set-runbook-url.sh: {}",
        said(&output)
    );
    let grep = Command::new("grep")
        .args([
            "-rlF",
            PLACEHOLDER_RUNBOOK,
            "alerts",
            "docs/runbook.md",
            "dashboards",
            "charts",
            "deploy/kubernetes",
        ])
        .current_dir(&copy)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&grep.stdout),
        "",
        "files still carrying the placeholder"
    );
    let rules = read_yaml(&copy.join("alerts/vram-exporter.rules.yml"));
    let set = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .filter(|rule| rule["alert"].is_string())
        .filter(|rule| {
            rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{url}#"))
        })
        .count();
    assert_eq!(set, alerts);
    let regenerated = scratch.path().join("regenerated");
    let output = Command::new(copy.join("deploy/generate.sh"))
        .arg("--out")
        .arg(&regenerated)
        .output()
        .unwrap();
    assert!(output.status.success(), "generate.sh: {}", said(&output));
    for file in [
        "deploy/kubernetes/prometheusrule.yaml",
        "charts/vram-exporter/files/vram-exporter.rules.yml",
        "charts/vram-exporter/files/vram-exporter.json",
    ] {
        assert!(
            fs::read(copy.join(file)).unwrap() == fs::read(regenerated.join(file)).unwrap(),
            "{file}"
        );
    }
    let output = Command::new(promtool())
        .args(["test", "rules"])
        .args(
            fs::read_dir(copy.join("alerts/tests"))
                .unwrap()
                .flatten()
                .map(|entry| entry.path()),
        )
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool test rules: {}",
        said(&output)
    );
    // A bad address is refused, with nothing changed.
    let output = Command::new(copy.join("deploy/set-runbook-url.sh"))
        .arg("https://example.org/runbook.md#top")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", said(&output));
}

/// Every value's dotted path in `values`, down to the values the schema takes whole
/// (free-form maps such as labels or a node selector, lists, scalars); each key on the
/// way must be one the schema names.
fn leaf_paths(prefix: &str, value: &Value, schema: &serde_json::Value, found: &mut Vec<String>) {
    match (value.as_mapping(), schema["properties"].as_object()) {
        (Some(mapping), Some(properties)) if !mapping.is_empty() => {
            for (key, value) in mapping {
                let key = key.as_str().unwrap();
                let path = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                let schema = properties
                    .get(key)
                    .unwrap_or_else(|| panic!("{path} is not in values.schema.json"));
                leaf_paths(&path, value, schema, found);
            }
        }
        _ => found.push(prefix.to_string()),
    }
}

#[test]
fn every_value_is_in_the_schema_the_chart_readme_and_the_guide() {
    let chart = repository().join(CHART);
    let values = read_yaml(&chart.join("values.yaml"));
    let schema: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    let readme = fs::read_to_string(chart.join("README.md")).unwrap();
    let guide = fs::read_to_string(repository().join("docs/kubernetes.md")).unwrap();
    let mut paths = Vec::new();
    leaf_paths("", &values, &schema, &mut paths);
    assert!(paths.len() > 40, "{paths:?}");
    let undocumented: Vec<&String> = paths
        .iter()
        .filter(|path| !readme.contains(&format!("`{path}`")))
        .collect();
    // docs/kubernetes.md, which starts with `helm install`, names every value too.
    assert!(
        guide
            .split("\n## ")
            .nth(1)
            .is_some_and(|install| install.starts_with("Install")
                && install.contains("helm install vram-exporter charts/vram-exporter")),
        "docs/kubernetes.md does not start with helm install"
    );
    let unexplained: Vec<&String> = paths
        .iter()
        .filter(|path| !guide.contains(&format!("`{path}`")))
        .collect();
    assert!(
        unexplained.is_empty(),
        "not in docs/kubernetes.md: {unexplained:?}"
    );
    assert!(
        undocumented.is_empty(),
        "not in the chart's README: {undocumented:?}"
    );
    // Refusing unknown keys is what catches a misspelt value.
    assert_eq!(schema["additionalProperties"], false);

    // The alerts a value may name are the rules' alerts.
    let named: BTreeSet<String> = schema["properties"]["prometheusRule"]["properties"]["alerts"]
        ["propertyNames"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap().to_string())
        .collect();
    let alerts: BTreeSet<String> = alert_rules()["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .filter_map(|rule| rule["alert"].as_str().map(str::to_string))
        .collect();
    assert_eq!(named, alerts);
}

#[test]
fn the_chart_ships_the_exporter_version_it_was_made_with() {
    let chart = read_yaml(&repository().join(CHART).join("Chart.yaml"));
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    let values = read_yaml(&repository().join(CHART).join("values.yaml"));
    // Both anchors' charts default to hostPID: false, which hides every other
    // workload's processes from NVML; this one must not.
    assert_eq!(values["hostPID"], true);
}
