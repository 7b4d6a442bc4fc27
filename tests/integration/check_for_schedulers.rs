//! `check` as a scheduler's hook or a monitoring plugin runs it: GPUs named as Slurm and
//! CUDA name them, the verdict in one line of at most 80 bytes, the plugin's exit
//! statuses, `--foreign`, and waits that end as soon as the memory is free (memory being
//! freed included) and within the limits the callers set.

use crate::helpers::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Two GPUs, NVML's 0 and 1, whose device files are `/dev/nvidia1` and `/dev/nvidia0`
/// (minors in another order than NVML's indices, as on some hosts); GPU 1 holds
/// memory whose owner exited while its fork-inherited child `dataloader` keeps it.
fn swapped_minors_with_an_orphan_on_gpu_1(rig: &Rig) -> (u32, Holder) {
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let mut zero = Gpu::idle(0);
    zero.0["minor"] = json!(1);
    let mut one = Gpu::idle(1).used(USED).process(dead_owner, Some(CHARGED));
    one.0["minor"] = json!(0);
    rig.write_scenario(&Gpus::new().gpu(zero).gpu(one).into_json());
    (dead_owner, child)
}

#[test]
fn gpus_are_chosen_as_slurm_and_cuda_name_them() {
    let rig = Rig::new();
    let (_, child) = swapped_minors_with_an_orphan_on_gpu_1(&rig);
    let chosen = |args: &[&str]| -> (Option<i32>, Vec<u64>) {
        let mut words = vec!["check", "--json"];
        words.extend_from_slice(args);
        let outcome = rig.run(&words);
        let document = outcome.json();
        let indices = document["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|gpu| gpu["index"].as_u64().unwrap())
            .collect();
        (outcome.status, indices)
    };
    // $SLURM_JOB_GPUS is a comma list; by NVML's index, GPU 1 is the orphan's.
    assert_eq!(chosen(&["--gpu", "0,1"]), (Some(1), vec![0, 1]));
    assert_eq!(chosen(&["--gpu", "0"]), (Some(0), vec![0]));
    // As Slurm numbers the GPUs of gres.conf (/dev/nvidia0 ...): minor 0 is NVML's 1.
    assert_eq!(
        chosen(&["--gpu", "0", "--gpu.numbering", "minor"]),
        (Some(1), vec![1])
    );
    // CUDA_VISIBLE_DEVICES names GPUs by UUID.
    assert_eq!(chosen(&["--gpu", &Gpu::uuid(1)]), (Some(1), vec![1]));
    assert_eq!(
        chosen(&["--gpu", &format!("{},0", Gpu::uuid(1).to_lowercase())]),
        (Some(1), vec![0, 1])
    );

    let refused = rig.run(&["check", "--gpu", "GPU-00000007-0000-4000-8000-000000000000"]);
    assert_eq!(refused.status, Some(2));
    assert_eq!(
        refused.stderr,
        "vram-exporter: there is no GPU with UUID GPU-00000007-0000-4000-8000-000000000000; this host has 2 (indices 0 to 1)\n"
    );
    let mig = rig.run(&["check", "--gpu", "MIG-4f1c2a51-0000-4000-8000-000000000000"]);
    assert_eq!(mig.status, Some(2));
    assert!(
        mig.stderr.contains(
            "is a MIG instance; --gpu takes whole GPUs: the index or GPU-... UUID of its GPU"
        ),
        "{}",
        mig.stderr
    );
    // An empty $SLURM_JOB_GPUS is a mistake, not every GPU.
    let empty = rig.run(&["check", "--gpu", ""]);
    assert_eq!(empty.status, Some(2), "{empty:?}");
    drop(child);
}

#[test]
fn the_summary_is_one_line_of_at_most_80_bytes_and_the_report_goes_to_stderr() {
    let rig = Rig::new();
    let (_, child) = swapped_minors_with_an_orphan_on_gpu_1(&rig);
    let outcome = rig.run(&["check", "--summary"]);
    assert_eq!(outcome.status, Some(1), "{outcome:?}");
    let line = format!(
        "GPU 1 orphaned: 8.6 GiB, held by PID {pid}; kill {pid}\n",
        pid = child.pid
    );
    assert_eq!(outcome.stdout, line);
    assert!(line.len() <= 81);
    // The person's report, whole, on stderr: tables, verdicts, the exit status.
    assert!(
        outcome.stderr.contains("GPU 1  NVIDIA H200")
            && outcome
                .stderr
                .contains(&format!("still held by PID {} (dataloader, ", child.pid))
            && outcome
                .stderr
                .ends_with("\nexit status 1: orphaned memory found\n"),
        "{}",
        outcome.stderr
    );
    // The plugin's convention: the same line, 1 a problem.
    let plugin = rig.run(&["check", "--summary", "--exit-codes", "plugin"]);
    assert_eq!(
        (plugin.status, plugin.stdout.as_str()),
        (Some(1), line.as_str())
    );
    assert!(plugin
        .stderr
        .ends_with("\nexit status 1: problem: memory orphaned, left behind, stuck in the driver, or (--foreign) in use outside the running jobs\n"));
    let clear = rig.run(&["check", "--summary", "--exit-codes", "plugin", "--gpu", "0"]);
    assert_eq!(
        (clear.status, clear.stdout.as_str()),
        (Some(0), "GPU 0 clear: idle\n")
    );
    drop(child);

    // NVML down: an error in its own convention, unknown in the plugin's; the line says
    // why either way.
    rig.write_scenario(&Gpus::new().init_error("DriverNotLoaded").into_json());
    for (convention, status) in [("detailed", 2), ("plugin", 3)] {
        let down = rig.run(&["check", "--summary", "--exit-codes", convention]);
        assert_eq!(
            (down.status, down.stdout.as_str()),
            (Some(status), "NVML down: NVIDIA driver is not loaded\n"),
            "{down:?}"
        );
    }
    // A command line that does not parse is unknown to a plugin's caller too.
    let mistake = rig.run(&["check", "--exit-codes", "plugin", "--gpu", "first"]);
    assert_eq!(mistake.status, Some(3), "{mistake:?}");
    let mistake = rig.run(&["check", "--gpu", "first"]);
    assert_eq!(mistake.status, Some(2), "{mistake:?}");
}

#[test]
fn foreign_counts_a_live_process_in_no_slurm_job_as_in_use() {
    let rig = Rig::new();
    let owner = Holder::spawn(&rig.device(0));
    rig.charge_gpu0(owner.pid, Some(CHARGED));
    // A live owner is fine to a look of its own...
    let plain = rig.run(&["check", "--summary"]);
    assert_eq!(
        (plain.status, plain.stdout.as_str()),
        (
            Some(0),
            "GPU 0 clear: no memory held without a live owner\n"
        )
    );
    // ...and in use to a prolog's, since this test's process is in no Slurm job.
    let foreign = rig.run(&["check", "--summary", "--foreign"]);
    assert_eq!(foreign.status, Some(5), "{foreign:?}");
    assert_eq!(
        foreign.stdout,
        format!(
            "GPU 0 in use: 8.6 GiB, by PID {} in no running job\n",
            owner.pid
        )
    );
    assert!(foreign.stderr.contains(&format!(
        "GPU 0: PID {} (cuda-job) holds 8.6 GiB and is in no Slurm job: to a job on this GPU it is a process outside the job.\n\nexit status 5: in use",
        owner.pid
    )), "{}", foreign.stderr);
    let plugin = rig.run(&["check", "--foreign", "--exit-codes", "plugin"]);
    assert_eq!(plugin.status, Some(1), "{plugin:?}");
    // One verdict's rule: a problem for its own, OK for another.
    for (only, status) in [("in-use", 1), ("orphaned", 0), ("cannot-tell", 0)] {
        let rule = rig.run(&[
            "check",
            "--foreign",
            "--exit-codes",
            "plugin",
            "--only-verdict",
            only,
        ]);
        assert_eq!(rule.status, Some(status), "{only}: {rule:?}");
    }
}

#[test]
fn a_wait_counts_memory_being_freed_and_returns_as_soon_as_it_is_free() {
    // The owner in its exit path while the driver frees its context: a /proc tree that
    // shows it so, as a GPU shows it for 0.12-0.20 s.
    let rig = Rig::new();
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        ('D', 4_194_560 | 0x4),
        "SigPnd:\t0000000000000100\nShdPnd:\t0000000000000100\n",
        "uvm_va_space_destroy",
    );
    rig.charge_gpu0(4242, Some(CHARGED));
    let procfs = procfs.to_str().unwrap();
    // Without a wait it is not free yet: cannot tell, never clear.
    let once = rig.run(&[
        "check",
        "--summary",
        "--exit-codes",
        "plugin",
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs,
    ]);
    assert_eq!(
        (once.status, once.stdout.as_str()),
        (Some(3), "GPU 0 being freed: 8.6 GiB, PID 4242 exiting\n")
    );
    let check = rig.spawn(&[
        "check",
        "--summary",
        "--test.procfs-stand-in",
        "--path.procfs",
        procfs,
        "--wait",
        "30s",
        "--wait.interval",
        "100ms",
    ]);
    wait_until("the wait is under way", Duration::from_secs(20), || {
        check.stderr().contains("waiting: 8.6 GiB still held (")
    });
    // Still waiting: being freed is not free.
    assert!(check.stdout().is_empty(), "{}", check.stdout());
    let freed = Instant::now();
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    let outcome = check.finish(Duration::from_secs(20));
    assert!(
        freed.elapsed() < Duration::from_secs(3),
        "returned {:?} after the memory was freed",
        freed.elapsed()
    );
    assert_eq!(
        (outcome.status, outcome.stdout.as_str()),
        (Some(0), "GPU 0 clear: idle\n"),
        "{outcome:?}"
    );
    assert!(
        outcome.stderr.contains("held memory freed after "),
        "{}",
        outcome.stderr
    );
}

#[test]
fn a_wait_ends_within_the_wait_and_two_timeouts_whatever_nvml_does() {
    // GPU 0's memory is orphaned, so the wait waits; GPU 1's memory call never returns,
    // so every look runs to its timeout. The look never outlasts the wait's end: the
    // whole command ends within --wait plus twice --timeout.
    let rig = Rig::new();
    let never = rig.dir.path().join("never");
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).process(dead_owner, Some(CHARGED)))
            .gpu(Gpu::idle(1).hang("nvmlDeviceGetMemoryInfo_v2", &never))
            .into_json(),
    );
    let started = Instant::now();
    let outcome = rig.run(&[
        "check",
        "--summary",
        "--exit-codes",
        "plugin",
        "--wait",
        "3s",
        "--timeout",
        "2s",
    ]);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_secs(3 + 2 * 2 + 1),
        "took {took:?}"
    );
    // A look that did not complete says so above the orphan it still names: unknown.
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stdout.starts_with("GPU 1 not answering: stuck ")
            && outcome
                .stdout
                .ends_with(" s in nvmlDeviceGetMemoryInfo_v2 (+1 GPU)\n"),
        "{}",
        outcome.stdout
    );
    std::fs::write(&never, "").unwrap();
    drop(child);
}
