//! What `deploy/` ships: systemd units that `systemd-analyze` accepts and scores,
//! Kubernetes manifests of the expected kinds that keep the exporter's requirements
//! (host PID namespace, the host's /proc, the two capabilities the holder scan needs),
//! and a PrometheusRule carrying `alerts/vram-exporter.rules.yml`, the one source of the
//! rules. The manifests are the Helm chart rendered with its defaults; the test only
//! compares (`helm.rs` checks that the render and the files agree byte for byte). After
//! changing the rules or the chart, regenerate them with:
//!
//! ```sh
//! deploy/generate.sh
//! ```

use crate::helpers::repository;
use crate::helpers::*;
use serde_norway::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The capabilities the holder scan needs, measured by the privilege tests.
const CAPABILITIES: [&str; 2] = ["DAC_READ_SEARCH", "SYS_PTRACE"];
/// Highest `systemd-analyze security` exposure (0-10) the long-running unit may reach.
const MAX_EXPOSURE: f64 = 2.5;

fn systemd_dir() -> PathBuf {
    repository().join("deploy/systemd")
}

fn kubernetes_dir() -> PathBuf {
    repository().join("deploy/kubernetes")
}

fn read_yaml(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_norway::from_str(&text)
        .unwrap_or_else(|error| panic!("{} is not YAML: {error}", path.display()))
}

fn get<'a>(value: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(value, |value, key| match key.parse::<usize>() {
            Ok(index) => &value[index],
            Err(_) => &value[key],
        })
}

fn text<'a>(value: &'a Value, path: &str) -> &'a str {
    get(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string: {:?}", get(value, path)))
}

/// A sequence of strings.
fn strings(sequence: &Value) -> Vec<&str> {
    sequence
        .as_sequence()
        .unwrap_or_else(|| panic!("not a sequence: {sequence:?}"))
        .iter()
        .map(|item| item.as_str().unwrap())
        .collect()
}

/// The volume of `pod` that `mount` mounts.
fn volume_of<'a>(pod: &'a Value, mount: &Value) -> Option<&'a Value> {
    pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == mount["name"])
}

/// The values of `key=` lines in a unit file, in order.
fn directive(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect()
}

const UNITS: [&str; 3] = [
    "vram-exporter.service",
    "vram-exporter-textfile.service",
    "vram-exporter-textfile.timer",
];

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let analyze = require_tool("systemd-analyze", "systemd");
    // A root with the units where systemd looks, the binary their ExecStart names and
    // systemd's own unit library (sysinit.target, ...), so verify checks everything.
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let units = root.path().join("etc/systemd/system");
    fs::create_dir_all(&units).unwrap();
    for unit in UNITS {
        fs::copy(systemd_dir().join(unit), units.join(unit)).unwrap();
    }
    let bin = root.path().join("usr/local/bin");
    fs::create_dir_all(&bin).unwrap();
    if fs::hard_link(exporter_binary(), bin.join("vram-exporter")).is_err() {
        fs::copy(exporter_binary(), bin.join("vram-exporter")).unwrap();
    }
    let library = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|dir| dir.join("sysinit.target").exists())
        .expect(
            "systemd's unit library (sysinit.target); install it with: apt-get install -y systemd",
        );
    fs::create_dir_all(root.path().join("usr/lib/systemd")).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(library)
        .arg(root.path().join("usr/lib/systemd/system"))
        .status()
        .unwrap();
    assert!(copied.success());

    let output = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .args(UNITS)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Unknown keys and bad values are only warnings to verify: any word from it fails.
    assert!(
        output.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
}

#[test]
fn systemd_service_keeps_only_the_measured_capabilities_and_scores_ok() {
    let analyze = require_tool("systemd-analyze", "systemd");
    let unit = fs::read_to_string(systemd_dir().join("vram-exporter.service")).unwrap();
    let wanted: Vec<String> = vec![CAPABILITIES.map(|cap| format!("CAP_{cap}")).join(" ")];
    assert_eq!(directive(&unit, "AmbientCapabilities"), wanted);
    assert_eq!(directive(&unit, "CapabilityBoundingSet"), wanted);
    assert_eq!(directive(&unit, "User"), ["vram-exporter"]);
    assert_eq!(directive(&unit, "NoNewPrivileges"), ["yes"]);
    assert_eq!(directive(&unit, "ProtectSystem"), ["strict"]);
    assert_eq!(directive(&unit, "DevicePolicy"), ["closed"]);
    // NVML opens these read-write (measured on an H200); the capability nodes read-only.
    // Each driver branch's names for them: the test below resolves them.
    assert_eq!(
        directive(&unit, "DeviceAllow"),
        [
            "char-nvidia-frontend rw",
            "char-nvidia rw",
            "char-nvidiactl rw",
            "char-nvidia-uvm rw",
            "char-nvidia-caps r"
        ]
    );
    // Every name comes with the place it was found.
    for name in ["nvidia-frontend", "nvidiactl", "nvidia-uvm", "nvidia-caps"] {
        let said = unit
            .lines()
            .filter(|line| line.starts_with("# - ") && line.contains(name))
            .count();
        assert!(said >= 1, "no comment says where {name} comes from");
    }
    for source in [
        "issue #324",
        "issue #331069",
        "nv-frontend.c",
        "nv.c",
        "uvm.c",
        "nv-caps.c",
    ] {
        assert!(
            unit.contains(source),
            "the unit's comments do not cite {source}"
        );
    }
    assert!(directive(&unit, "ReadWritePaths").is_empty());
    // The textfile unit has the same hardening, and may write only its directory.
    let textfile =
        fs::read_to_string(systemd_dir().join("vram-exporter-textfile.service")).unwrap();
    let hardening = |unit: &str| -> Vec<String> {
        unit.lines()
            .filter(|line| {
                !line.starts_with('#')
                    && line.contains('=')
                    && ![
                        "Description",
                        "Documentation",
                        "After",
                        "Wants",
                        "Type",
                        "Environment",
                        "ExecStart",
                        "Restart",
                        "RestartSec",
                        "ReadWritePaths",
                        "RestrictAddressFamilies",
                        "UMask",
                        "WantedBy",
                    ]
                    .iter()
                    .any(|key| line.starts_with(&format!("{key}=")))
            })
            .map(str::to_string)
            .collect()
    };
    assert_eq!(hardening(&unit), hardening(&textfile));
    // Its directory comes from the flags file, Debian's by default; systemd expands no
    // variable in ReadWritePaths=, so both packages' directories are writable.
    assert_eq!(
        directive(&textfile, "Environment"),
        ["VRAM_EXPORTER_TEXTFILE_DIR=/var/lib/prometheus/node-exporter"]
    );
    assert!(directive(&textfile, "ExecStart")[0]
        .contains(" -o ${VRAM_EXPORTER_TEXTFILE_DIR}/vram-exporter.prom "));
    assert_eq!(
        directive(&textfile, "ReadWritePaths"),
        ["-/var/lib/prometheus/node-exporter -/var/lib/node_exporter/textfile_collector"]
    );
    let flags =
        fs::read_to_string(repository().join("deploy/packages/vram-exporter.default")).unwrap();
    assert!(flags
        .lines()
        .any(|line| line == "VRAM_EXPORTER_TEXTFILE_DIR=/var/lib/prometheus/node-exporter"));
    assert!(
        flags.contains("/var/lib/node_exporter/textfile_collector"),
        "RHEL's is documented"
    );

    let output = Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--threshold={}", (MAX_EXPOSURE * 10.0) as u32))
        .arg(systemd_dir().join("vram-exporter.service"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let score: f64 = stdout
        .lines()
        .find_map(|line| line.split_once("Overall exposure level for vram-exporter.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure level in:\n{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    assert!(
        output.status.success() && score <= MAX_EXPOSURE,
        "exposure {score} above {MAX_EXPOSURE}:\n{stdout}"
    );
}

/// A shell glob as systemd matches a device group name (`fnmatch`): `*`, `?`, literals.
fn glob_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => {
            glob_matches(rest, name) || (!name.is_empty() && glob_matches(pattern, &name[1..]))
        }
        (Some((b'?', rest)), Some((_, tail))) => glob_matches(rest, tail),
        (Some((p, rest)), Some((n, tail))) if p == n => glob_matches(rest, tail),
        _ => false,
    }
}

/// The character device groups of a `/proc/devices` listing: (major, name).
fn char_groups(listing: &str) -> Vec<(u32, String)> {
    listing
        .split("Block devices:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (major, name) = line.trim().split_once(' ')?;
            Some((major.parse().ok()?, name.to_string()))
        })
        .collect()
}

/// The access `DeviceAllow=` lines grant to char major `major` under `listing`, as
/// systemd resolves `char-NAME` when the unit starts: every group whose name matches,
/// all its minors.
fn allowed(device_allow: &[String], listing: &[(u32, String)], major: u32) -> String {
    let mut access = String::new();
    for line in device_allow {
        let (group, granted) = line.split_once(' ').unwrap();
        let pattern = group.strip_prefix("char-").unwrap();
        if listing.iter().any(|(found, name)| {
            *found == major && glob_matches(pattern.as_bytes(), name.as_bytes())
        }) {
            access.push_str(granted);
        }
    }
    access
}

#[test]
fn the_units_allow_every_device_nvml_opens_on_every_supported_driver_branch() {
    let fixtures = repository().join("tests/fixtures/proc-devices");
    let branches = ["r470", "r535", "r550", "r570"];
    for unit in ["vram-exporter.service", "vram-exporter-textfile.service"] {
        let text = fs::read_to_string(systemd_dir().join(unit)).unwrap();
        let device_allow = directive(&text, "DeviceAllow");
        for branch in branches {
            let listing =
                char_groups(&fs::read_to_string(fixtures.join(format!("{branch}.txt"))).unwrap());
            let major = |name: &str| -> u32 {
                listing
                    .iter()
                    .find(|(_, found)| found == name)
                    .unwrap_or_else(|| panic!("{branch}: no {name} in /proc/devices"))
                    .0
            };
            // What NVML opens (measured on an H200): the control device and each GPU
            // (major 195 whatever its name), UVM read-write, the capabilities read-only.
            for (node, node_major, needs) in [
                ("/dev/nvidiactl", 195, "rw"),
                ("/dev/nvidia0", 195, "rw"),
                ("/dev/nvidia-uvm", major("nvidia-uvm"), "rw"),
                ("/dev/nvidia-caps/nvidia-cap1", major("nvidia-caps"), "r"),
            ] {
                let granted = allowed(&device_allow, &listing, node_major);
                assert!(
                    needs.chars().all(|access| granted.contains(access)),
                    "{unit} on {branch}: {node} (major {node_major}) needs {needs}, gets '{granted}'"
                );
            }
            // Every name this branch gives major 195 is one the unit names itself.
            for (_, name) in listing.iter().filter(|(found, _)| *found == 195) {
                assert!(
                    device_allow.contains(&format!("char-{name} rw")),
                    "{unit} on {branch}: 195 {name} is not named"
                );
            }
        }
        // Without the R535 name the unit would not work there: the test can fail.
        let without: Vec<String> = device_allow
            .iter()
            .filter(|line| !line.starts_with("char-nvidia-frontend "))
            .cloned()
            .collect();
        let r535 = char_groups(&fs::read_to_string(fixtures.join("r535.txt")).unwrap());
        assert_eq!(allowed(&without, &r535, 195), "");
    }
    assert!(glob_matches(b"nvidia*", b"nvidia-uvm") && !glob_matches(b"nvidia", b"nvidia-uvm"));
    // The docs name the minimum driver, and the branches the unit covers.
    let deployment = fs::read_to_string(repository().join("docs/deployment.md")).unwrap();
    assert!(
        deployment.contains("**NVIDIA driver R510 or later; in R535, 535.98 or later.**"),
        "docs/deployment.md states no minimum driver"
    );
}

/// Every manifest, by file name: each parses as YAML and has the expected kind.
fn manifests() -> Vec<(String, Value)> {
    let mut found: Vec<(String, Value)> = fs::read_dir(kubernetes_dir())
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, read_yaml(&path))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

fn manifest(kind: &str) -> Value {
    manifests()
        .into_iter()
        .find(|(_, value)| value["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes"))
        .1
}

#[test]
fn kubernetes_manifests_parse_and_have_the_expected_kinds() {
    let kinds: Vec<(String, String, String)> = manifests()
        .into_iter()
        .map(|(name, value)| {
            (
                name,
                text(&value, "apiVersion").to_string(),
                text(&value, "kind").to_string(),
            )
        })
        .collect();
    let expected = [
        ("daemonset.yaml", "apps/v1", "DaemonSet"),
        (
            "prometheusrule.yaml",
            "monitoring.coreos.com/v1",
            "PrometheusRule",
        ),
        ("service.yaml", "v1", "Service"),
        (
            "servicemonitor.yaml",
            "monitoring.coreos.com/v1",
            "ServiceMonitor",
        ),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(kinds, expected);
    for (name, value) in manifests() {
        assert_eq!(text(&value, "metadata.name"), "vram-exporter", "{name}");
    }
}

#[test]
fn daemonset_keeps_what_the_exporter_needs_and_no_more() {
    let daemonset = manifest("DaemonSet");
    let pod = get(&daemonset, "spec.template.spec");
    assert_eq!(
        pod["hostPID"],
        Value::Bool(true),
        "NVML hides other PID namespaces"
    );
    assert_eq!(text(pod, "runtimeClassName"), "nvidia");
    let labels = get(&daemonset, "spec.template.metadata.labels");
    assert_eq!(get(&daemonset, "spec.selector.matchLabels"), labels);

    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let args = strings(&container["args"]);
    assert!(args.contains(&"--path.procfs=/host/proc"), "{args:?}");
    assert!(args.contains(&"--web.listen-address=:9077"), "{args:?}");
    let mount = &container["volumeMounts"][0];
    assert_eq!(
        (text(mount, "mountPath"), mount["readOnly"].as_bool()),
        ("/host/proc", Some(true))
    );
    let volume = volume_of(pod, mount).expect("the /host/proc volume");
    assert_eq!(text(volume, "hostPath.path"), "/proc");

    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], Value::Bool(true));
    assert_eq!(security["allowPrivilegeEscalation"], Value::Bool(false));
    assert_eq!(security["privileged"], Value::Bool(false));
    let listed = |key: &str| -> Vec<String> {
        get(security, &format!("capabilities.{key}"))
            .as_sequence()
            .unwrap()
            .iter()
            .map(|cap| cap.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed("drop"), ["ALL"]);
    assert_eq!(listed("add"), CAPABILITIES);

    for key in [
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    ] {
        assert!(
            get(&container["resources"], key).as_str().is_some(),
            "resources.{key}"
        );
    }
    assert_eq!(text(container, "livenessProbe.httpGet.path"), "/-/healthy");
    assert_eq!(text(container, "readinessProbe.httpGet.path"), "/-/ready");
    let port = &container["ports"][0];
    assert_eq!(
        (text(port, "name"), port["containerPort"].as_u64()),
        ("metrics", Some(9077))
    );
}

#[test]
fn service_and_servicemonitor_find_the_daemonset_pods() {
    let daemonset = manifest("DaemonSet");
    let pod_labels = get(&daemonset, "spec.template.metadata.labels");
    let service = manifest("Service");
    let selector = get(&service, "spec.selector").as_mapping().unwrap();
    for (key, value) in selector {
        assert_eq!(&pod_labels[key], value, "Service selector {key:?}");
    }
    assert_eq!(text(&service, "spec.ports.0.targetPort"), "metrics");
    assert_eq!(get(&service, "spec.ports.0.port").as_u64(), Some(9077));
    let monitor = manifest("ServiceMonitor");
    let wanted = get(&monitor, "spec.selector.matchLabels")
        .as_mapping()
        .unwrap();
    for (key, value) in wanted {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "ServiceMonitor selector {key:?}"
        );
    }
    assert_eq!(text(&monitor, "spec.endpoints.0.port"), "metrics");
    // The absent-target alert names the job; the Operator names it after the Service.
    let rules = fs::read_to_string(repository().join("alerts/vram-exporter.rules.yml")).unwrap();
    assert!(rules.contains(&format!("job=\"{}\"", text(&service, "metadata.name"))));
}

/// The command that regenerates the manifests.
const REGENERATE: &str = "deploy/generate.sh";

#[test]
fn prometheusrule_is_generated_from_the_rules() {
    let rules = read_yaml(&repository().join("alerts/vram-exporter.rules.yml"));
    let target = kubernetes_dir().join("prometheusrule.yaml");
    let shipped = read_yaml(&target);
    assert_eq!(
        get(&shipped, "spec.groups"),
        &rules["groups"],
        "deploy/kubernetes/prometheusrule.yaml differs from alerts/vram-exporter.rules.yml; regenerate it with:\n    {REGENERATE}"
    );
    // Byte for byte, the file is what the chart renders: helm::helm_template_with_defaults_reproduces_deploy_kubernetes.
    let text = fs::read_to_string(&target).unwrap();
    assert!(
        text.starts_with("# Generated by deploy/generate.sh"),
        "deploy/kubernetes/prometheusrule.yaml was edited by hand; regenerate it with:\n    {REGENERATE}"
    );
    let groups = rules["groups"].as_sequence().unwrap();
    assert!(groups.len() >= 2, "{groups:?}");
}

// The image and the kubelet's sources.

#[test]
fn daemonset_runs_the_image_the_build_script_makes() {
    let printed = Command::new(repository().join("deploy/image/build.sh"))
        .arg("--print-image")
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let image = String::from_utf8(printed.stdout).unwrap();
    assert_eq!(
        image.trim(),
        format!("localhost/vram-exporter:{}", env!("CARGO_PKG_VERSION"))
    );
    let daemonset = manifest("DaemonSet");
    let container = get(&daemonset, "spec.template.spec.containers.0");
    assert_eq!(text(container, "image"), image.trim());
    // A local name is never pulled: the image comes from a registry it was pushed to,
    // or was loaded onto the node.
    assert_eq!(text(container, "imagePullPolicy"), "IfNotPresent");
}

#[test]
fn daemonset_mounts_the_kubelet_sources_read_only_as_directories() {
    let daemonset = manifest("DaemonSet");
    let pod = get(&daemonset, "spec.template.spec");
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    for (flag, mount_path, host_path) in [
        (
            "--kubelet.pod-resources-path=/var/lib/kubelet/pod-resources/kubelet.sock",
            "/var/lib/kubelet/pod-resources",
            "/var/lib/kubelet/pod-resources",
        ),
        (
            "--path.pod-logs=/var/log/pods",
            "/var/log/pods",
            "/var/log/pods",
        ),
    ] {
        assert!(args.contains(&flag), "{flag} in {args:?}");
        let mount = container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|mount| mount["mountPath"] == mount_path)
            .unwrap_or_else(|| panic!("no mount at {mount_path}"));
        assert_eq!(mount["readOnly"], Value::Bool(true), "{mount_path}");
        let volume = volume_of(pod, mount).unwrap();
        // The directory, so a restarted kubelet's new socket is seen.
        assert_eq!(text(volume, "hostPath.path"), host_path);
        assert_eq!(text(volume, "hostPath.type"), "Directory");
    }
}

#[test]
fn daemonset_keeps_the_witness_state_in_a_directory_of_the_node() {
    let daemonset = manifest("DaemonSet");
    let pod = get(&daemonset, "spec.template.spec");
    let container = &pod["containers"][0];
    assert!(
        strings(&container["args"]).contains(&"--path.state=/run/vram-exporter"),
        "{:?}",
        container["args"]
    );
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|mount| mount["mountPath"] == "/run/vram-exporter")
        .expect("a mount for the state");
    // The one mount the exporter writes to, with the root file system read-only.
    assert!(mount["readOnly"].is_null(), "{mount:?}");
    let volume = volume_of(pod, mount).unwrap();
    assert_eq!(text(volume, "hostPath.path"), "/run/vram-exporter");
    assert_eq!(text(volume, "hostPath.type"), "DirectoryOrCreate");
}

#[test]
fn podmonitor_scrapes_the_daemonset_pods_as_the_job_the_alerts_expect() {
    let monitor = read_yaml(&kubernetes_dir().join("podmonitor/podmonitor.yaml"));
    assert_eq!(text(&monitor, "apiVersion"), "monitoring.coreos.com/v1");
    assert_eq!(text(&monitor, "kind"), "PodMonitor");
    assert_eq!(text(&monitor, "metadata.name"), "vram-exporter");
    let daemonset = manifest("DaemonSet");
    let pod_labels = get(&daemonset, "spec.template.metadata.labels");
    for (key, value) in get(&monitor, "spec.selector.matchLabels")
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&pod_labels[key], value, "PodMonitor selector {key:?}");
    }
    // The job takes the pods' name label, which the absent-target alert names.
    let job_label = text(&monitor, "spec.jobLabel");
    let rules = fs::read_to_string(repository().join("alerts/vram-exporter.rules.yml")).unwrap();
    let job = pod_labels[job_label].as_str().unwrap();
    assert!(rules.contains(&format!("job=\"{job}\"")));
    let endpoint = get(&monitor, "spec.podMetricsEndpoints.0");
    assert_eq!(text(endpoint, "port"), "metrics");
    assert_eq!(
        text(endpoint, "relabelings.0.sourceLabels.0"),
        "__meta_kubernetes_pod_node_name"
    );
    assert_eq!(text(endpoint, "relabelings.0.targetLabel"), "node");
}
