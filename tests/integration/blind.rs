//! A blind exporter never pages: a `--path.procfs` that is no procfs at all is refused at
//! start, and a procfs of another PID namespace (where NVML's PIDs name other processes,
//! if any) makes every owner unknown: nothing orphaned, no reset offered, the reason said
//! in one line. `alerts/tests/orphaned.yml` shows that no orphan alert fires on such a
//! node, and that the blind alert does.

use crate::helpers::*;
use std::time::Duration;

#[test]
fn a_procfs_path_that_is_missing_or_not_a_procfs_is_refused_at_start() {
    let rig = Rig::new();
    let missing = rig.dir.path().join("no-such-proc");
    // A directory of an ordinary file system, as /host/proc is when nothing is mounted
    // there.
    let plain = rig.dir.path().join("empty");
    std::fs::create_dir(&plain).unwrap();
    let textfile = rig.dir.path().join("vram.prom");
    let modes: [&[&str]; 4] = [
        &["--web.listen-address", "127.0.0.1:0"],
        &["check"],
        &["snapshot"],
        &["textfile", "-o", textfile.to_str().unwrap()],
    ];
    for mode in modes {
        for (path, why) in [
            (&missing, "No such file or directory"),
            (&plain, "is not a procfs"),
        ] {
            let outcome = rig
                .spawn(&[mode, &["--path.procfs", path.to_str().unwrap()]].concat())
                .finish(Duration::from_secs(20));
            assert_eq!(outcome.status, Some(2), "{mode:?} {path:?}: {outcome:?}");
            let line = format!("vram-exporter: --path.procfs {}", path.display());
            assert!(
                outcome.stderr.starts_with(&line)
                    && outcome.stderr.contains(why)
                    && outcome
                        .stderr
                        .ends_with("(mounted at /host/proc in a container)\n")
                    && outcome.stderr.lines().count() == 1,
                "{mode:?}: {}",
                outcome.stderr
            );
            assert!(outcome.stdout.is_empty(), "{outcome:?}");
        }
    }
    assert!(!textfile.exists());
}

#[test]
fn a_procfs_of_another_pid_namespace_judges_no_owner_and_orphans_nothing() {
    let rig = Rig::new();
    let procfs = OtherNamespaceProcfs::mount(&rig.dir.path().join("other-proc"));
    // A live owner of GPU 0, and a PID NVML charges that no longer exists: read through
    // the host's procfs, the second would be orphaned.
    let owner = Model::cuda("cuda-job", &rig.device(0)).spawn();
    let dead = nonexistent_pid();
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(2 * CHARGED + 9 * 1024 * 1024)
                    .process(owner.pid, Some(CHARGED))
                    .process(dead, Some(CHARGED)),
            )
            .into_json(),
    );
    let path = procfs.path.to_str().unwrap();

    let exporter = rig.start(&["--path.procfs", path]);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value(
            "vram_owner_processes",
            &[("gpu", "0"), ("state", "unknown")]
        ),
        2.0
    );
    for reason in ["owner_gone", "unattributed"] {
        assert_eq!(
            metrics.value("vram_orphaned_bytes", &[("gpu", "0"), ("reason", reason)]),
            0.0
        );
    }
    assert_eq!(metrics.value("vram_procfs_own_pid_namespace", &[]), 0.0);
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 0.0);
    assert!(metrics.find("vram_holder_info", &[]).is_empty());
    assert!(
        exporter.log().contains("shows another PID namespace"),
        "{}",
        exporter.log()
    );

    let outcome = rig.run(&["check", "--path.procfs", path]);
    assert_eq!(outcome.status, Some(3), "{outcome:?}");
    assert!(
        outcome.stdout.starts_with("warning: the procfs read (--path.procfs) shows another PID namespace, in which this process is not: the owners NVML names cannot be looked up there, so none is judged and nothing is called orphaned.\n\n"),
        "{}",
        outcome.stdout
    );
    let mut pids = [owner.pid, dead];
    pids.sort_unstable();
    assert_eq!(
        verdict_line(&outcome.stdout, 0),
        format!(
            "GPU 0: cannot tell: owners {}, {} cannot be judged; nothing is called orphaned.",
            pids[0], pids[1]
        )
    );
    assert_eq!(suggestion(&outcome.stdout, 0), None, "{}", outcome.stdout);
    assert!(!outcome.stdout.contains("reset"), "{}", outcome.stdout);
    let document = rig.run(&["check", "--json", "--path.procfs", path]).json();
    assert_eq!(document["procfs_view"], "unknown");
    assert_eq!(document["orphaned_bytes"], 0);
    assert_eq!(document["gpus"][0]["finding"], "cannot_tell");
    assert_eq!(document["gpus"][0]["remedy"]["action"], "none");
}
