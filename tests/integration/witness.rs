//! The witness state: what the served exporter saw that no later look can see again (here,
//! a server alive, then gone), kept in a file that `check` beside it and the exporter after
//! a restart go by, so that every face gives the verdict of the one that watched. A state
//! that cannot be gone by (missing, of another boot, corrupt, unwritable, or one that
//! others could have forged) is one warning, then the verdict of a look without one.
//! Real processes: a model server starts two `multiprocessing` workers and is SIGKILLed.

use crate::helpers::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const WORKER_BYTES: u64 = 4 * GIB;

/// A server's two workers charged on GPU 0, an exporter that saw the server alive, and
/// then the server killed: returns once the exporter calls the workers left behind.
fn left_behind_episode(rig: &Rig) -> (Exporter, Vec<Holder>, u32) {
    let server = Model::cuda("api-server", &rig.device(0)).spawn_server(2, "engine-core");
    let gpu = server.workers.iter().fold(
        Gpu::idle(0).used(2 * WORKER_BYTES + 9 * 1024 * 1024),
        |gpu, worker| gpu.process(worker.pid, Some(WORKER_BYTES)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let exporter = rig.start(&[]);
    assert_eq!(left_behind(&exporter.scrape()), 0.0);
    let Server {
        server: parent,
        workers,
    } = server;
    let parent_pid = parent.pid;
    parent.kill();
    wait_until(
        "the exporter sees the workers left behind",
        Duration::from_secs(10),
        || left_behind(&exporter.scrape()) == (2 * WORKER_BYTES) as f64,
    );
    (exporter, workers, parent_pid)
}

fn left_behind(metrics: &Metrics) -> f64 {
    metrics.value("vram_left_behind_bytes", &[("gpu", "0")])
}

/// When the exporter saw the server exit, per worker, from its series.
fn exits_seen(metrics: &Metrics) -> Vec<(String, f64)> {
    let mut seen: Vec<(String, f64)> = metrics
        .find("vram_left_behind_since_timestamp_seconds", &[("gpu", "0")])
        .into_iter()
        .map(|(_, labels, seen)| (labels["pid"].clone(), *seen))
        .collect();
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    seen
}

/// What `check` says of GPU 0 in `state`: its exit status, verdict and suggestion.
fn verdict(rig: &Rig, state: &Path) -> (Option<i32>, String, Option<String>, String) {
    let outcome = rig.run_with_state(state, &["check"]);
    (
        outcome.status,
        verdict_line(&outcome.stdout, 0).to_string(),
        suggestion(&outcome.stdout, 0).map(str::to_string),
        outcome.stderr,
    )
}

#[test]
fn a_restart_in_the_middle_of_a_left_behind_episode_keeps_the_verdict_in_both_faces() {
    let rig = Rig::new();
    let (exporter, workers, parent) = left_behind_episode(&rig);
    let before = exporter.scrape();
    let seen_before = exits_seen(&before);
    assert_eq!(seen_before.len(), 2, "{}", before.text);
    let state = rig.state_directory();
    let (status, line, kill, warnings) = verdict(&rig, &state);
    assert_eq!(status, Some(4));
    assert!(
        line.contains("left behind by a server that exited")
            && !line.contains("possibly")
            && line.contains(&format!("a worker of PID {parent} (api-server, ")),
        "{line}"
    );
    assert_eq!(warnings, "");

    // An upgrade, a crash, a node agent's rollout: the exporter goes and comes back.
    drop(exporter);
    let restarted = rig.start(&[]);
    assert!(
        restarted
            .log()
            .contains("read the witness state that an earlier exporter kept"),
        "{}",
        restarted.log()
    );
    let after = restarted.scrape();
    assert_eq!(left_behind(&after), (2 * WORKER_BYTES) as f64);
    assert_eq!(
        after.value("vram_possibly_left_behind_bytes", &[("gpu", "0")]),
        0.0
    );
    // The same exit, seen when it was, not when the new exporter started.
    assert_eq!(exits_seen(&after), seen_before);
    // And check beside the restarted exporter says what it said before.
    let again = verdict(&rig, &state);
    assert_eq!(again.0, status);
    assert_eq!(again.2, kill);
    assert!(again.2.is_some_and(|kill| kill.starts_with(&format!(
        "kill {} {}",
        workers[0].pid.min(workers[1].pid),
        workers[0].pid.max(workers[1].pid)
    ))));
    // The sentence differs only in how long the workers have been alone.
    let without_age = |line: &str| line.split("; alone for ").next().unwrap().to_string();
    assert_eq!(without_age(&again.1), without_age(&line));
}

#[test]
fn a_state_that_cannot_be_gone_by_is_one_warning_then_the_verdict_of_no_state() {
    let rig = Rig::new();
    let (exporter, _workers, _) = left_behind_episode(&rig);
    let kept = fs::read_to_string(rig.state_directory().join("witness.json")).unwrap();
    // What a look that never saw the server says: the reference.
    let missing = rig.dir.path().join("missing");
    let (status, line, kill, warning) = verdict(&rig, &missing);
    assert_eq!(status, Some(4));
    assert!(line.contains("possibly left behind"), "{line}");
    assert_eq!(warning, Rig::no_state_warning(&missing));

    let state_with = |name: &str, contents: &str| {
        let directory = rig.dir.path().join(name);
        fs::create_dir(&directory).unwrap();
        fs::write(directory.join("witness.json"), contents).unwrap();
        directory
    };
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let other_boot = state_with(
        "other-boot",
        &kept.replace(boot.trim(), "0f1e2d3c-4b5a-4968-8776-655443322110"),
    );
    let corrupt = state_with("corrupt", &kept[..kept.len() / 2]);
    for (directory, says) in [
        (&other_boot, "was written before this boot: ignored"),
        (&corrupt, "is corrupt ("),
    ] {
        let (got_status, got_line, got_kill, warning) = verdict(&rig, directory);
        assert!(
            warning.starts_with(&format!(
                "vram-exporter: warning: the witness state at {} ",
                directory.join("witness.json").display()
            )) && warning.contains(says)
                && warning.lines().count() == 1,
            "{warning}"
        );
        assert_eq!(
            (got_status, got_line, got_kill),
            (status, line.clone(), kill.clone())
        );
    }

    // An exporter that cannot write its state (its folder is under a plain file) says so
    // at start and serves on; check beside it, and it after a restart, have no state.
    drop(exporter);
    let blocker = rig.dir.path().join("plain-file");
    fs::write(&blocker, "").unwrap();
    let unwritable = blocker.join("state");
    let server = rig.start_with_state(&unwritable, &[]);
    assert!(
        server.log().contains("cannot write the witness state"),
        "{}",
        server.log()
    );
    let metrics = server.scrape();
    assert_eq!(left_behind(&metrics), 0.0);
    assert_eq!(
        metrics.value("vram_possibly_left_behind_bytes", &[("gpu", "0")]),
        (2 * WORKER_BYTES) as f64
    );
    let (got_status, got_line, got_kill, warning) = verdict(&rig, &unwritable);
    assert!(
        warning.starts_with(&format!(
            "vram-exporter: warning: cannot read the witness state at {} (",
            unwritable.join("witness.json").display()
        )),
        "{warning}"
    );
    assert_eq!((got_status, got_line, got_kill), (status, line, kill));
}

#[test]
fn a_state_others_could_have_forged_puts_no_kill_line_in_front_of_root() {
    assert_eq!(
        effective_uid(),
        0,
        "handing a state file to another user (chown) needs the tests to run as root"
    );
    // A live server and its workers, watched: the state holds each worker's parent, alive.
    let rig = Rig::new();
    let Server { server, workers } =
        Model::cuda("api-server", &rig.device(0)).spawn_server(2, "engine-core");
    let gpu = workers.iter().fold(
        Gpu::idle(0).used(2 * WORKER_BYTES + 9 * 1024 * 1024),
        |gpu, worker| gpu.process(worker.pid, Some(WORKER_BYTES)),
    );
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let exporter = rig.start(&[]);
    exporter.scrape();
    drop(exporter);
    // A forged state says each worker was started by another process, one that exited.
    let mut state: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(rig.state_directory().join("witness.json")).unwrap(),
    )
    .unwrap();
    let dead = nonexistent_pid();
    for process in state["witnessed"]["processes"].as_array_mut().unwrap() {
        process["lineage"]["parent"]["pid"] = serde_json::json!(dead);
        process["lineage"]["parent_exit_seen_unix_seconds"] = serde_json::json!(1_796_300_000);
    }
    let forge = |name: &str, owner: u32, mode: u32| {
        let directory = rig.dir.path().join(name);
        fs::create_dir(&directory).unwrap();
        let file = directory.join("witness.json");
        fs::write(&file, state.to_string()).unwrap();
        std::os::unix::fs::chown(&file, Some(owner), None).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        directory
    };
    // Were it trusted, it would name the live server's workers and suggest killing them.
    let trusted = rig.run_with_state(&forge("roots", 0, 0o644), &["check"]);
    assert_eq!(trusted.status, Some(4), "{trusted:?}");
    assert!(
        kill_line(&trusted.stdout, 0).is_some(),
        "{}",
        trusted.stdout
    );
    for (directory, why) in [
        (
            forge("nobodys", 65534, 0o644),
            "the file belongs to uid 65534, neither root nor the exporter's user",
        ),
        (
            forge("writable", 0, 0o666),
            "the file is writable by others (mode 666)",
        ),
    ] {
        let outcome = rig.run_with_state(&directory, &["check", "--json"]);
        assert_eq!(outcome.status, Some(0), "{outcome:?}");
        let document = outcome.json();
        assert_eq!(document["witness"]["no_state"]["reason"], "untrusted");
        assert_eq!(document["witness"]["no_state"]["why"], why);
        assert!(
            outcome.stderr.contains("is not trusted"),
            "{}",
            outcome.stderr
        );
        let gpu = &document["gpus"][0];
        assert_eq!(gpu["finding"], "owned", "{gpu:#}");
        assert_eq!(gpu["remedy"]["action"], "none");
        assert_eq!(gpu["left_behind"], serde_json::json!([]));
    }
    drop(server);
}
