//! `--gpu` narrows the tables, verdicts and exit status; `--wait` returns once the memory
//! is freed, when its time runs out, or at once when nothing is orphaned.

use super::exit_line;
use crate::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn gpu_flag_narrows_the_tables_the_verdicts_and_the_exit_status() {
    let rig = Rig::new();
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::one_owner(0, nonexistent_pid()))
            .gpu(Gpu::idle(1))
            .gpu(Gpu::idle(2))
            .into_json(),
    );

    let healthy = rig.run(&["check", "--gpu", "1"]);
    assert_eq!(healthy.status, Some(0), "GPU 0's orphan is not asked about");
    assert_eq!(
        verdict_line(&healthy.stdout, 1),
        "GPU 1: idle; nothing orphaned."
    );
    for other in ["GPU 0", "GPU 2"] {
        assert!(!healthy.stdout.contains(other), "{}", healthy.stdout);
    }

    let both = rig.run(&["check", "--gpu", "2", "--gpu", "0"]);
    assert_eq!(both.status, Some(1));
    assert!(verdict_line(&both.stdout, 0).contains("held for exited PID"));
    verdict_line(&both.stdout, 2);
    assert!(!both.stdout.contains("GPU 1"), "{}", both.stdout);

    let document = rig.run(&["check", "--json", "--gpu", "1"]).json();
    let indices: Vec<&Value> = document["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gpu| &gpu["index"])
        .collect();
    assert_eq!(indices, [&json!(1)]);
    // The total counts the GPUs shown, not the host.
    assert_eq!(document["orphaned_bytes"], 0);
}

#[test]
fn wait_returns_0_once_the_holder_dies_and_the_driver_frees_the_memory() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let check = rig.spawn(&["check", "--wait", "30s", "--wait.interval", "50ms"]);
    wait_until(
        "check has printed its first verdict and polls",
        Duration::from_secs(20),
        || check.stdout().contains("should free it.") && check.stderr().contains("waiting: "),
    );
    assert!(
        check.stderr().contains("waiting: 8.6 GiB still orphaned ("),
        "{}",
        check.stderr()
    );

    // What happens on a real host: the holder dies, and the driver frees the memory and
    // drops the dead PID from its list.
    child.kill();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());

    let outcome = check.finish(Duration::from_secs(20));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    let freed = outcome
        .stderr
        .lines()
        .find(|line| line.starts_with("orphaned memory freed after "))
        .unwrap_or_else(|| panic!("no freed line:\n{}", outcome.stderr));
    assert!(freed.ends_with('s'), "{freed}");
    // The first look (orphaned) and the last (idle), in that order.
    let first = outcome.stdout.find("should free it.").unwrap();
    let last = outcome
        .stdout
        .rfind("GPU 0: idle; nothing orphaned.")
        .unwrap_or_else(|| panic!("no final verdict:\n{}", outcome.stdout));
    assert!(first < last);
    assert!(
        outcome
            .stdout
            .ends_with(&format!("GPU 0: idle; nothing orphaned.\n{}", exit_line(0))),
        "{}",
        outcome.stdout
    );
}

#[test]
fn wait_returns_1_when_the_time_runs_out_with_the_holder_alive() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let outcome = rig.run(&["check", "--wait", "1s"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let still = outcome
        .stderr
        .lines()
        .find(|line| line.starts_with("8.6 GiB still orphaned after "))
        .unwrap_or_else(|| panic!("no final progress line:\n{}", outcome.stderr));
    let seconds: f64 = still
        .trim_start_matches("8.6 GiB still orphaned after ")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(seconds >= 1.0, "{still}");
    let tail = format!(
        " UTC; then: vram-exporter check --gpu 0 --wait 30s\n{}",
        exit_line(1)
    );
    assert!(outcome.stdout.ends_with(&tail), "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains(&format!(
            "- killing {} should free it.\n  suggested: kill {} ",
            child.pid, child.pid
        )),
        "{}",
        outcome.stdout
    );
}

#[test]
fn wait_returns_at_once_when_nothing_is_orphaned() {
    // "At once" is after the first look: one collection, no sleep between looks. A wait
    // interval of 10 s makes any sleep of one interval overshoot the bound below, and the
    // fake NVML's call log counts the looks (one memory call per look at the one GPU).
    // Measured here: 0.03 to 0.18 s, with the load average at 12 on 2 cores; 5 s leaves
    // room for a slower machine and is still half of one interval.
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let started = std::time::Instant::now();
    let outcome = Outcome::from(
        rig.command()
            .env("FAKE_NVML_CALL_LOG", &calls)
            .args(["check", "--wait", "30s", "--wait.interval", "10s"])
            .output()
            .unwrap(),
    );
    let elapsed = started.elapsed();
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert!(
        elapsed < Duration::from_secs(5),
        "a wait with nothing orphaned took {elapsed:?}"
    );
    let looks = std::fs::read_to_string(&calls)
        .unwrap()
        .lines()
        .filter(|call| *call == "nvmlDeviceGetMemoryInfo_v2")
        .count();
    assert_eq!(looks, 1, "one look at the GPU, then the answer");
    assert_eq!(
        outcome.stderr,
        Rig::no_state_warning(&rig.state_directory()),
        "no progress lines"
    );
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: idle; nothing orphaned."
    );
}
