//! A dead owner's PID handed out again, to an NVML client or to a CUDA job of another
//! GPU: the orphan is still reported, and nothing learnt of the first process is served
//! for the second.

use super::{charged_to, check_json, holder_info_pids};
use crate::helpers::*;

#[test]
fn the_dead_owners_pid_reused_by_an_nvml_client_still_reports_the_orphan() {
    // The H200 case: the exporter called the owner live because its PID existed and held
    // /dev/nvidia0, reported nothing orphaned, and `check` exited 0.
    let rig = Rig::new();
    let (dead_owner, mut children) = Model::cuda("cuda-job", &rig.device(0))
        .in_launchers_session()
        .fork_orphan(1, "dataloader");
    let child = children.remove(0);
    let reuser = Model::agent("gpu-health", &rig.device(0)).spawn_at(dead_owner);
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    let owner = &gpu["owners"][0];
    assert_eq!(owner["pid"], dead_owner, "{document:#}");
    assert_eq!(owner["state"], "gone");
    assert_eq!(owner["detail"]["reason"], "reused");
    assert_eq!(owner["detail"]["by"]["comm"], "gpu-health");
    assert_eq!(
        owner["detail"]["by"]["start_time_ticks"],
        start_time_ticks(reuser.pid)
    );
    assert_eq!(gpu["orphaned_owner_gone_bytes"], CHARGED);
    assert_eq!(pids_of(&gpu["culprits"]), [u64::from(child.pid)]);
    // The reuser holds GPU 0's node open: a bystander, never in the kill line.
    assert_eq!(pids_of(&gpu["bystanders"]), [u64::from(reuser.pid)]);

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    assert_eq!(kill_line(&text.stdout, 0), Some(child.pid.to_string()));
    assert!(
        text.stdout.contains(&format!(
            "note: PID {dead_owner} is gone: the PID now names PID {dead_owner} (gpu-health, sleeping"
        )),
        "{}",
        text.stdout
    );

    let metrics = rig.start(&[]).scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "reused")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
}

#[test]
fn reuse_by_a_cuda_job_of_another_gpu_while_the_exporter_watches() {
    // The exporter sees the owner alive first, then its fork orphan, then its PID taken by
    // a CUDA job of GPU 1: nothing it learnt of the first process may be served for the
    // second, and the PID's charge on GPU 0 stays orphaned.
    let rig = Rig::new();
    let owner = Model::cuda("trainer", &rig.device(0))
        .in_launchers_session()
        .spawn_forking_later(1, "dataloader");
    let pid = owner.owner.pid;
    charged_to(&rig, pid);
    let exporter = rig.start(&[]);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        1.0
    );

    let (dead_owner, children) = owner.orphan_now();
    assert_eq!(dead_owner, pid);
    let child = &children[0];
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "exited")]
        ),
        1.0
    );
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);

    let reuser = Model::cuda("other-job", &rig.device(1)).spawn_at(pid);
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, pid))
            .gpu(Gpu::one_owner(1, pid))
            .into_json(),
    );
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_gone_owner_processes",
            &[("gpu", "0"), ("reason", "reused")]
        ),
        1.0,
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "0"), ("reason", "owner_gone")]
        ),
        CHARGED as f64
    );
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
    // On GPU 1 the same PID is the new job's, alive.
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "1"), ("state", "running")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_orphaned_bytes",
            &[("gpu", "1"), ("reason", "owner_gone")]
        ),
        0.0
    );
    drop(reuser);
}
