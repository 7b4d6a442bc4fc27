//! Without a witness: a killed server's workers that no exporter saw with their server.
//! Real servers' workers rename themselves (SGLang's schedulers call `setproctitle`, vLLM
//! names its engine `VLLM::EngineCore` and forks it), which rewrites their command line
//! and hides the `multiprocessing` clue; what `/proc` still shows is their pipes to the
//! parent, whose other ends no live process outside their group holds. Real processes:
//! a model server starts two workers by spawn and by fork, retitled with `setproctitle`
//! from the Python registry, and is SIGKILLed while nothing watches.

use crate::helpers::*;
use serde_json::Value;

const WORKER_BYTES: u64 = 4 * GIB;

/// GPU 0 with `workers` charged `WORKER_BYTES` each.
fn charged_to(rig: &Rig, workers: &[Holder]) {
    let gpu = workers.iter().fold(
        Gpu::idle(0).used(workers.len() as u64 * WORKER_BYTES + 9 * 1024 * 1024),
        |gpu, worker| gpu.process(worker.pid, Some(WORKER_BYTES)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
}

fn command_line(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ")
}

#[test]
fn a_killed_servers_retitled_workers_are_possibly_left_behind_by_their_pipes() {
    for (start_method, title) in [
        ("spawn", "sglang::scheduler_TP0"),
        ("fork", "VLLM::EngineCore"),
    ] {
        let rig = Rig::new();
        let Server { server, workers } =
            Model::cuda("api-server", &rig.device(0)).spawn_titled_server(2, start_method, title);
        for worker in &workers {
            // The title is all their command line says: no multiprocessing clue left.
            assert!(
                command_line(worker.pid).starts_with(title),
                "{start_method}: {}",
                command_line(worker.pid)
            );
        }
        charged_to(&rig, &workers);
        let server_pid = server.pid;
        server.kill();

        let outcome = rig.run(&["check"]);
        assert_eq!(outcome.status, Some(4), "{start_method}: {outcome:?}");
        let line = verdict_line(&outcome.stdout, 0);
        assert!(
            line.starts_with("GPU 0: 8.0 GiB (8,192 MiB) held by 2 processes possibly left behind by a server that exited:")
                && line.contains(&format!(
                    "a worker whose pipes to the process that started it lead to no live process, as a multiprocessing worker's do once its parent is gone, and the leader of its process group, PID {server_pid} (the process that started it), has exited"
                )),
            "{start_method}: {line}"
        );
        let mut pids: Vec<u32> = workers.iter().map(|worker| worker.pid).collect();
        pids.sort_unstable();
        assert_eq!(
            kill_line(&outcome.stdout, 0),
            Some(format!("{} {}", pids[0], pids[1])),
            "{start_method}: {}",
            outcome.stdout
        );
        let gpu: Value = rig.run(&["check", "--json"]).json()["gpus"][0].clone();
        for worker in gpu["left_behind"].as_array().unwrap() {
            assert_eq!(worker["seen"]["certainty"], "possibly", "{worker:#}");
            assert_eq!(
                worker["seen"]["clue"], "pipes_to_parent_closed",
                "{worker:#}"
            );
            assert_eq!(worker["seen"]["group_leader"], server_pid);
        }
        assert_eq!(gpu["possibly_left_behind_bytes"], 2 * WORKER_BYTES);
        assert_eq!(gpu["left_behind_bytes"], 0);

        // An exporter started now never saw the server: possibly, never paged on.
        let metrics = rig.start(&[]).scrape();
        assert_eq!(
            metrics.value("vram_possibly_left_behind_bytes", &[("gpu", "0")]),
            (2 * WORKER_BYTES) as f64
        );
        assert_eq!(
            metrics.value("vram_left_behind_bytes", &[("gpu", "0")]),
            0.0
        );
    }
}

#[test]
fn a_live_servers_retitled_workers_are_its_own() {
    let rig = Rig::new();
    let Server { server, workers } = Model::cuda("api-server", &rig.device(0)).spawn_titled_server(
        2,
        "fork",
        "VLLM::EngineCore",
    );
    charged_to(&rig, &workers);
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 8.0 GiB (8,192 MiB) owned by 2 live processes; nothing orphaned."
    );
    drop(server);
}

#[test]
fn an_owner_placed_as_a_worker_with_no_clue_is_never_blamed_and_check_says_it_could_not_have_seen()
{
    // A daemon that double-forked holds GPU 0: its group's leader exited at once and this
    // test adopted it, as a killed server's worker would be, but it keeps no pipe to
    // anyone. Never blamed; a look without a witness says what only watching could tell.
    let rig = Rig::new();
    let daemon = Model::cuda("launcher", &rig.device(0)).spawn_daemon("gpu-daemon");
    rig.charge_gpu0(daemon.pid, Some(CHARGED));
    let outcome = rig.run(&["check"]);
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        "GPU 0: 8.6 GiB (8,802 MiB) owned by 1 live process; nothing orphaned."
    );
    assert_eq!(kill_line(&outcome.stdout, 0), None);
    let (leader, _) = process_group_and_session(daemon.pid);
    let note = format!(
        "  note: PID {} (gpu-daemon) lives on after the leader of its process group, PID {leader}, exited, adopted by PID {}, as a killed server's worker would; this look went by no witness state, so it could not have seen a server killed: an exporter serving on this host would have (--path.state).",
        daemon.pid,
        std::process::id()
    );
    assert!(
        outcome.stdout.lines().any(|line| line == note),
        "{}",
        outcome.stdout
    );
    // Beside an exporter that keeps a state, check goes by it, and has no such doubt.
    let exporter = rig.start(&[]);
    exporter.scrape();
    let beside = rig.run(&["check"]);
    assert_eq!(beside.status, Some(0), "{beside:?}");
    assert!(
        !beside.stdout.contains("could not have seen"),
        "{}",
        beside.stdout
    );
}
