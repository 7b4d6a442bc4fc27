//! node-problem-detector's custom plugin: the config shipped in
//! `deploy/kubernetes/node-problem-detector/vram-exporter.json` (and, as a copy, in the
//! chart), and the chart's option that runs node-problem-detector beside the exporter.
//!
//! node-problem-detector itself cannot be installed here: its Go module is not served
//! to this machine, and its image cannot be pulled. So its contract is tested with what
//! it runs, as its own code (kubernetes/node-problem-detector v1.36.0,
//! pkg/custompluginmonitor) runs it: each rule's command from the shipped config, exec'd
//! without a shell in a process group of its own, under the rule's timeout (never more
//! than the global one); standard output read up to 4 KiB, trimmed and cut at
//! `max_output_length`; exit 0 is OK, 1 a problem, anything else unknown. The config's
//! fields are checked against the schema that code and docs/custom_plugin_monitor.md
//! document (types/config.go and types/types.go, and the checks of `Validate`).

use crate::helm::{documents, render, CHART};
use crate::helpers::*;
use serde_json::Value;
use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHIPPED: &str = "deploy/kubernetes/node-problem-detector/vram-exporter.json";
/// What node-problem-detector reads of a plugin's standard output (its
/// `maxCustomPluginBufferBytes`).
const NPD_BUFFER_BYTES: u64 = 4096;

fn shipped() -> Value {
    serde_json::from_str(&fs::read_to_string(repository().join(SHIPPED)).unwrap()).unwrap()
}

/// A Go duration (`time.ParseDuration`): `30s`, `1m30s`, `500ms`.
fn go_duration(text: &str) -> Duration {
    let mut total = 0.0;
    let mut rest = text;
    assert!(!rest.is_empty(), "an empty duration");
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or_else(|| panic!("{text}: a number without a unit"));
        let value: f64 = rest[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("{text}: not a Go duration"));
        let unit_end = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |at| digits + at);
        let scale = match &rest[digits..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => panic!("{text}: {unit} is not a Go duration unit"),
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    Duration::from_secs_f64(total)
}

/// The keys of `object`, each of which must be one of `allowed`.
fn only_keys(object: &Value, allowed: &[&str], what: &str) {
    for key in object
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object"))
        .keys()
    {
        assert!(
            allowed.contains(&key.as_str()),
            "{what}: unknown field {key}"
        );
    }
}

#[test]
fn the_shipped_config_has_the_fields_of_node_problem_detectors_schema() {
    let config = shipped();
    // CustomPluginConfig's JSON fields.
    only_keys(
        &config,
        &[
            "plugin",
            "pluginConfig",
            "source",
            "conditions",
            "rules",
            "metricsReporting",
        ],
        "the config",
    );
    assert_eq!(config["plugin"], "custom", "the only plugin NPD supports");
    assert!(config["source"]
        .as_str()
        .is_some_and(|source| !source.is_empty()));
    assert!(config["metricsReporting"].is_boolean());
    // pluginGlobalConfig's.
    let global = &config["pluginConfig"];
    only_keys(
        global,
        &[
            "invoke_interval",
            "timeout",
            "max_output_length",
            "concurrency",
            "enable_message_change_based_condition_update",
            "skip_initial_status",
        ],
        "pluginConfig",
    );
    let interval = go_duration(global["invoke_interval"].as_str().unwrap());
    let global_timeout = go_duration(global["timeout"].as_str().unwrap());
    assert!(interval > Duration::ZERO);
    assert_eq!(global["max_output_length"], 80);
    assert!(global["concurrency"]
        .as_u64()
        .is_some_and(|workers| workers >= 1));
    assert!(global["enable_message_change_based_condition_update"].is_boolean());
    // Conditions are types.Condition: a permanent rule's condition must be one of them,
    // with the reason and message NPD sets while the node is fine.
    let conditions = config["conditions"].as_array().unwrap();
    for condition in conditions {
        only_keys(
            condition,
            &["type", "status", "transition", "reason", "message"],
            "a condition",
        );
        for field in ["type", "reason", "message"] {
            assert!(condition[field].is_string(), "{condition}");
        }
    }
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0]["type"], "GPUMemoryLeftover");
    // CustomRule's, and what Validate refuses.
    let mut reasons = Vec::new();
    for rule in config["rules"].as_array().unwrap() {
        only_keys(
            rule,
            &[
                "type",
                "condition",
                "reason",
                "path",
                "args",
                "timeout",
                "invoke_interval",
            ],
            "a rule",
        );
        match rule["type"].as_str() {
            Some("permanent") => assert!(
                conditions
                    .iter()
                    .any(|condition| condition["type"] == rule["condition"]),
                "permanent problem {} has no preset default condition",
                rule["condition"]
            ),
            Some("temporary") => assert!(rule.get("condition").is_none(), "{rule}"),
            other => panic!("rule type {other:?} is neither temporary nor permanent"),
        }
        assert!(Path::new(rule["path"].as_str().unwrap()).is_absolute());
        assert!(rule["args"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_string));
        let timeout = go_duration(rule["timeout"].as_str().unwrap());
        assert!(
            timeout <= global_timeout,
            "plugin timeout is greater than global timeout: {rule}"
        );
        reasons.push(rule["reason"].as_str().unwrap().to_string());
    }
    // The condition has one rule, so that it never flips between rules' results
    // (node-problem-detector#566); each verdict has a reason of its own, as an event.
    assert_eq!(
        reasons,
        [
            "GPUMemoryLeftover",
            "GPUMemoryOrphaned",
            "GPUMemoryLeftBehind",
            "GPUMemoryCannotTell"
        ]
    );
    // The chart carries the same config (deploy/generate.sh copies it).
    let copy: Value = serde_json::from_str(
        &fs::read_to_string(
            repository()
                .join(CHART)
                .join("files/node-problem-detector.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(copy, config);
}

#[test]
fn each_rules_command_ends_well_within_its_timeout() {
    // The check ends within --wait and two looks of --timeout; node-problem-detector
    // kills it at the rule's timeout, and a killed plugin is unknown with a message of
    // NPD's own. The invoke interval leaves room for a whole run.
    let config = shipped();
    let interval = go_duration(config["pluginConfig"]["invoke_interval"].as_str().unwrap());
    for rule in config["rules"].as_array().unwrap() {
        let flag = |name: &str| -> Duration {
            let prefix = format!("--{name}=");
            rule["args"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|arg| arg.as_str()?.strip_prefix(prefix.as_str()))
                .map(go_duration)
                .unwrap_or_else(|| panic!("{rule}: no {prefix}"))
        };
        let worst = flag("wait") + 2 * flag("timeout");
        let timeout = go_duration(rule["timeout"].as_str().unwrap());
        assert!(
            worst + Duration::from_secs(2) <= timeout && timeout <= interval,
            "{rule}: the check may run {worst:?}, the rule allows {timeout:?}"
        );
    }
}

/// What node-problem-detector makes of one run of a plugin: its status and message.
#[derive(Debug, Clone, PartialEq)]
enum Npd {
    Ok(String),
    NonOk(String),
    Unknown(String),
}

/// Run `rule` as node-problem-detector does, with `binary` where the config names the
/// copy the chart's init container makes, the host's `/proc` where the pod mounts it at
/// `/host/proc`, and the rig's NVML (the container runtime brings NVIDIA's).
fn run_rule(rule: &Value, global: &Value, binary: &Path, rig: &Rig) -> (Npd, Duration) {
    assert_eq!(rule["path"], "/vram-exporter/vram-exporter");
    let args: Vec<String> = rule["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap().replace("=/host/proc", "=/proc"))
        .collect();
    let timeout = go_duration(rule["timeout"].as_str().unwrap())
        .min(go_duration(global["timeout"].as_str().unwrap()));
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(&args)
        .arg("--nvml.library")
        .arg(&rig.library)
        .arg("--test.device-prefix")
        .arg(rig.device_prefix())
        .env("FAKE_NVML_SCENARIO", &rig.scenario)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = Vec::new();
    let mut pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        (&mut pipe)
            .take(NPD_BUFFER_BYTES)
            .read_to_end(&mut stdout)
            .unwrap();
        std::io::copy(&mut pipe, &mut std::io::sink()).unwrap();
        stdout
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < timeout,
            "node-problem-detector would have killed {args:?} at its timeout, {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let stdout = reader.join().unwrap();
    let mut message = String::from_utf8_lossy(&stdout).trim().to_string();
    let cut = global["max_output_length"].as_u64().unwrap() as usize;
    // The check's line fits, so node-problem-detector never cuts it (it would cut bytes).
    assert!(
        message.len() <= cut && !message.contains('\n'),
        "{message:?}"
    );
    message.truncate(cut);
    let npd = match status.code() {
        Some(0) => Npd::Ok(message),
        Some(1) => Npd::NonOk(message),
        _ => Npd::Unknown(message),
    };
    (npd, took)
}

/// Each rule's verdict on the rig as it is now: (reason, what NPD makes of it).
fn run_every_rule(binary: &Path, rig: &Rig) -> Vec<(String, Npd)> {
    let config = shipped();
    config["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            let (npd, _) = run_rule(rule, &config["pluginConfig"], binary, rig);
            (rule["reason"].as_str().unwrap().to_string(), npd)
        })
        .collect()
}

/// The binary as the chart's init container leaves it: `vram-exporter copy-to FOLDER`.
fn copied_binary(rig: &Rig) -> PathBuf {
    let folder = rig.dir.path().join("vram-exporter");
    fs::create_dir(&folder).unwrap();
    let copied = Command::new(exporter_binary())
        .args(["copy-to"])
        .arg(&folder)
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", said(&copied));
    let binary = folder.join("vram-exporter");
    assert_eq!(
        String::from_utf8_lossy(&copied.stdout),
        format!("copied vram-exporter to {}\n", binary.display())
    );
    assert_eq!(
        fs::read(&binary).unwrap(),
        fs::read(exporter_binary()).unwrap()
    );
    binary
}

#[test]
fn what_node_problem_detector_runs_says_clear_orphaned_or_unknown_with_its_reason() {
    let rig = Rig::new();
    let binary = copied_binary(&rig);
    let ok = |line: &str| Npd::Ok(line.to_string());
    let verdicts = |condition: Npd, orphaned: Npd, left: Npd, unknown: Npd| {
        [
            ("GPUMemoryLeftover", condition),
            ("GPUMemoryOrphaned", orphaned),
            ("GPUMemoryLeftBehind", left),
            ("GPUMemoryCannotTell", unknown),
        ]
        .map(|(reason, npd)| (reason.to_string(), npd))
        .to_vec()
    };

    let clear = "GPU 0 clear: idle";
    assert_eq!(
        run_every_rule(&binary, &rig),
        verdicts(ok(clear), ok(clear), ok(clear), ok(clear))
    );

    // A dead owner's memory that its fork-inherited child holds: the condition turns
    // True with the verdict as its message, and only the orphan rule makes an event.
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let orphaned = format!(
        "GPU 0 orphaned: 8.6 GiB, held by PID {pid}; kill {pid}",
        pid = child.pid
    );
    assert_eq!(
        run_every_rule(&binary, &rig),
        verdicts(
            Npd::NonOk(orphaned.clone()),
            Npd::NonOk(orphaned.clone()),
            ok(&orphaned),
            ok(&orphaned)
        )
    );
    drop(child);

    // NVML down: the condition is Unknown, never False; the unknown rule says why.
    rig.write_scenario(&Gpus::new().init_error("DriverNotLoaded").into_json());
    let down = "NVML down: NVIDIA driver is not loaded";
    assert_eq!(
        run_every_rule(&binary, &rig),
        verdicts(
            Npd::Unknown(down.into()),
            ok(down),
            ok(down),
            Npd::NonOk(down.into())
        )
    );
}

#[test]
fn a_hung_gpu_is_unknown_before_node_problem_detectors_timeout() {
    let rig = Rig::new();
    let binary = copied_binary(&rig);
    let never = rig.dir.path().join("never");
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).hang("nvmlDeviceGetMemoryInfo_v2", &never))
            .into_json(),
    );
    let config = shipped();
    let rule = &config["rules"][0];
    let (npd, took) = run_rule(rule, &config["pluginConfig"], &binary, &rig);
    let Npd::Unknown(message) = npd else {
        panic!("not unknown: {npd:?}")
    };
    let stuck: u64 = message
        .strip_prefix("GPU 0 not answering: stuck ")
        .and_then(|rest| rest.strip_suffix(" s in nvmlDeviceGetMemoryInfo_v2"))
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("{message:?}"));
    assert!((1..=10).contains(&stuck), "{message}");
    // The look's --timeout (10 s), then the answer: well inside the rule's 30 s.
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(15),
        "{took:?}"
    );
    fs::write(&never, "").unwrap();
}

#[test]
fn the_charts_option_runs_node_problem_detector_beside_the_exporter() {
    let yaml = render(
        &repository().join(CHART),
        &["--set", "nodeProblemDetector.enabled=true"],
    );
    let objects = documents(&yaml);
    let find = |kind: &str| -> &serde_norway::Value {
        objects
            .iter()
            .find(|object| {
                object["kind"] == kind
                    && (kind == "DaemonSet"
                        || object["metadata"]["name"]
                            .as_str()
                            .is_some_and(|name| name.ends_with("-node-problem-detector")))
            })
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let pod = &find("DaemonSet")["spec"]["template"]["spec"];
    let account = find("ServiceAccount")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(pod["serviceAccountName"].as_str(), Some(account.as_str()));
    // The token is node-problem-detector's alone: the pod mounts none by itself.
    assert_eq!(pod["automountServiceAccountToken"], false);
    let binding = find("ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], "system:node-problem-detector");
    assert_eq!(
        binding["subjects"][0]["name"].as_str(),
        Some(account.as_str())
    );

    // The init container copies the exporter into the volume node-problem-detector
    // runs it from, where the config's rules name it.
    let copy = &pod["initContainers"][0];
    assert_eq!(copy["image"], pod["containers"][0]["image"]);
    let copy_args: Vec<&str> = copy["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap())
        .collect();
    assert_eq!(copy_args, ["copy-to", "/vram-exporter"]);
    let npd = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|container| container["name"] == "node-problem-detector")
        .expect("node-problem-detector's container");
    assert_eq!(
        npd["image"],
        "registry.k8s.io/node-problem-detector/node-problem-detector:v1.36.0"
    );
    let mount = |container: &serde_norway::Value, path: &str| -> String {
        container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|mount| mount["mountPath"] == path)
            .unwrap_or_else(|| panic!("{:?} mounts nothing at {path}", container["name"]))["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(mount(copy, "/vram-exporter"), mount(npd, "/vram-exporter"));
    // The config from the ConfigMap, the host's /proc where the rules look, a token.
    let command: Vec<&str> = npd["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|word| word.as_str().unwrap())
        .collect();
    assert!(
        command.contains(&"--config.custom-plugin-monitor=/config/vram-exporter.json"),
        "{command:?}"
    );
    let config_volume = mount(npd, "/config");
    let map_name = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == config_volume.as_str())
        .unwrap()["configMap"]["name"]
        .clone();
    let map = objects
        .iter()
        .find(|object| object["kind"] == "ConfigMap" && object["metadata"]["name"] == map_name)
        .expect("the plugin's ConfigMap");
    let rendered: Value =
        serde_json::from_str(map["data"]["vram-exporter.json"].as_str().unwrap()).unwrap();
    assert_eq!(rendered, shipped());
    assert_eq!(
        mount(npd, "/host/proc"),
        mount(&pod["containers"][0], "/host/proc")
    );
    assert_eq!(
        mount(npd, "/var/run/secrets/kubernetes.io/serviceaccount"),
        "node-problem-detector-token"
    );
    assert!(npd["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|env| env["name"] == "NODE_NAME"
            && env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    // The holder scan's capabilities, as the exporter's container has them.
    assert_eq!(
        npd["securityContext"],
        pod["containers"][0]["securityContext"]
    );

    // Off by default: nothing of it.
    let plain = documents(&render(&repository().join(CHART), &[]));
    assert!(plain.iter().all(
        |object| !["ServiceAccount", "ClusterRoleBinding", "ConfigMap"]
            .contains(&object["kind"].as_str().unwrap())
    ));
    let pod = &plain
        .iter()
        .find(|object| object["kind"] == "DaemonSet")
        .unwrap()["spec"]["template"]["spec"];
    assert!(pod["initContainers"].is_null() && pod["serviceAccountName"].is_null());
    assert_eq!(pod["containers"].as_sequence().unwrap().len(), 1);
}
