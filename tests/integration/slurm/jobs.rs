//! A real one-node cluster runs a batch job as `nobody` whose model process opens and
//! maps the device-file stand-ins, forks a `dataloader` and exits, leaving the fork
//! orphan; the script then runs a live owner as step 0. The exporter names the job, step
//! and user of both from their real cgroups, suggests `scancel` while the job runs, and
//! after `scancel` (proctrack/linuxproc loses the orphan, as it does on real clusters)
//! says the job has ended and suggests the kill.

use super::{number_in, Cluster, LeftBehind, SLURM_TIMEOUT};
use crate::helpers::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;

fn culprit(document: &Value, gpu: usize, pid: u32) -> &Value {
    document["gpus"][gpu]["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|holder| holder["pid"] == pid)
        .unwrap_or_else(|| panic!("PID {pid} is not a culprit: {document:#}"))
}

#[test]
fn a_slurm_jobs_fork_orphan_and_live_owner_are_named_with_the_job() {
    let cluster = Cluster::start();
    let rig = Rig::new();
    // The job runs as nobody: it must reach the stand-ins and the model program.
    for folder in [rig.dir.path(), rig.devices.as_path()] {
        fs::set_permissions(folder, fs::Permissions::from_mode(0o755)).unwrap();
    }
    for entry in fs::read_dir(&rig.devices).unwrap().flatten() {
        fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o666)).unwrap();
    }
    let model = rig.dir.path().join("model.py");
    fs::write(&model, model_program()).unwrap();
    fs::set_permissions(&model, fs::Permissions::from_mode(0o644)).unwrap();
    let out = cluster.dir.path().join("out");
    let orphaning = Model::cuda("cuda-job", &rig.device(0))
        .spec_json()
        .replace("\"hold\"", "\"fork\"");
    let orphaning = orphaning.replace(
        "\"child_name\":\"cuda-job\"",
        "\"child_name\":\"dataloader\"",
    );
    // srun makes each task lead its own session already.
    let owning = Model::cuda("trainer", &rig.device(1))
        .in_launchers_session()
        .spec_json();
    let python = "/usr/bin/python3";
    let script = cluster.dir.path().join("job.sh");
    // The batch step's model forks the orphan and exits; step 0 is a live owner that
    // keeps the job running.
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             {python} {model} '{orphaning}' > {out}/children &\n\
             echo \"OWNER $!\" > {out}/owner\n\
             wait\n\
             exec srun --output={out}/step0 {python} {model} '{owning}'\n",
            model = model.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();

    let job = cluster.submit(&script);
    let dead_owner = number_in(&out.join("owner"), "OWNER ", &cluster);
    let orphan = LeftBehind(number_in(&out.join("children"), "CHILD ", &cluster));
    let live_owner = number_in(&out.join("step0"), "READY ", &cluster);
    wait_until(
        "the orphan and the live owner hold their files",
        SLURM_TIMEOUT,
        || {
            proc_comm(orphan.0).as_deref() == Some("dataloader")
                && holds(orphan.0, &rig.device(0))
                && holds(live_owner, &rig.device(1))
                && Cluster::slurmstepds_of(job).len() >= 2
        },
    );
    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", orphan.0)).unwrap();
    assert!(
        cgroup.contains(&format!("/job_{job}/step_batch")),
        "the orphan is not in the batch step's cgroup:\n{cgroup}"
    );
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).process(dead_owner, Some(CHARGED)))
            .gpu(Gpu::idle(1).used(USED).process(live_owner, Some(CHARGED)))
            .into_json(),
    );
    let job_text = job.to_string();

    // While the job runs: its batch step holds GPU 0, so cancelling the job frees it.
    let text = rig.run(&["check", "--gpu", "0"]);
    assert_eq!(text.status, Some(1), "{text:?}");
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!("PID {} (dataloader, sleeping, started ", orphan.0))
            && sentence.contains(", user nobody, parent ")
            && sentence.contains(&format!(
                ", Slurm job {job} step batch of user nobody, running, holds a context on GPU 0"
            ))
            && sentence.ends_with(&format!(" - cancelling Slurm job {job} should free it.")),
        "{}",
        text.stdout
    );
    let suggestion = text
        .stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("suggested: "))
        .expect("a suggestion");
    assert!(
        suggestion.starts_with(&format!(
            "scancel {job}   # job {job} of user nobody still runs the step that holds it: {} is dataloader, started ",
            orphan.0
        )),
        "{suggestion}"
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&orphan.0.to_string().as_str()))
        .expect("the culprit's row");
    assert_eq!(columns(row).last(), Some(&format!("{job}.batch").as_str()));
    let document = rig.run(&["check", "--json"]).json();
    assert_eq!(
        culprit(&document, 0, orphan.0)["slurm_job"],
        serde_json::json!({"job_id": job, "step": "batch", "user": "nobody", "state": "running"})
    );
    assert_eq!(document["gpus"][0]["remedy"]["action"], "cancel_jobs");
    let owner = &document["gpus"][1]["owners"][0];
    assert_eq!(owner["pid"], live_owner);
    assert_eq!(owner["process"]["slurm_job"]["step"], "0", "{owner:#}");

    let exporter = rig.start(&["--collector.processes"]);
    let metrics = exporter.scrape();
    let pid = orphan.0.to_string();
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("slurm_job_id", &job_text),
                ("slurm_step", "batch"),
                ("slurm_user", "nobody"),
            ]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[
                ("gpu", "1"),
                ("pid", &live_owner.to_string()),
                ("slurm_job_id", &job_text),
                ("slurm_step", "0"),
                ("slurm_user", "nobody"),
            ]
        ),
        CHARGED as f64
    );
    assert_per_gpu_series_carry_no_workload_labels(&metrics);
    assert_promtool_clean(&metrics.text);
    drop(exporter);

    // scancel ends the job; linuxproc does not know the orphan, which survives it.
    let cancelled = cluster.slurm("scancel", &[&job_text]);
    assert!(
        cancelled.status.success(),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    wait_until("the job's slurmstepds are gone", SLURM_TIMEOUT, || {
        Cluster::slurmstepds_of(job).is_empty()
    });
    assert_eq!(proc_comm(orphan.0).as_deref(), Some("dataloader"));
    let text = rig.run(&["check", "--gpu", "0"]);
    assert_eq!(text.status, Some(1), "{text:?}");
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!(
            ", Slurm job {job} step batch of user nobody, a job that has ended, holds"
        )) && sentence.ends_with(&format!(" - killing {} should free it.", orphan.0)),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!(
            "note: PID {} is of Slurm job {job} (step batch), which has ended: the process survived its job",
            orphan.0
        )),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!(
            "suggested: kill {}   # {} is dataloader",
            orphan.0, orphan.0
        )),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&orphan.0.to_string().as_str()))
        .expect("the culprit's row");
    assert_eq!(
        columns(row).last(),
        Some(&format!("{job}.batch (ended)").as_str())
    );
    drop(orphan);
    drop(cluster);
}
