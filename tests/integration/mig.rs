//! MIG: each MIG device is read through its own handle and published with dcgm-exporter's
//! instance labels beside the parent GPU's totals; a MIG GPU whose process lists need
//! privileges we lack stays up and reports no orphan.

use crate::helpers::*;
use std::path::{Path, PathBuf};

/// GPU 0's device node minor, and the capability minors of its three GPU instances
/// (GPU instance id, compute instance id, minor of the GI node, minor of the CI node).
const INSTANCES: [(u32, u32, u32, u32); 3] = [(1, 0, 12, 13), (2, 0, 21, 22), (3, 0, 30, 31)];

/// Bytes each busy instance has in use, and what NVML charges its process.
const INSTANCE_USED: u64 = 4_305_453_056;
const INSTANCE_CHARGED: u64 = 4_296_212_480;

/// A MIG GPU with three instances, one of each kind a verdict tells apart, with real
/// processes:
/// - GPU instance 1: a live owner holding the GPU's node and the instance's capabilities;
/// - GPU instance 2: the fork orphan: NVML charges a dead owner, whose forked child
///   holds the files;
/// - GPU instance 3: empty.
///
/// The processes are kept alive by the returned value; the verdict per instance (owner,
/// orphan with its culprit, empty) can be asserted against the same rig.
pub(crate) struct ThreeInstances {
    pub rig: Rig,
    pub mig_minors: PathBuf,
    pub owner: Holder,
    pub dead_owner: u32,
    pub culprit: Holder,
}

impl ThreeInstances {
    pub(crate) fn new() -> ThreeInstances {
        let rig = Rig::new();
        let mig_minors = rig.mig_minors(&INSTANCES.map(|(gi, ci, gim, cim)| (0, gi, ci, gim, cim)));
        let files = |(_, _, gi_minor, ci_minor): (u32, u32, u32, u32)| {
            [
                rig.device(0),
                rig.capability(gi_minor),
                rig.capability(ci_minor),
            ]
        };
        let owned = files(INSTANCES[0]);
        let owner = Holder::holding(&owned.iter().map(PathBuf::as_path).collect::<Vec<_>>());
        let orphaned = files(INSTANCES[1]);
        let (dead_owner, culprit) =
            Holder::fork_orphan_holding(&orphaned.iter().map(PathBuf::as_path).collect::<Vec<_>>());
        let instances = vec![
            MigDevice::new(0, 1)
                .used(INSTANCE_USED)
                .process(owner.pid, Some(INSTANCE_CHARGED)),
            MigDevice::new(0, 2)
                .used(INSTANCE_USED)
                .process(dead_owner, Some(INSTANCE_CHARGED)),
            MigDevice::new(0, 3),
        ];
        rig.write_scenario(
            &Gpus::new()
                .gpu(Gpu::idle(0).used(2 * INSTANCE_USED).mig(instances))
                .into_json(),
        );
        ThreeInstances {
            rig,
            mig_minors,
            owner,
            dead_owner,
            culprit,
        }
    }

    /// The exporter with the fixture's capability table.
    pub(crate) fn start(&self) -> Exporter {
        self.rig
            .start(&["--test.mig-minors", path(&self.mig_minors)])
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// The labels of GPU 0's MIG device in GPU instance `gi`.
fn instance(gi: &str) -> [(&'static str, &str); 4] {
    [
        ("gpu", "0"),
        ("GPU_I_ID", gi),
        ("GPU_CI_ID", "0"),
        ("GPU_I_PROFILE", "1g.18gb"),
    ]
}

#[test]
fn three_mig_instances_have_their_own_figures_beside_the_gpu_totals() {
    let world = ThreeInstances::new();
    let exporter = world.start();
    let metrics = exporter.scrape();
    assert_promtool_clean(&metrics.text);
    let gpu0 = [("gpu", "0")];

    assert_eq!(metrics.value("vram_gpu_mig_mode", &gpu0), 1.0);
    assert_eq!(metrics.value("vram_gpu_mig_mode_pending", &gpu0), 1.0);
    // The parent keeps its totals and its verdict over the aggregate lists.
    assert_eq!(metrics.value("vram_gpu_up", &gpu0), 1.0);
    assert_eq!(
        metrics.value("vram_used_bytes", &gpu0),
        (2 * INSTANCE_USED) as f64
    );
    assert_eq!(
        metrics.value("vram_owned_bytes", &[("gpu", "0"), ("state", "running")]),
        INSTANCE_CHARGED as f64
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        INSTANCE_CHARGED as f64
    );
    assert_eq!(metrics.value("vram_gpu_process_list_denied", &gpu0), 0.0);

    for (gi, used, processes) in [
        ("1", INSTANCE_USED, 1.0),
        ("2", INSTANCE_USED, 1.0),
        ("3", 0, 0.0),
    ] {
        let labels = instance(gi);
        assert_eq!(metrics.value("vram_mig_up", &labels), 1.0, "GI {gi}");
        assert_eq!(
            metrics.value("vram_mig_total_bytes", &labels),
            MIG_1G_TOTAL as f64
        );
        assert_eq!(metrics.value("vram_mig_used_bytes", &labels), used as f64);
        assert_eq!(
            metrics.value("vram_mig_free_bytes", &labels),
            (MIG_1G_TOTAL - used) as f64
        );
        assert_eq!(metrics.value("vram_mig_processes", &labels), processes);
        assert_eq!(metrics.value("vram_mig_process_list_denied", &labels), 0.0);
        let gi_number: u32 = gi.parse().unwrap();
        let info = metrics.find("vram_mig_info", &labels);
        assert_eq!(info.len(), 1, "{}", metrics.text);
        assert_eq!(info[0].1["mig_uuid"], MigDevice::uuid(0, gi_number));
        assert_eq!(info[0].1["name"], "NVIDIA H200 MIG 1g.18gb");
        assert_eq!(info[0].1["uuid"], Gpu::uuid(0));
    }
    // Instances are not GPUs: the per-GPU families keep one series per GPU.
    assert_eq!(metrics.find("vram_used_bytes", &[]).len(), 1);
    drop(exporter);
    drop(world);
}

#[test]
fn snapshots_carry_each_instance_with_its_capability_minors() {
    let world = ThreeInstances::new();
    let outcome = world
        .rig
        .run(&["--test.mig-minors", path(&world.mig_minors), "snapshot"]);
    assert_eq!(outcome.status, Some(0), "{}", outcome.stderr);
    let snapshot = outcome.json();
    let gpu = &snapshot["observation"]["nvml"]["gpus"][0];
    assert_eq!(gpu["mig"]["enabled"], true);
    let devices = gpu["mig"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3);
    for (device, (gi, ci, gi_minor, ci_minor)) in devices.iter().zip(INSTANCES) {
        assert_eq!(device["gpu_instance_id"], gi);
        assert_eq!(device["compute_instance_id"], ci);
        assert_eq!(device["profile"], "1g.18gb");
        assert_eq!(device["uuid"], MigDevice::uuid(0, gi));
        assert_eq!(device["capabilities"]["gpu_instance"], gi_minor);
        assert_eq!(device["capabilities"]["compute_instance"], ci_minor);
    }
    assert_eq!(devices[1]["state"]["processes"][0]["pid"], world.dead_owner);
    // Every process listed in an instance is looked up in /proc: the live owner is
    // there, the dead one is missing.
    let owners = &snapshot["observation"]["owners"];
    assert_eq!(
        owners[world.owner.pid.to_string()]["now"]["status"],
        "present"
    );
    assert_eq!(
        owners[world.dead_owner.to_string()]["now"]["status"],
        "missing"
    );
    // The culprit holds the instance's capability nodes, which the scan sees.
    let holders = snapshot["observation"]["holder_scan"]["holders"]
        .as_array()
        .unwrap();
    assert!(
        holders
            .iter()
            .any(|holder| holder["pid"] == world.culprit.pid
                && holder["descriptors"]["capabilities"] == serde_json::json!([21, 22])),
        "{holders:?}"
    );
}

#[test]
fn a_mig_gpu_whose_lists_are_refused_stays_up_and_reports_no_orphan() {
    let rig = Rig::new();
    // A caller without privileges: the aggregate lists and every instance's are refused,
    // while memory answers, and one instance has memory in use beside its empty list.
    let mut parent = Gpu::idle(0).used(INSTANCE_USED);
    let mut busy = MigDevice::new(0, 1).used(INSTANCE_USED);
    let mut idle = MigDevice::new(0, 2);
    for call in PROCESS_LIST_CALLS {
        parent = parent.error(call, "NoPermission");
        busy = busy.error(call, "NoPermission");
        idle = idle.error(call, "NoPermission");
    }
    rig.write_scenario(&Gpus::new().gpu(parent.mig(vec![busy, idle])).into_json());
    let exporter = rig.start(&[]);
    let metrics = exporter.scrape();
    assert_promtool_clean(&metrics.text);
    let gpu0 = [("gpu", "0")];

    assert_eq!(metrics.value("vram_gpu_up", &gpu0), 1.0);
    assert_eq!(
        metrics.value("vram_used_bytes", &gpu0),
        INSTANCE_USED as f64
    );
    assert_eq!(metrics.value("vram_gpu_process_list_denied", &gpu0), 1.0);
    for reason in ["owner_gone", "unattributed"] {
        assert_eq!(
            metrics.value("vram_orphaned_bytes", &[("gpu", "0"), ("reason", reason)]),
            0.0,
            "{reason}"
        );
    }
    // The memory is reported, not hidden: it is unattributed, just not called orphaned.
    assert!(metrics.value("vram_unattributed_bytes", &gpu0) > 0.0);
    let busy = instance("1");
    assert_eq!(metrics.value("vram_mig_up", &busy), 1.0);
    assert_eq!(
        metrics.value("vram_mig_used_bytes", &busy),
        INSTANCE_USED as f64
    );
    assert_eq!(metrics.value("vram_mig_process_list_denied", &busy), 1.0);
    assert_eq!(metrics.value("vram_mig_processes", &busy), 0.0);

    // `check` does not call it orphaned, nor fine: it cannot tell, and says why.
    let check = rig.run(&["check"]);
    assert_eq!(check.status, Some(3), "{}{}", check.stdout, check.stderr);
    let sentence = verdict_line(&check.stdout, 0);
    assert!(sentence.starts_with("GPU 0: cannot tell: "), "{sentence}");
    assert!(
        check
            .stdout
            .contains("note: NVML refused this GPU's process list"),
        "{}",
        check.stdout
    );
    let busy_line = check
        .stdout
        .lines()
        .find(|line| line.starts_with("GPU 0 MIG (GI 1, CI 0, 1g.18gb): "))
        .unwrap_or_else(|| panic!("no verdict for GI 1:\n{}", check.stdout));
    assert!(busy_line.contains(": cannot tell: "), "{busy_line}");
}

#[test]
fn each_mig_instance_has_its_own_verdict_and_culprit() {
    // GI 1: a live owner; GI 2: the fork orphan, whose child holds GI 2's capability
    // nodes and maps the GPU; GI 3: empty. The child is GI 2's culprit and no other's.
    let world = ThreeInstances::new();
    let minors = path(&world.mig_minors);
    let outcome = world
        .rig
        .run(&["check", "--json", "--test.mig-minors", minors]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let document = outcome.json();
    let instances = document["gpus"][0]["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3, "{document:#}");
    let by_gi = |gi: u64| {
        instances
            .iter()
            .find(|instance| instance["gpu_instance_id"] == gi)
            .unwrap_or_else(|| panic!("no GI {gi}: {document:#}"))
    };
    let (owned, orphaned, empty) = (by_gi(1), by_gi(2), by_gi(3));
    assert_eq!(owned["finding"], "owned");
    assert_eq!(owned["owners"][0]["pid"], world.owner.pid);
    assert_eq!(owned["owners"][0]["state"], "running");
    assert_eq!(orphaned["finding"], "orphaned");
    assert_eq!(orphaned["orphaned_bytes"], INSTANCE_CHARGED);
    assert_eq!(orphaned["owners"][0]["state"], "gone");
    let culprits: Vec<u64> = orphaned["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|culprit| culprit["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(culprits, [u64::from(world.culprit.pid)]);
    assert_eq!(orphaned["remedy"]["action"], "kill");
    // GI 1's live owner holds GI 1's capabilities, not GI 2's: not even a bystander there.
    assert_eq!(orphaned["bystanders"], serde_json::json!([]));
    assert_eq!(empty["finding"], "idle");
    assert_eq!(empty["culprits"], serde_json::json!([]));

    let text = world.rig.run(&["check", "--test.mig-minors", minors]);
    let line = text
        .stdout
        .lines()
        .find(|line| line.starts_with("GPU 0 MIG (GI 2, CI 0, 1g.18gb): "))
        .unwrap_or_else(|| panic!("no verdict for GI 2:\n{}", text.stdout));
    assert!(
        line.contains(&format!(
            "still held by PID {} (dataloader",
            world.culprit.pid
        )) && line.ends_with(&format!("- killing {} should free it.", world.culprit.pid)),
        "{line}"
    );

    let metrics = world.start().scrape();
    assert_eq!(
        metrics.value(
            "vram_mig_orphaned_bytes",
            &[&instance("2")[..], &[("reason", "owner_gone")]].concat()
        ),
        INSTANCE_CHARGED as f64
    );
    assert_eq!(
        metrics.value(
            "vram_mig_orphaned_bytes",
            &[&instance("1")[..], &[("reason", "owner_gone")]].concat()
        ),
        0.0
    );
    assert_eq!(
        metrics.value(
            "vram_mig_holder_processes",
            &[&instance("2")[..], &[("role", "culprit")]].concat()
        ),
        1.0
    );
    assert_promtool_clean(&metrics.text);
}

#[test]
fn without_the_capability_table_a_mig_culprit_is_not_guessed() {
    // Which instance a process's context is in comes from the driver's capability table;
    // without it the child is undetermined on GI 2, and nothing is suggested there.
    let world = ThreeInstances::new();
    let missing = world.rig.dir.path().join("no-mig-minors");
    let outcome = world
        .rig
        .run(&["check", "--json", "--test.mig-minors", path(&missing)]);
    let document = outcome.json();
    let orphaned = document["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|instance| instance["gpu_instance_id"] == 2)
        .unwrap();
    assert_eq!(orphaned["culprits"], serde_json::json!([]), "{orphaned:#}");
    assert_eq!(orphaned["undetermined"][0]["pid"], world.culprit.pid);
    assert_eq!(orphaned["remedy"]["action"], "cannot_tell");
}

#[test]
fn instances_that_answer_make_up_for_a_refused_aggregate() {
    let rig = Rig::new();
    // Only the parent's aggregate lists need root; the instances name their processes,
    // among them an owner that is gone.
    let gone = nonexistent_pid();
    let mut parent = Gpu::idle(0).used(INSTANCE_USED);
    for call in PROCESS_LIST_CALLS {
        parent = parent.error(call, "NoPermission");
    }
    let instances = vec![
        MigDevice::new(0, 1)
            .used(INSTANCE_USED)
            .process(gone, Some(INSTANCE_CHARGED)),
        MigDevice::new(0, 2),
    ];
    rig.write_scenario(&Gpus::new().gpu(parent.mig(instances)).into_json());
    let metrics = rig.start(&[]).scrape();
    let gpu0 = [("gpu", "0")];
    assert_eq!(metrics.value("vram_gpu_process_list_denied", &gpu0), 0.0);
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "0"), ("state", "gone")]),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        INSTANCE_CHARGED as f64
    );
}

#[test]
fn a_refused_instance_handle_is_a_down_instance_not_a_down_gpu() {
    let rig = Rig::new();
    let instances = vec![
        MigDevice::new(0, 1).error("nvmlDeviceGetMemoryInfo_v2", "NoPermission"),
        MigDevice::new(0, 2).used(INSTANCE_USED),
    ];
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(INSTANCE_USED).mig(instances))
            .gpu(Gpu::idle(1).mig_disabled())
            .into_json(),
    );
    let metrics = rig.start(&[]).scrape();
    assert_promtool_clean(&metrics.text);
    assert_eq!(metrics.value("vram_gpu_up", &[("gpu", "0")]), 1.0);
    assert_eq!(metrics.value("vram_mig_up", &instance("1")), 0.0);
    assert!(metrics
        .find("vram_mig_used_bytes", &instance("1"))
        .is_empty());
    assert_eq!(
        metrics.value("vram_mig_used_bytes", &instance("2")),
        INSTANCE_USED as f64
    );
    // A GPU with MIG disabled says so, and has no instances.
    assert_eq!(metrics.value("vram_gpu_mig_mode", &[("gpu", "1")]), 0.0);
    assert!(metrics.find("vram_mig_info", &[("gpu", "1")]).is_empty());
}
