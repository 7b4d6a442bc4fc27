//! "Being freed" lasts no longer than a free can: an owner killed and left unreaped (its
//! parent does not reap it, so it stays a zombie that NVML goes on charging) is being
//! freed only for as long as the driver takes to free a context; past that, whoever kept
//! its device file keeps the memory, and the memory is orphaned with that process named.
//! Real processes: a model owner forks a child that keeps its files, and is SIGKILLed by
//! this test, its parent, which does not reap it.

use crate::helpers::*;
use std::time::{Duration, Instant};

/// How long the exporter calls an owner whose every thread has exited "being freed"
/// (docs/how-it-decides.md; ten times the slowest free measured on an H100 and an H200).
const ENDING_AT_MOST: Duration = Duration::from_secs(2);

fn orphaned(metrics: &Metrics) -> f64 {
    metrics.value(
        "vram_orphaned_bytes",
        &[("gpu", "0"), ("reason", "owner_gone")],
    )
}

fn exiting(metrics: &Metrics) -> f64 {
    metrics.value(
        "vram_owner_processes",
        &[("gpu", "0"), ("state", "exiting")],
    )
}

#[test]
fn an_unreaped_owner_whose_forked_child_keeps_its_memory_is_orphaned_within_the_bound() {
    let rig = Rig::new();
    let (owner, mut children) =
        Model::cuda("cuda-job", &rig.device(0)).spawn_with_children(1, "dataloader");
    let child = children.remove(0);
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let exporter = rig.start(&[]);
    assert_eq!(
        exporter.scrape().value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "running")]
        ),
        1.0
    );

    // SIGKILLed; its parent (this test) does not reap it, and its child keeps the context.
    let zombie = owner.kill_leaving_unreaped();
    let killed = Instant::now();
    let first = exporter.scrape();
    assert_eq!(exiting(&first), 1.0, "{}", first.text);
    assert_eq!(orphaned(&first), 0.0);

    // check beside it looks again until the bound has passed, then names the child.
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let line = verdict_line(&outcome.stdout, 0);
    assert!(
        line.starts_with(&format!(
            "GPU 0: 8.6 GiB (8,802 MiB) held for exited PID {}; still held by PID {} (dataloader, sleeping, ",
            zombie.pid(),
            child.pid
        )),
        "{line}"
    );
    assert_eq!(
        kill_line(&outcome.stdout, 0),
        Some(child.pid.to_string()),
        "{}",
        outcome.stdout
    );

    // The served exporter: being freed until the bound, orphaned with the culprit after.
    let mut metrics = first;
    wait_until(
        "the served exporter calls the memory orphaned",
        Duration::from_secs(20),
        || {
            metrics = exporter.scrape();
            orphaned(&metrics) == CHARGED as f64
        },
    );
    assert!(
        killed.elapsed() > ENDING_AT_MOST,
        "orphaned after {:?}, before a free could have ended",
        killed.elapsed()
    );
    assert_eq!(exiting(&metrics), 0.0);
    assert_eq!(
        metrics.value("vram_owner_processes", &[("gpu", "0"), ("state", "gone")]),
        1.0
    );
    let culprits = metrics.find("vram_holder_info", &[("gpu", "0")]);
    assert_eq!(culprits.len(), 1, "{}", metrics.text);
    assert_eq!(culprits[0].1["pid"], child.pid.to_string());
    drop(zombie);
}

#[test]
fn an_unreaped_owner_whose_memory_the_driver_frees_in_time_is_never_orphaned() {
    // Without a child, the driver frees the memory at the exit: an H100 showed NVML's
    // list empty by 0.3 s while the zombie waited for its parent. The fake NVML charges
    // it until told otherwise, as the driver would for a moment.
    let rig = Rig::new();
    let owner = Model::cuda("cuda-job", &rig.device(0)).spawn();
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    let exporter = rig.start(&[]);
    let zombie = owner.kill_leaving_unreaped();
    let during = exporter.scrape();
    assert_eq!(exiting(&during), 1.0, "{}", during.text);
    assert_eq!(orphaned(&during), 0.0);
    // The driver has freed it: NVML charges nobody, the zombie still waits to be reaped.
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    let after = exporter.scrape();
    assert_eq!(orphaned(&after), 0.0);
    assert_eq!(exiting(&after), 0.0);
    assert_eq!(proc_state(zombie.pid()), Some('Z'));
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: idle; nothing orphaned."
    );
}
