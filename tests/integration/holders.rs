//! Culprits and bystanders: the live process that keeps a dead owner's memory alive
//! (it maps the GPU's device file: a context, own or inherited), told from the processes
//! that merely hold the file (NVML clients, other GPUs' jobs). Each test builds its
//! scenario from real processes and reads the answer back through `check`, `check
//! --json` and the metrics.
//!
//! This module holds what the tests share; they are in `culprits.rs` (who is blamed on
//! one GPU), `other_gpus.rs` (jobs and holders of other GPUs, and jobs on two GPUs),
//! `pid_reuse.rs` (a dead owner's PID handed out again) and `unseen.rs` (what the scan
//! cannot read: denied permissions, unreadable mappings, another PID namespace).

mod culprits;
mod other_gpus;
mod pid_reuse;
mod unseen;

use crate::helpers::*;
use serde_json::Value;

/// GPU 0 with memory NVML still charges to `dead_owner`, as after a fork-inherited
/// orphan, and an idle GPU 1.
fn charged_to(rig: &Rig, dead_owner: u32) {
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, dead_owner))
            .gpu(Gpu::idle(1))
            .into_json(),
    );
}

/// `check --json` (which always scans for holders), expecting `status`.
fn check_json(rig: &Rig, status: i32) -> Value {
    let outcome = rig.run(&["check", "--json"]);
    assert_eq!(outcome.status, Some(status), "{outcome:?}");
    outcome.json()
}

fn holder_info_pids(metrics: &Metrics, gpu: &str) -> Vec<String> {
    metrics
        .find("vram_holder_info", &[("gpu", gpu)])
        .iter()
        .map(|(_, labels, _)| labels["pid"].clone())
        .collect()
}
