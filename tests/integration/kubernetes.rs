//! Kubernetes: the pod each GPU is assigned to, from a stand-in kubelet speaking the real
//! pod-resources gRPC API on a Unix socket, and the pod a holder or owner runs in, from
//! its real cgroup and a pod log directory. Also what happens when the kubelet is absent,
//! goes away and comes back, or answers garbage: the exporter keeps serving, says so in
//! its kubelet gauges, and never panics.

use crate::containers::Cgroup;
use crate::helpers::*;
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub(crate) const CONTAINER: &str =
    "5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61";
pub(crate) const POD_UID: &str = "a36d0c1d-0b26-4451-8d80-9c195e004afa";
const OTHER_CONTAINER: &str = "7ee34913fbefa6a0dbbdf1bbc302cc29a1bde3b83b8b9f2252a4d4360c373848";
const OTHER_POD_UID: &str = "ea2e69b4-0bd4-48f0-b75f-cc7c79111027";
/// A MIG device on GPU 3.
const MIG: &str = "MIG-3b1c2a51-0003-4000-8000-000000000001";
/// The kubelet is read every 100 ms in these tests (10 s by default).
const FAST: &[&str] = &["--kubelet.refresh-interval", "100ms"];
const WAIT: Duration = Duration::from_secs(20);

/// Four GPUs, GPU 3 split into MIG devices, GPU 0 holding `USED`.
fn four_gpus(rig: &Rig) {
    let device = |gi: u32, uuid: &str| {
        let mut device = MigDevice::new(3, gi);
        device.0["uuid"] = json!(uuid);
        device
    };
    let mig = Gpu::idle(3).mig(vec![
        device(1, "MIG-3b1c2a51-0003-4000-8000-000000000000"),
        device(2, MIG),
    ]);
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0))
            .gpu(Gpu::idle(1))
            .gpu(Gpu::idle(2))
            .gpu(mig)
            .into_json(),
    );
}

/// A node with every shape the kubelet can report: a pod with two GPUs, a pod with two containers (one with a
/// GPU, one with a MIG device), a pod without devices, and a GPU NVML does not list.
fn node() -> Vec<Pod> {
    let (gpu0, gpu1, gpu2) = (Gpu::uuid(0), Gpu::uuid(1), Gpu::uuid(2));
    vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&gpu0, &gpu1])]),
        Pod::new("ml", "train-0")
            .container(
                "trainer",
                &[
                    ("nvidia.com/gpu", &[&gpu2]),
                    ("example.com/fpga", &["fpga-0"]),
                ],
            )
            .container("sidecar", &[("nvidia.com/mig-1g.18gb", &[MIG])]),
        Pod::new("default", "web").container("nginx", &[]),
        Pod::new("ml", "lost-0").container(
            "main",
            &[(
                "nvidia.com/gpu",
                &["GPU-ffffffff-0000-4000-8000-000000000000"],
            )],
        ),
    ]
}

/// An empty pod log directory, or one with a directory per `(namespace, name, uid)`.
pub(crate) fn pod_logs(rig: &Rig, pods: &[(&str, &str, &str)]) -> PathBuf {
    let logs = rig.dir.path().join("log-pods");
    fs::create_dir_all(&logs).unwrap();
    for (namespace, name, uid) in pods {
        fs::create_dir_all(logs.join(format!("{namespace}_{name}_{uid}")).join("main")).unwrap();
    }
    logs
}

pub(crate) fn path(path: &std::path::Path) -> String {
    path.display().to_string()
}

/// The `vram_gpu_pod_info` series as (gpu, namespace, pod, container, resource, device).
fn gpu_pods(metrics: &Metrics) -> Vec<(String, String, String, String, String, String)> {
    let mut found: Vec<_> = metrics
        .find("vram_gpu_pod_info", &[])
        .into_iter()
        .map(|(_, labels, value)| {
            assert_eq!(*value, 1.0);
            let label = |key: &str| labels[key].clone();
            (
                label("gpu"),
                label("namespace"),
                label("pod"),
                label("container"),
                label("resource"),
                label("device"),
            )
        })
        .collect();
    found.sort();
    found
}

fn row(fields: [&str; 6]) -> (String, String, String, String, String, String) {
    let [gpu, namespace, pod, container, resource, device] = fields.map(str::to_string);
    (gpu, namespace, pod, container, resource, device)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The kubelet gauges of the pod-resources source: (up, the error kind at 1 if any).
fn pod_resources_state(metrics: &Metrics) -> (f64, Option<String>) {
    let up = metrics.value("vram_kubelet_up", &[("source", "pod_resources")]);
    let errors: Vec<String> = metrics
        .find("vram_kubelet_error", &[("source", "pod_resources")])
        .into_iter()
        .filter(|(_, _, value)| *value == 1.0)
        .map(|(_, labels, _)| labels["error"].clone())
        .collect();
    assert!(errors.len() <= 1, "{errors:?}");
    (up, errors.into_iter().next())
}

/// Scrape until the pod-resources source reports `error` (`None`: up).
fn wait_for_pod_resources(exporter: &Exporter, error: Option<&str>) -> Metrics {
    let mut last = None;
    wait_until(
        &format!("the pod-resources source reports {error:?}"),
        WAIT,
        || {
            let metrics = exporter.scrape();
            let state = pod_resources_state(&metrics);
            let done = state.1.as_deref() == error && (state.0 == 1.0) == error.is_none();
            last = Some(metrics);
            done
        },
    );
    last.unwrap()
}

#[test]
fn gpus_are_labelled_with_the_pods_the_kubelet_assigned_them_to() {
    let rig = Rig::new();
    four_gpus(&rig);
    let kubelet = StandInKubelet::start(Behaviour::Answer(node()));
    let logs = pod_logs(&rig, &[]);
    let before = unix_now();
    let (socket, logs) = (kubelet.socket_arg(), path(&logs));
    let exporter = rig.start(&[
        "--kubelet.pod-resources-path",
        &socket,
        "--path.pod-logs",
        &logs,
    ]);
    let metrics = exporter.scrape();

    assert_eq!(
        gpu_pods(&metrics),
        [
            row([
                "0",
                "ml",
                "sglang-0",
                "server",
                "nvidia.com/gpu",
                &Gpu::uuid(0)
            ]),
            row([
                "1",
                "ml",
                "sglang-0",
                "server",
                "nvidia.com/gpu",
                &Gpu::uuid(1)
            ]),
            row([
                "2",
                "ml",
                "train-0",
                "trainer",
                "nvidia.com/gpu",
                &Gpu::uuid(2)
            ]),
            row([
                "3",
                "ml",
                "train-0",
                "sidecar",
                "nvidia.com/mig-1g.18gb",
                MIG
            ]),
        ]
    );
    // The MIG device is placed on its GPU, whose UUID joins the other per-GPU series.
    let mig = metrics.find("vram_gpu_pod_info", &[("device", MIG)]);
    assert_eq!(mig[0].1["uuid"], Gpu::uuid(3));
    assert_eq!(
        metrics.value("vram_gpu_info", &[("gpu", "3"), ("uuid", &Gpu::uuid(3))]),
        1.0
    );
    // A GPU of the kubelet's that NVML does not list is counted, not invented.
    assert_eq!(metrics.value("vram_kubelet_unmatched_devices", &[]), 1.0);
    for source in ["pod_resources", "pod_logs"] {
        assert_eq!(metrics.value("vram_kubelet_up", &[("source", source)]), 1.0);
        assert!(metrics
            .find("vram_kubelet_error", &[("source", source)])
            .iter()
            .all(|(_, _, value)| *value == 0.0));
        let taken = metrics.value(
            "vram_kubelet_last_success_timestamp_seconds",
            &[("source", source)],
        );
        assert!(
            taken >= before.floor() && taken <= unix_now(),
            "{source}: {taken}"
        );
    }
    assert!(kubelet.calls() >= 1);
    assert_promtool_clean(&metrics.text);

    // The kubelet is asked on its own timer, not per scrape: a change shows within a
    // refresh interval, here the default 10 s, so three quick scrapes make no call.
    let calls = kubelet.calls();
    for _ in 0..3 {
        exporter.scrape();
    }
    assert!(
        kubelet.calls() <= calls + 1,
        "scrapes must not call the kubelet"
    );
}

#[test]
fn a_culprit_in_a_pod_is_named_with_its_namespace_and_pod() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let (other_dead_owner, host_child) = Holder::fork_orphan(&rig.device(1));
    // The holder's real cgroup is a pod's (the cgroupfs driver's layout).
    let cgroup = Cgroup::create(&format!("kubepods/burstable/pod{POD_UID}/{CONTAINER}"));
    cgroup.add(child.pid);
    // A live owner in another pod, for the per-process series.
    let owner = Holder::spawn(&rig.device(2));
    let owner_cgroup = Cgroup::create(&format!("kubepods/pod{OTHER_POD_UID}/{OTHER_CONTAINER}"));
    owner_cgroup.add(owner.pid);
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, other_dead_owner))
            .gpu(Gpu::one_owner(2, owner.pid))
            .into_json(),
    );
    let logs = pod_logs(
        &rig,
        &[
            ("ml", "sglang-0", POD_UID),
            ("batch", "eval-7", OTHER_POD_UID),
            ("default", "web", "1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e"),
        ],
    );
    let kubelet = StandInKubelet::start(Behaviour::Answer(vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&Gpu::uuid(0)])])
    ]));
    let flags = [
        "--kubelet.pod-resources-path",
        &kubelet.socket_arg(),
        "--path.pod-logs",
        &path(&logs),
    ];

    let metrics = rig
        .start(&[&flags[..], &["--collector.processes"]].concat())
        .scrape();
    let pid = child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("container_id", CONTAINER),
                ("pod_uid", POD_UID),
                ("namespace", "ml"),
                ("pod", "sglang-0"),
            ]
        ),
        1.0
    );
    // The GPU's pod and the culprit's pod join on the GPU.
    assert_eq!(
        metrics.value(
            "vram_gpu_pod_info",
            &[("gpu", "0"), ("namespace", "ml"), ("pod", "sglang-0")]
        ),
        1.0
    );
    // A holder outside any pod has empty pod labels; so has a GPU with no pod, none.
    let host_pid = host_child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "1"),
                ("pid", &host_pid),
                ("pod_uid", ""),
                ("namespace", ""),
                ("pod", "")
            ]
        ),
        1.0
    );
    assert!(metrics
        .find("vram_gpu_pod_info", &[("gpu", "1")])
        .is_empty());
    let owner_pid = owner.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[
                ("gpu", "2"),
                ("pid", &owner_pid),
                ("pod_uid", OTHER_POD_UID),
                ("namespace", "batch"),
                ("pod", "eval-7"),
            ]
        ),
        CHARGED as f64
    );
    assert_promtool_clean(&metrics.text);

    // check names the culprit's pod and the pod the GPU is assigned to, in words and JSON.
    let text = rig.run(&[&["check", "--gpu", "0"][..], &flags[..]].concat());
    assert_eq!(text.status, Some(1), "{text:?}");
    assert!(
        text.stdout
            .contains("\n  assigned to ml/sglang-0 (container server)\n"),
        "{}",
        text.stdout
    );
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!("PID {} (dataloader, ", child.pid))
            && sentence.contains(", pod ml/sglang-0, holds a context on GPU 0"),
        "{sentence}"
    );
    let document = rig
        .run(&[&["check", "--json", "--gpu", "0"][..], &flags[..]].concat())
        .json();
    let gpu = &document["gpus"][0];
    assert_eq!(
        gpu["culprits"][0]["pod"],
        json!({"namespace": "ml", "name": "sglang-0"}),
        "{gpu:#}"
    );
    assert_eq!(
        gpu["assigned_to"],
        json!([{"pod": {"namespace": "ml", "name": "sglang-0"}, "container": "server"}])
    );

    // A snapshot keeps the pods: replayed elsewhere, without a kubelet, it names them.
    let snapshot = rig.dir.path().join("snapshot.json");
    let taken = rig.run(&[&["snapshot", "-o", &path(&snapshot)][..], &flags[..]].concat());
    assert_eq!(taken.status, Some(0), "{taken:?}");
    let document: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&snapshot).unwrap()).unwrap();
    let kubernetes = &document["observation"]["kubernetes"];
    assert_eq!(
        kubernetes["pod_names"][POD_UID],
        json!({"namespace": "ml", "name": "sglang-0"}),
        "{kubernetes:#}"
    );
    // Only the pods of owners and holders are recorded, not the whole node.
    let named: Vec<&String> = kubernetes["pod_names"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(named, [POD_UID, OTHER_POD_UID]);
    drop(kubelet);
    let replayed = rig
        .start(&["--replay", &path(&snapshot), "--collector.processes"])
        .scrape();
    for name in [
        "vram_holder_info",
        "vram_gpu_pod_info",
        "vram_process_used_bytes",
    ] {
        let labels = |metrics: &Metrics| -> Vec<BTreeMap<String, String>> {
            metrics
                .find(name, &[])
                .into_iter()
                .map(|(_, labels, _)| labels.clone())
                .collect()
        };
        assert_eq!(labels(&replayed), labels(&metrics), "{name}");
    }
    drop((cgroup, owner_cgroup));
}

#[test]
fn on_a_host_without_kubernetes_there_is_no_kubelet_series_and_one_line_says_why() {
    // The defaults, not given on the command line: the host of this test has no kubelet
    // there (a Kubernetes node would make this test meaningless, hence the check).
    for default in [
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "/var/log/pods",
    ] {
        assert!(
            !std::path::Path::new(default).exists(),
            "this test needs a host without a kubelet, and {default} exists"
        );
    }
    let rig = Rig::new();
    rig.charge_gpu0(nonexistent_pid(), Some(CHARGED));
    let exporter = rig.start(&[FAST, &["--log.level", "debug"]].concat());
    let metrics = exporter.scrape();
    let kubelet: Vec<&str> = metrics
        .text
        .lines()
        .filter(|line| line.contains("vram_kubelet_") || line.contains("vram_gpu_pod_info"))
        .collect();
    assert!(kubelet.is_empty(), "{kubelet:?}");
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_promtool_clean(&metrics.text);
    // One line at the default level, not one per refresh.
    wait_until("five refreshes have run", WAIT, || {
        exporter.log().matches("kubelet sources read").count() >= 5
    });
    let log = exporter.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("kubelet") && !line.contains("level=debug"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("level=info") && said[0].contains("its series appear once one is found"),
        "{log}"
    );
}

#[test]
fn a_kubelet_named_on_the_command_line_but_absent_reads_as_down_and_says_so() {
    let rig = Rig::new();
    rig.charge_gpu0(nonexistent_pid(), Some(CHARGED));
    let nowhere = rig.dir.path().join("no-kubelet");
    let flags = [
        "--kubelet.pod-resources-path",
        &path(&nowhere.join("pod-resources/kubelet.sock")),
        "--path.pod-logs",
        &path(&nowhere.join("pods")),
    ];
    let exporter = rig.start(&[&flags[..], FAST, &["--log.level", "debug"]].concat());
    let metrics = exporter.scrape();
    for source in ["pod_resources", "pod_logs"] {
        assert_eq!(metrics.value("vram_kubelet_up", &[("source", source)]), 0.0);
        assert_eq!(
            metrics.value(
                "vram_kubelet_error",
                &[("source", source), ("error", "absent")]
            ),
            1.0
        );
        assert_eq!(
            metrics.value(
                "vram_kubelet_last_success_timestamp_seconds",
                &[("source", source)]
            ),
            0.0
        );
    }
    assert!(!metrics.has("vram_gpu_pod_info"));
    // Everything else as without Kubernetes.
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_promtool_clean(&metrics.text);

    // Said once per source, not at every refresh: the paths were given, so their
    // absence is news (at info), where a host that names no kubelet hears one line.
    wait_until("five refreshes have run", WAIT, || {
        exporter.log().matches("kubelet sources read").count() >= 5
    });
    let log = exporter.log();
    let absent: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("kubelet source absent"))
        .collect();
    assert_eq!(absent.len(), 2, "{log}");
    assert!(
        absent.iter().all(|line| line.contains("level=info")),
        "{log}"
    );
    assert!(!log.contains("its series appear once"), "{log}");
    assert!(!log.contains("level=warn"), "{log}");

    let check = rig.run(&[&["check"][..], &flags[..]].concat());
    assert_eq!(check.status, Some(1), "{check:?}");
    assert!(!check.stderr.contains("kubelet"), "{}", check.stderr);
}

#[test]
fn a_kubelet_that_goes_away_and_comes_back_is_found_again() {
    let rig = Rig::new();
    four_gpus(&rig);
    let mut kubelet = StandInKubelet::start(Behaviour::Answer(node()));
    let exporter = rig.start(
        &[
            &["--kubelet.pod-resources-path", &kubelet.socket_arg()][..],
            FAST,
            &["--log.level", "debug"],
        ]
        .concat(),
    );
    let before = wait_for_pod_resources(&exporter, None);
    let assigned = gpu_pods(&before);
    assert_eq!(assigned.len(), 4);

    // The kubelet stops and its socket goes (a restart, an upgrade).
    kubelet.stop();
    let during = wait_for_pod_resources(&exporter, Some("absent"));
    // The last good answer is kept, with the time it was taken.
    assert_eq!(gpu_pods(&during), assigned);
    let stamp = |metrics: &Metrics| {
        metrics.value(
            "vram_kubelet_last_success_timestamp_seconds",
            &[("source", "pod_resources")],
        )
    };
    let answered_at = stamp(&during);
    let reads = exporter.log().matches("kubelet sources read").count();
    wait_until("five refreshes without a kubelet", WAIT, || {
        exporter.log().matches("kubelet sources read").count() >= reads + 5
    });
    assert_eq!(stamp(&exporter.scrape()), answered_at);

    // A new kubelet at the same path, with a pod gone: found without a restart.
    kubelet.set(Behaviour::Answer(vec![
        Pod::new("ml", "train-1").container("trainer", &[("nvidia.com/gpu", &[&Gpu::uuid(2)])])
    ]));
    kubelet.restart();
    let after = wait_for_pod_resources(&exporter, None);
    assert_eq!(
        gpu_pods(&after),
        [row([
            "2",
            "ml",
            "train-1",
            "trainer",
            "nvidia.com/gpu",
            &Gpu::uuid(2)
        ])]
    );
    assert!(stamp(&after) > answered_at);
    let log = exporter.log();
    let said = |text: &str| {
        log.lines()
            .filter(|line| line.contains(text) && line.contains("source=pod_resources"))
            .count()
    };
    assert_eq!(said("kubelet source absent"), 1, "{log}");
    assert_eq!(said("kubelet source answers"), 2, "{log}");
}

#[test]
fn garbage_from_the_kubelet_sets_its_error_gauge_and_never_a_panic() {
    let rig = Rig::new();
    four_gpus(&rig);
    let kubelet = StandInKubelet::start(Behaviour::Answer(node()));
    let mut exporter = rig.start(
        &[
            &["--kubelet.pod-resources-path", &kubelet.socket_arg()][..],
            FAST,
        ]
        .concat(),
    );
    let good = gpu_pods(&wait_for_pod_resources(&exporter, None));

    let cases: [(Behaviour, &str); 6] = [
        // Bytes that are no protobuf at all (wire type 7 does not exist).
        (
            Behaviour::Bytes(vec![0xff, 0xff, 0xff, 0x0f, 0x07]),
            "malformed",
        ),
        // Another message: a NUMANode (field 1 a number) where pods (field 1 messages) go.
        (Behaviour::Bytes(vec![0x08, 0x07]), "malformed"),
        // A pod name that is not UTF-8.
        (
            Behaviour::Bytes(vec![0x0a, 0x03, 0x0a, 0x01, 0xff]),
            "malformed",
        ),
        (
            Behaviour::Status(tonic::Code::PermissionDenied),
            "rpc_error",
        ),
        (Behaviour::NotHttp2, "unavailable"),
        (Behaviour::Hang, "timeout"),
    ];
    for (behaviour, error) in cases {
        // Through a good answer between cases, so each failure is a fresh change.
        kubelet.set(Behaviour::Answer(node()));
        wait_for_pod_resources(&exporter, None);
        kubelet.set(behaviour.clone());
        let calls = kubelet.calls();
        let metrics = wait_for_pod_resources(&exporter, Some(error));
        wait_until("two more calls", WAIT, || kubelet.calls() >= calls + 2);
        // Still serving, with the last good answer.
        assert_eq!(gpu_pods(&metrics), good, "{behaviour:?}");
        assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
        assert!(
            exporter.child.try_wait().unwrap().is_none(),
            "the exporter exited on {behaviour:?}"
        );
    }
    let log = exporter.log();
    assert!(!log.contains("panicked"), "{log}");
    // One warning per failure, not per refresh.
    assert_eq!(log.matches("kubelet source failing").count(), 6, "{log}");
    assert_eq!(exporter.get("/-/healthy").status, 200);
}

#[test]
fn the_dashboard_lists_orphaned_memory_by_namespace_and_pod() {
    let query = super::dashboard::dashboard_queries()
        .into_iter()
        .find(|query| query.contains("vram_gpu_pod_info"))
        .expect("a dashboard panel joins vram_gpu_pod_info");
    // GPU 2 is assigned to ml/sglang-0 and a culprit runs there (another on the host);
    // GPU 7 is assigned to no pod; GPU 0 is assigned but holds nothing orphaned.
    let at = |gpu: &str| {
        format!(r#"job="vram-exporter",instance="10.0.3.7:9077",gpu="{gpu}",uuid="GPU-{gpu}""#)
    };
    let test = format!(
        r#"rule_files: []
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'vram_orphaned_bytes{{{g2},reason="owner_gone"}}'
        values: '79804219392x4'
      - series: 'vram_orphaned_bytes{{{g2},reason="unattributed"}}'
        values: '0x4'
      - series: 'vram_orphaned_bytes{{{g7},reason="owner_gone"}}'
        values: '4294967296x4'
      - series: 'vram_orphaned_bytes{{{g0},reason="owner_gone"}}'
        values: '0x4'
      - series: 'vram_gpu_info{{{g0},name="NVIDIA H200"}}'
        values: '1x4'
      - series: 'vram_gpu_info{{{g2},name="NVIDIA H200"}}'
        values: '1x4'
      - series: 'vram_gpu_info{{{g7},name="NVIDIA H200"}}'
        values: '1x4'
      - series: 'vram_gpu_pod_info{{{g2},namespace="ml",pod="sglang-0",container="server"}}'
        values: '1x4'
      - series: 'vram_gpu_pod_info{{{g0},namespace="ml",pod="train-4",container="trainer"}}'
        values: '1x4'
      - series: 'vram_holder_info{{{g2},pid="5213",namespace="ml",pod="sglang-0"}}'
        values: '1x4'
      - series: 'vram_holder_info{{{g2},pid="812",namespace="",pod=""}}'
        values: '1x4'
    promql_expr_test:
      - expr: {query}
        eval_time: 30s
        exp_samples:
          - labels: '{{{g2},namespace="ml",pod="sglang-0",role="GPU assigned to"}}'
            value: 79804219392
          - labels: '{{{g2},namespace="ml",pod="sglang-0",role="culprit runs in"}}'
            value: 79804219392
          - labels: '{{{g7},pod="(none)",role="GPU assigned to"}}'
            value: 4294967296
"#,
        g0 = at("0"),
        g2 = at("2"),
        g7 = at("7"),
        query = serde_json::to_string(&query).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-pods.yml");
    fs::write(&file, test).unwrap();
    let (ok, output) = super::alerts::run_promtool(&["test", "rules", &path(&file)]);
    assert!(ok, "{output}");
}
