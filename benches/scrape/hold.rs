//! One exporter held up for a profiler: the targets' scenario (8 GPUs x 8 live owners,
//! or the same during a fork-orphan episode), its address and PID printed, kept until
//! the time is up. Nothing is measured here: point `perf`, `strace` or `wrk` at it.

use crate::helpers::{exporter_binary, Holder, Rig};
use crate::serve::{scenario, scenario_with_orphan, start_with};
use crate::MAX_GPUS;
use std::time::Duration;

pub(crate) fn hold(rig: &Rig, pids: &[u32], orphan: bool, seconds: u64) {
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let scenario = if orphan {
        scenario_with_orphan(MAX_GPUS, pids, Some(dead_owner))
    } else {
        scenario(MAX_GPUS, pids)
    };
    let exporter = start_with(rig, &exporter_binary(), &scenario);
    println!(
        "holding {} for {seconds} s: http://{}/metrics, PID {}",
        if orphan {
            "8 GPUs x 8 live owners during a fork-orphan episode"
        } else {
            "8 GPUs x 8 live owners"
        },
        exporter.address,
        exporter.child.id()
    );
    std::thread::sleep(Duration::from_secs(seconds));
    drop(exporter);
    drop(child);
}
