//! One truth, whoever looks: every verdict shape the suite makes, run through both faces
//! of the product, the served exporter (its `/metrics`, and its verdict at `/verdict`)
//! and `check` run beside it, which must give the same finding, bytes, culprits and kill
//! line. Real processes, the fake NVML and, where only a GPU driver could make a process
//! do it (a kill stuck in the driver, an exit in progress), a `/proc` fixture tree.

use crate::containers::Cgroup;
use crate::helpers::*;
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use crate::kubernetes::{pod_logs, CONTAINER, POD_UID};
use crate::mig::ThreeInstances;
use serde_json::Value;
use std::any::Any;
use std::time::Duration;

/// The task_struct flags of a sleeping user process, and PF_EXITING.
const USER_FLAGS: u32 = 4_194_560;
const PF_EXITING: u32 = 0x4;

/// A host in one verdict shape, with the served exporter watching it.
struct World {
    rig: Rig,
    /// Flags both faces take (a fixture procfs, the kubelet's sources, MIG's table).
    args: Vec<String>,
    exporter: Exporter,
    /// Processes and fixtures the shape needs alive while it is looked at.
    _keep: Vec<Box<dyn Any>>,
}

/// What a face says of one GPU (or MIG instance): the finding, the bytes it is about,
/// the culprits (PID and pod), and what the kill line names.
#[derive(Debug, Clone, PartialEq)]
struct Said {
    finding: String,
    bytes: u64,
    culprits: Vec<(u64, Value)>,
    kill: Vec<u64>,
}

/// What a verdict document (`check --json` or `/verdict`) says of one GPU or instance.
fn said(gpu: &Value) -> Said {
    let finding = gpu["finding"].as_str().unwrap_or_default().to_string();
    // From the lists, which a GPU's document and a MIG instance's both carry.
    let sum = |list: &Value, state: Option<&str>| -> u64 {
        list.as_array()
            .into_iter()
            .flatten()
            .filter(|owner| state.is_none_or(|state| owner["state"] == state))
            .filter_map(|owner| owner["used_bytes"].as_u64())
            .sum()
    };
    let owners = &gpu["owners"];
    let bytes = match finding.as_str() {
        "orphaned" => gpu["orphaned_bytes"].as_u64().unwrap(),
        "left_behind" => sum(&gpu["left_behind"], None),
        "killed_stuck" => sum(owners, Some("killed")),
        "being_freed" => sum(owners, Some("exiting")),
        _ => sum(owners, Some("running")),
    };
    let mut culprits: Vec<(u64, Value)> = gpu["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|culprit| (culprit["pid"].as_u64().unwrap(), culprit["pod"].clone()))
        .collect();
    culprits.sort_by_key(|(pid, _)| *pid);
    let mut kill = match gpu["remedy"]["action"].as_str() {
        Some("kill" | "kill_left_behind") => pids_of(&gpu["remedy"]["targets"]),
        _ => Vec::new(),
    };
    kill.sort_unstable();
    Said {
        finding,
        bytes,
        culprits,
        kill,
    }
}

/// What `/metrics` says of GPU 0: the finding read from the families the alerts page
/// on, in the order classify decides them, the culprits named in `vram_holder_info`, and
/// the processes whose ending frees the memory (those culprits, or the left-behind
/// workers named in `vram_left_behind_since_timestamp_seconds`).
fn said_by_metrics(metrics: &Metrics) -> Said {
    let gpu = [("gpu", "0")];
    let value = |name: &str, labels: &[(&str, &str)]| {
        metrics
            .find(name, &[&gpu[..], labels].concat())
            .iter()
            .map(|sample| sample.2)
            .sum::<f64>() as u64
    };
    let orphaned = value("vram_orphaned_bytes", &[]);
    let left_behind =
        value("vram_left_behind_bytes", &[]) + value("vram_possibly_left_behind_bytes", &[]);
    let owned = |state: &str| value("vram_owned_bytes", &[("state", state)]);
    let (finding, bytes) = if orphaned > 0 {
        ("orphaned", orphaned)
    } else if left_behind > 0 {
        ("left_behind", left_behind)
    } else if owned("killed") > 0 {
        ("killed_stuck", owned("killed"))
    } else if owned("exiting") > 0 {
        ("being_freed", owned("exiting"))
    } else {
        ("owned", owned("running"))
    };
    let mut culprits: Vec<(u64, Value)> = metrics
        .find("vram_holder_info", &gpu)
        .into_iter()
        .map(|(_, labels, _)| {
            let pod = match labels.get("pod").map(String::as_str) {
                None | Some("") => Value::Null,
                Some(name) => serde_json::json!({"namespace": labels["namespace"], "name": name}),
            };
            (labels["pid"].parse().unwrap(), pod)
        })
        .collect();
    culprits.sort_by_key(|(pid, _)| *pid);
    let mut kill: Vec<u64> = if finding == "left_behind" {
        metrics
            .find("vram_left_behind_since_timestamp_seconds", &gpu)
            .into_iter()
            .map(|(_, labels, _)| labels["pid"].parse().unwrap())
            .collect()
    } else {
        culprits.iter().map(|(pid, _)| *pid).collect()
    };
    kill.sort_unstable();
    Said {
        finding: finding.into(),
        bytes,
        culprits,
        kill,
    }
}

/// The two faces of `world` agree on GPU 0 (and each of its MIG instances), and say
/// `finding`, with `culprits` culprits and `kill` processes in the kill line.
fn assert_faces_agree(shape: &str, world: &World, (finding, culprits, kill): Expected) {
    let args: Vec<&str> = world.args.iter().map(String::as_str).collect();
    let check = world
        .rig
        .run(&[&["check", "--json"][..], &args[..]].concat())
        .json();
    let metrics = world.exporter.scrape();
    let served: Value = serde_json::from_str(&world.exporter.get("/verdict").body)
        .unwrap_or_else(|error| panic!("{shape}: /verdict is not JSON: {error}"));
    let (checked, verdict) = (&check["gpus"][0], &served["gpus"][0]);
    let checked_said = said(checked);
    assert_eq!(
        (
            checked_said.finding.as_str(),
            checked_said.culprits.len(),
            checked_said.kill.len()
        ),
        (finding, culprits, kill),
        "{shape}: {checked:#}"
    );
    assert_eq!(said(checked), said(verdict), "{shape}: check and /verdict");
    assert_eq!(check["status"], served["status"], "{shape}");
    for (instance, served_instance) in checked["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(verdict["instances"].as_array().into_iter().flatten())
    {
        assert_eq!(
            said(instance),
            said(served_instance),
            "{shape}: an instance"
        );
        let gi = instance["gpu_instance_id"].to_string();
        let orphaned: f64 = metrics
            .find(
                "vram_mig_orphaned_bytes",
                &[("gpu", "0"), ("GPU_I_ID", &gi)],
            )
            .iter()
            .map(|sample| sample.2)
            .sum();
        assert_eq!(
            orphaned as u64,
            instance["orphaned_bytes"].as_u64().unwrap(),
            "{shape}: GI {gi} in /metrics"
        );
    }
    if checked["instances"].as_array().is_none_or(Vec::is_empty) {
        assert_eq!(
            said(checked),
            said_by_metrics(&metrics),
            "{shape}: check and /metrics"
        );
    }
}

fn world(rig: Rig, args: &[String], keep: Vec<Box<dyn Any>>) -> World {
    let flags: Vec<&str> = args.iter().map(String::as_str).collect();
    let exporter = rig.start(&flags);
    World {
        rig,
        args: args.to_vec(),
        exporter,
        _keep: keep,
    }
}

fn orphan() -> World {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    world(rig, &[], vec![Box::new(child)])
}

fn left_behind() -> World {
    let rig = Rig::new();
    let Server { server, workers } =
        Model::cuda("api-server", &rig.device(0)).spawn_server(2, "engine-core");
    let gpu = workers.iter().fold(
        Gpu::idle(0).used(2 * CHARGED + 9 * 1024 * 1024),
        |gpu, worker| gpu.process(worker.pid, Some(CHARGED)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let world = world(rig, &[], vec![Box::new(workers)]);
    world.exporter.scrape();
    server.kill();
    wait_until(
        "the exporter sees the workers left behind",
        Duration::from_secs(10),
        || {
            world
                .exporter
                .scrape()
                .value("vram_left_behind_bytes", &[("gpu", "0")])
                > 0.0
        },
    );
    world
}

/// An owner read from a fixture tree in `state` with `flags` and `status` lines.
fn fixture_owner(state: char, flags: u32, status: &str) -> World {
    let rig = Rig::new();
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        (state, flags),
        status,
        "uvm_va_space_destroy",
    );
    rig.charge_gpu0(4242, Some(CHARGED));
    let args = [
        "--test.procfs-stand-in".to_string(),
        "--path.procfs".to_string(),
        procfs.display().to_string(),
    ];
    world(rig, &args, Vec::new())
}

fn killed_stuck() -> World {
    fixture_owner(
        'D',
        USER_FLAGS,
        "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n",
    )
}

fn being_freed() -> World {
    fixture_owner(
        'D',
        USER_FLAGS | PF_EXITING,
        "SigPnd:\t0000000000000100\nShdPnd:\t0000000000000100\n",
    )
}

fn reuse() -> World {
    let rig = Rig::new();
    let (dead_owner, mut children) = Model::cuda("cuda-job", &rig.device(0))
        .in_launchers_session()
        .fork_orphan(1, "dataloader");
    let reuser = Model::agent("gpu-health", &rig.device(0)).spawn_at(dead_owner);
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    world(
        rig,
        &[],
        vec![Box::new(children.remove(0)), Box::new(reuser)],
    )
}

fn mig() -> World {
    let three = ThreeInstances::new();
    let args = [
        "--test.mig-minors".to_string(),
        three.mig_minors.display().to_string(),
    ];
    let ThreeInstances {
        rig,
        owner,
        culprit,
        ..
    } = three;
    world(rig, &args, vec![Box::new(owner), Box::new(culprit)])
}

fn mps() -> World {
    let rig = Rig::new();
    let mps = Model::mps_control_daemon(&rig.device(0)).spawn_with_mps_server(&rig.device(0));
    let live = Model::cuda("mps-client", &rig.device(0)).spawn();
    let (dead, mut children) =
        Model::cuda("mps-client", &rig.device(0)).fork_orphan(1, "mps-worker");
    let gpu = Gpu::idle(0)
        .used(8_874_885_120)
        .process(mps.server, Some(69_206_016))
        .mps_client(live.pid, Some(3_860_856_832))
        .mps_client(dead, Some(4_934_598_656));
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    world(
        rig,
        &[],
        vec![Box::new(mps), Box::new(live), Box::new(children.remove(0))],
    )
}

fn pods() -> World {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let cgroup = Cgroup::create(&format!("kubepods/burstable/pod{POD_UID}/{CONTAINER}"));
    cgroup.add(child.pid);
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let logs = pod_logs(&rig, &[("ml", "sglang-0", POD_UID)]);
    let kubelet = StandInKubelet::start(Behaviour::Answer(vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&Gpu::uuid(0)])])
    ]));
    let args = [
        "--kubelet.pod-resources-path".to_string(),
        kubelet.socket_arg(),
        "--path.pod-logs".to_string(),
        logs.display().to_string(),
    ];
    world(
        rig,
        &args,
        vec![Box::new(child), Box::new(cgroup), Box::new(kubelet)],
    )
}

/// The finding, how many culprits, and how many processes the kill line names.
type Expected = (&'static str, usize, usize);

/// A shape's name, how to make its world, and what both faces must say of it.
type Shape = (&'static str, fn() -> World, Expected);

#[test]
fn every_verdict_shape_is_the_same_whichever_face_is_asked() {
    let shapes: [Shape; 8] = [
        ("orphan", orphan, ("orphaned", 1, 1)),
        ("left behind", left_behind, ("left_behind", 0, 2)),
        (
            "killed and stuck (fixture tree)",
            killed_stuck,
            ("killed_stuck", 0, 0),
        ),
        (
            "being freed (fixture tree)",
            being_freed,
            ("being_freed", 0, 0),
        ),
        ("the dead owner's PID reused", reuse, ("orphaned", 1, 1)),
        ("MIG", mig, ("orphaned", 1, 1)),
        // The MPS daemon and server are bystanders, never in the kill line.
        ("MPS", mps, ("orphaned", 1, 1)),
        ("a culprit in a pod", pods, ("orphaned", 1, 1)),
    ];
    for (shape, make, expected) in shapes {
        let world = make();
        assert_faces_agree(shape, &world, expected);
    }
    // The pod is part of what both faces agree on: named, not only equal.
    let world = pods();
    let culprits = said(
        &world
            .rig
            .run(
                &[
                    &["check", "--json"][..],
                    &world.args.iter().map(String::as_str).collect::<Vec<_>>()[..],
                ]
                .concat(),
            )
            .json()["gpus"][0],
    )
    .culprits;
    assert_eq!(
        culprits[0].1,
        serde_json::json!({"namespace": "ml", "name": "sglang-0"})
    );
}
