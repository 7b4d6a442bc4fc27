//! One exporter held up for a profiler: the targets' scenario (8 GPUs x 8 live owners,
//! or the same during a fork-orphan episode; or `gpus` GPUs with the first `owners`
//! owners), its address and PID printed, kept until the time is up. Nothing is measured
//! here: point `perf`, `strace` or `wrk` at it.

use crate::helpers::{exporter_binary, Holder, Rig};
use crate::serve::{scenario, scenario_with_orphan, start_with};
use std::time::Duration;

pub(crate) fn hold(rig: &Rig, gpus: u32, pids: &[u32], orphan: bool, seconds: u64) {
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let scenario = if orphan {
        scenario_with_orphan(gpus, pids, Some(dead_owner))
    } else {
        scenario(gpus, pids)
    };
    let exporter = start_with(rig, &exporter_binary(), &scenario);
    println!(
        "holding {gpus} GPUs and {} live owners{} for {seconds} s: http://{}/metrics, PID {}",
        pids.len(),
        if orphan {
            " during a fork-orphan episode"
        } else {
            ""
        },
        exporter.address,
        exporter.child.id()
    );
    std::thread::sleep(Duration::from_secs(seconds));
    drop(exporter);
    drop(child);
}
