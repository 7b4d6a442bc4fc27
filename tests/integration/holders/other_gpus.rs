//! Other GPUs' jobs and files: a job of GPU 0 holding GPU 1's node, a live owner of
//! GPU 0 with a context on GPU 1, live owners of other GPUs, holders of another GPU's node
//! or of the control node; and a job and an orphan spread over two GPUs.

use super::{charged_to, check_json, holder_info_pids};
use crate::helpers::*;

#[test]
fn a_live_job_of_gpu_0_holding_gpu_1s_node_is_not_gpu_1s_culprit() {
    // The CUDA runtime opens every visible GPU's node: a job on GPU 0 holds /dev/nvidia1
    // too, but maps only /dev/nvidia0. GPU 1 has a fork-inherited orphan.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_opening(&rig.device(1))
        .spawn();
    let (dead_owner, child) = Model::cuda("cuda-job", &rig.device(1)).fork_orphan(1, "dataloader");
    let child = &child[0];
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(Gpu::one_owner(1, dead_owner))
            .into_json(),
    );

    let document = check_json(&rig, 1);
    let (gpu0, gpu1) = (&document["gpus"][0], &document["gpus"][1]);
    assert_eq!(
        pids_of(&gpu1["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(pids_of(&gpu1["bystanders"]), [u64::from(job.pid)]);
    assert_eq!(
        gpu1["bystanders"][0]["evidence"][0],
        serde_json::json!({"kind": "owner_of_other_gpus", "gpus": [0]})
    );
    // GPU 0 has nothing orphaned: nothing is blamed there, not even the child.
    assert_eq!(gpu0["finding"], "owned");
    assert_eq!(pids_of(&gpu0["culprits"]), Vec::<u64>::new());
    assert_eq!(pids_of(&gpu0["bystanders"]), Vec::<u64>::new());

    let text = rig.run(&["check"]);
    assert_eq!(kill_line(&text.stdout, 1), Some(child.pid.to_string()));
    assert_eq!(kill_line(&text.stdout, 0), None);

    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "1"), [child.pid.to_string()]);
    assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    assert_eq!(
        metrics.value(
            "vram_holder_processes",
            &[("gpu", "0"), ("role", "bystander")]
        ),
        0.0
    );
}

#[test]
fn a_live_owner_of_gpu_0_with_a_context_on_gpu_1_stays_gpu_1s_culprit_scrape_after_scrape() {
    // The scan takes an owner's reading of the same scrape as it is only when it can
    // blame the owner for nothing: this one maps GPU 1's node too, where NVML charges a
    // dead process, so every scan reads it afresh and names it.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .spawn();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(Gpu::one_owner(1, nonexistent_pid()))
            .into_json(),
    );
    let exporter = rig.start(&[]);
    for scrape in 0..3 {
        let metrics = exporter.scrape();
        assert_eq!(
            holder_info_pids(&metrics, "1"),
            [job.pid.to_string()],
            "scrape {scrape}:\n{}",
            metrics.text
        );
        assert_eq!(
            metrics.value(
                "vram_owner_processes",
                &[("gpu", "0"), ("state", "running")]
            ),
            1.0
        );
        assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    }
}

#[test]
fn live_owners_of_other_gpus_are_never_counted_among_a_gpus_culprits() {
    // Scrape after scrape the scan takes the live owners' readings of the same scrape:
    // they must keep to their own GPUs.
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let jobs: Vec<Holder> = (1..4).map(|gpu| Holder::spawn(&rig.device(gpu))).collect();
    let mut gpus = Gpus::new().gpu(Gpu::one_owner(0, dead_owner));
    for (index, job) in jobs.iter().enumerate() {
        gpus = gpus.gpu(
            Gpu::idle(index as u32 + 1)
                .used(USED)
                .process(job.pid, Some(CHARGED)),
        );
    }
    rig.write_scenario(&gpus.into_json());
    let exporter = rig.start(&[]);
    for scrape in 0..3 {
        let metrics = exporter.scrape();
        let context = || format!("scrape {scrape}:\n{}", metrics.text);
        assert_eq!(
            metrics.value(
                "vram_holder_processes",
                &[("gpu", "0"), ("role", "culprit")]
            ),
            1.0,
            "{}",
            context()
        );
        assert_eq!(
            holder_info_pids(&metrics, "0"),
            [child.pid.to_string()],
            "{}",
            context()
        );
        for gpu in ["1", "2", "3"] {
            assert_eq!(
                metrics.value(
                    "vram_owner_processes",
                    &[("gpu", gpu), ("state", "running")]
                ),
                1.0
            );
        }
    }
}

#[test]
fn holders_of_another_gpus_node_or_the_control_node_are_not_named_for_this_gpu() {
    let rig = Rig::new();
    let control_only = Model::agent("ctl-only", &rig.control_device()).spawn();
    let other_gpu = Holder::spawn(&rig.device(1));
    // GPU 0 is orphaned, so the scan runs; nothing holds GPU 0's own node.
    charged_to(&rig, nonexistent_pid());

    let document = check_json(&rig, 1);
    for gpu in document["gpus"].as_array().unwrap() {
        for role in ["culprits", "bystanders", "undetermined"] {
            assert_eq!(
                pids_of(&gpu[role]),
                Vec::<u64>::new(),
                "{role}: {document:#}"
            );
        }
    }
    assert_eq!(document["gpus"][0]["remedy"]["action"], "reset_gpu");
    // GPU 1 has nothing orphaned, so its live process is named nowhere.
    assert_eq!(document["gpus"][1]["finding"], "idle");
    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "0"), Vec::<String>::new());
    assert_eq!(holder_info_pids(&metrics, "1"), Vec::<String>::new());
    drop((control_only, other_gpu));
}

// Two GPUs of one host: a job and an orphan spread over both, on the fake NVML (the real
// two-GPU run waits for a two-GPU machine).

#[test]
fn a_fork_orphan_of_a_job_on_both_gpus_has_the_same_one_culprit_on_both() {
    // A job with tensors on GPU 0 and GPU 1 forks a DataLoader worker and is killed: the
    // worker inherits both contexts, and NVML charges the dead job on both GPUs.
    let rig = Rig::new();
    let (dead_owner, children) = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .fork_orphan(1, "dataloader");
    let child = &children[0];
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::one_owner(1, dead_owner))
            .into_json(),
    );
    let document = check_json(&rig, 1);
    for gpu in 0..2 {
        let verdict = &document["gpus"][gpu];
        assert_eq!(
            pids_of(&verdict["culprits"]),
            [u64::from(child.pid)],
            "GPU {gpu}: {document:#}"
        );
        assert_eq!(pids_of(&verdict["bystanders"]), Vec::<u64>::new());
    }
    let text = rig.run(&["check"]);
    for gpu in 0..2 {
        assert_eq!(kill_line(&text.stdout, gpu), Some(child.pid.to_string()));
    }
    let metrics = rig.start(&[]).scrape();
    for gpu in ["0", "1"] {
        assert_eq!(holder_info_pids(&metrics, gpu), [child.pid.to_string()]);
        assert_eq!(
            metrics.value(
                "vram_orphaned_bytes",
                &[("gpu", gpu), ("reason", "owner_gone")]
            ),
            CHARGED as f64
        );
    }
}

#[test]
fn a_live_job_with_contexts_on_both_gpus_is_owned_on_both_and_blamed_nowhere() {
    // Peer-to-peer copies: one process with a context on each GPU, which NVML lists on
    // both; a second process's job on GPU 1 beside it.
    let rig = Rig::new();
    let job = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .spawn();
    let peer = Model::cuda("peer", &rig.device(1)).spawn();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, job.pid))
            .gpu(
                Gpu::idle(1)
                    .used(USED + CHARGED)
                    .process(job.pid, Some(CHARGED))
                    .process(peer.pid, Some(CHARGED)),
            )
            .into_json(),
    );
    let document = check_json(&rig, 0);
    for gpu in 0..2 {
        assert_eq!(document["gpus"][gpu]["finding"], "owned", "{document:#}");
        assert_eq!(
            pids_of(&document["gpus"][gpu]["culprits"]),
            Vec::<u64>::new()
        );
    }
    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "1"), ("state", "running")]
        ),
        2.0
    );
    for gpu in ["0", "1"] {
        assert_eq!(
            metrics.value(
                "vram_orphaned_bytes",
                &[("gpu", gpu), ("reason", "owner_gone")]
            ),
            0.0
        );
    }
}
