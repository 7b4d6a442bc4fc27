//! Who is blamed on one GPU: a fork orphan's child (not an unknown NVML client beside
//! it), a stopped culprit, never the exporter itself, a culprit whose main thread exited,
//! and three DataLoader workers at once.

use super::{charged_to, check_json, holder_info_pids};
use crate::helpers::*;
use std::time::Duration;

#[test]
fn a_fork_orphans_child_is_the_culprit_and_an_unknown_agent_only_a_bystander() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    // A monitoring agent under a name no list knows: it opens GPU 0's node, maps nothing.
    let agent = Model::agent("gpu-health", &rig.device(0)).spawn();
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(
        pids_of(&gpu["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(pids_of(&gpu["bystanders"]), [u64::from(agent.pid)]);
    let culprit = &gpu["culprits"][0];
    assert_eq!(culprit["comm"], "dataloader");
    assert_eq!(culprit["state"], "sleeping");
    assert_eq!(culprit["start_time_ticks"], start_time_ticks(child.pid));
    assert_eq!(culprit["mappings"]["gpus"], serde_json::json!([0]));
    let evidence: Vec<&str> = culprit["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|evidence| evidence["kind"].as_str().unwrap())
        .collect();
    // Its parent exited and was reaped: this test process adopted it (a subreaper), so
    // the tie that remains is the dead owner's process group.
    assert_eq!(
        evidence,
        ["maps_gpu", "inherited", "process_group_of", "session_of"]
    );
    assert_eq!(gpu["bystanders"][0]["evidence"][0]["kind"], "no_context");
    assert_eq!(gpu["remedy"]["action"], "kill");
    assert_eq!(pids_of(&gpu["remedy"]["targets"]), [u64::from(child.pid)]);
    assert_eq!(
        gpu["remedy"]["targets"][0]["start_time_ticks"],
        start_time_ticks(child.pid)
    );

    let text = rig.run(&["check"]);
    assert_eq!(text.status, Some(1));
    assert_eq!(kill_line(&text.stdout, 0), Some(child.pid.to_string()));
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!(
            "still held by PID {} (dataloader, sleeping, started ",
            child.pid
        )) && sentence.ends_with(&format!("- killing {} should free it.", child.pid)),
        "{sentence}"
    );
    assert!(
        text.stdout.contains(&format!(
            "Not blamed, holding the device file without a context on GPU 0: PID {} (gpu-health",
            agent.pid
        )),
        "{}",
        text.stdout
    );

    let metrics = rig.start(&[]).scrape();
    assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
    let info = &metrics.find("vram_holder_info", &[("gpu", "0")])[0].1;
    assert_eq!(info["comm"], "dataloader");
    assert_eq!(info["state"], "running");
    assert!(
        info["start_time"].parse::<u64>().unwrap() > 1_700_000_000,
        "{info:?}"
    );
    for (role, count) in [("culprit", 1.0), ("bystander", 1.0), ("undetermined", 0.0)] {
        assert_eq!(
            metrics.value("vram_holder_processes", &[("gpu", "0"), ("role", role)]),
            count,
            "{role}"
        );
    }
}

#[test]
fn a_stopped_culprit_is_reported_as_stopped() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    child.stop();
    charged_to(&rig, dead_owner);

    let metrics = rig.start(&[]).scrape();
    let child_pid = child.pid.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[("gpu", "0"), ("pid", &child_pid), ("state", "stopped")]
        ),
        1.0
    );
    let document = check_json(&rig, 1);
    assert_eq!(document["gpus"][0]["culprits"][0]["state"], "stopped");

    let text = rig.run(&["check"]);
    assert!(
        text.stdout.contains(
            "  note: A stopped holder still dies on SIGKILL; SIGTERM waits until it is continued.\n"
        ),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&child_pid.as_str()))
        .unwrap_or_else(|| panic!("no row for {child_pid}:\n{}", text.stdout));
    assert_eq!(columns(row)[2], "stopped");
}

#[test]
fn the_exporter_never_lists_itself() {
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    charged_to(&rig, dead_owner);

    // A served exporter holding GPU 0's node open, as every NVML client does.
    {
        let mut command = rig.command_holding(&rig.device(0));
        command.args(["--web.listen-address", "127.0.0.1:0"]);
        let exporter = start(command);
        assert!(
            holds(exporter.child.id(), &rig.device(0)),
            "the exporter must hold the device for this test to mean anything"
        );
        let metrics = exporter.scrape();
        assert_eq!(holder_info_pids(&metrics, "0"), [child.pid.to_string()]);
        assert_eq!(
            metrics.value(
                "vram_holder_processes",
                &[("gpu", "0"), ("role", "bystander")]
            ),
            0.0
        );
    }

    // `snapshot` records the raw scan, before any classification.
    let snapshot = Running::spawn(rig.command_holding(&rig.device(0)).arg("snapshot"));
    let outcome = snapshot.finish(Duration::from_secs(30));
    assert_eq!(outcome.status, Some(0), "{outcome:?}");
    assert_eq!(
        pids_of(&outcome.json()["observation"]["holder_scan"]["holders"]),
        [u64::from(child.pid)]
    );
}

#[test]
fn a_culprit_whose_main_thread_exited_is_found_through_its_threads() {
    // The pthread_exit trap: /proc/PID/fd and /proc/PID/maps are empty; the files and
    // the mappings are in a live thread's lists.
    let rig = Rig::new();
    let (dead_owner, child) =
        Model::cuda("cuda-job", &rig.device(0)).fork_orphan_with_zombie_leader("dataloader");
    charged_to(&rig, dead_owner);

    let document = check_json(&rig, 1);
    let gpu = &document["gpus"][0];
    assert_eq!(
        pids_of(&gpu["culprits"]),
        [u64::from(child.pid)],
        "{document:#}"
    );
    assert_eq!(gpu["culprits"][0]["state"], "zombie");
    assert_eq!(gpu["remedy"]["action"], "kill");
}

#[test]
fn three_dataloader_workers_are_all_culprits_and_all_in_the_kill() {
    let rig = Rig::new();
    let (dead_owner, children) =
        Model::cuda("trainer", &rig.device(0)).fork_orphan(3, "pt_data_worker");
    charged_to(&rig, dead_owner);
    let mut expected: Vec<u64> = children.iter().map(|child| u64::from(child.pid)).collect();
    expected.sort_unstable();

    let document = check_json(&rig, 1);
    assert_eq!(pids_of(&document["gpus"][0]["culprits"]), expected);
    let text = rig.run(&["check"]);
    let kill: Vec<u64> = kill_line(&text.stdout, 0)
        .expect("a kill line")
        .split(' ')
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(kill, expected);
    assert!(verdict_line(&text.stdout, 0).ends_with("- killing them should free it."));
}
