//! vram-exporter's Slurm hooks (deploy/slurm: the Epilog, the Prolog and the
//! HealthCheckProgram) run by a real slurmd on a node whose four GPUs are gres, against
//! the fake NVML and real processes: the test plays the driver, rewriting the scenario
//! as the memory a process held is charged or freed.
//!
//! - a worker that outlives its job fails the epilog, which drains the node with the
//!   verdict as the reason that `sinfo -R` shows; once the worker is killed the health
//!   check resumes the node, whose reason was its own;
//! - a job that ends cleanly, and one whose memory is still being freed when it ends
//!   (the epilog waits for it), leave the node in service;
//! - the prolog refuses a GPU whose memory a process outside the job holds, and Slurm
//!   requeues the job;
//! - with NVML down every hook says it cannot tell, and none drains.

use super::{number_in, Cluster, LeftBehind, Setup, SLURM_TIMEOUT};
use crate::helpers::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Let the job, run as nobody, reach the rig's stand-ins and the model program; returns
/// the model program's path.
fn open_to_the_job(rig: &Rig) -> PathBuf {
    for folder in [rig.dir.path(), rig.devices.as_path()] {
        fs::set_permissions(folder, fs::Permissions::from_mode(0o755)).unwrap();
    }
    for entry in fs::read_dir(&rig.devices).unwrap().flatten() {
        fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o666)).unwrap();
    }
    let model = rig.dir.path().join("model.py");
    fs::write(&model, model_program()).unwrap();
    fs::set_permissions(&model, fs::Permissions::from_mode(0o644)).unwrap();
    model
}

/// A job script: `body`, then wait until the test creates `go` in the output folder.
fn job_script(cluster: &Cluster, name: &str, body: &str) -> PathBuf {
    let out = cluster.dir.path().join("out");
    let script = cluster.dir.path().join(name);
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n{body}\nwhile [ ! -e {go} ]; do sleep 0.1; done\n",
            go = out.join(format!("{name}.go")).display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Let the job of `script` end.
fn let_it_end(cluster: &Cluster, script: &Path) {
    let name = script.file_name().unwrap().to_str().unwrap();
    fs::write(
        cluster.dir.path().join("out").join(format!("{name}.go")),
        "",
    )
    .unwrap();
}

fn wait_for_job(cluster: &Cluster, job: u64, state: &str) {
    wait_until(&format!("job {job} is {state}"), SLURM_TIMEOUT, || {
        cluster.job_field(job, "JobState") == state
    });
}

/// The lines a hook logged.
fn logged<'a>(log: &'a str, hook: &str) -> Vec<&'a str> {
    let tag = format!(" vram-exporter-{hook}: ");
    log.lines().filter(|line| line.contains(&tag)).collect()
}

#[test]
fn a_worker_that_outlives_its_job_drains_the_node_until_it_is_killed() {
    let rig = Rig::new();
    let model = open_to_the_job(&rig);
    let cluster = Cluster::start_with(Setup {
        rig: Some(&rig),
        epilog: true,
        health_check: Some(2),
        settings: &["VRAM_EXPORTER_EPILOG_WAIT=2s"],
        ..Setup::default()
    });
    let out = cluster.dir.path().join("out");
    // The model maps GPU 0, forks a dataloader that inherits the mapping, and exits:
    // the dataloader leaves the step (proctrack/linuxproc follows parentage) and lives
    // on after the job.
    let forking = Model::cuda("cuda-job", &rig.device(0))
        .spec_json()
        .replace("\"hold\"", "\"fork\"")
        .replace(
            "\"child_name\":\"cuda-job\"",
            "\"child_name\":\"dataloader\"",
        );
    let script = job_script(
        &cluster,
        "worker",
        &format!(
            "/usr/bin/python3 {model} '{forking}' > {out}/children &\n\
             echo \"OWNER $!\" > {out}/owner\nwait",
            model = model.display(),
            out = out.display()
        ),
    );
    let job = cluster.submit_with(&script, &["--gres=gpu:1"]);
    let dead_owner = number_in(&out.join("owner"), "OWNER ", &cluster);
    let worker = LeftBehind(number_in(&out.join("children"), "CHILD ", &cluster));
    wait_until("the worker holds GPU 0", SLURM_TIMEOUT, || {
        proc_comm(worker.0).as_deref() == Some("dataloader") && holds(worker.0, &rig.device(0))
    });
    // The driver charges the exited owner; the worker keeps its context.
    rig.write_scenario(
        &Gpus::new()
            .gpu(Gpu::idle(0).used(USED).process(dead_owner, Some(CHARGED)))
            .gpu(Gpu::idle(1))
            .into_json(),
    );
    let_it_end(&cluster, &script);
    // The health check may drain the node first, while the job still runs (its reason
    // then says to cancel the job); the epilog's reason follows once it has ended.
    wait_until("the epilog drains the node", SLURM_TIMEOUT, || {
        logged(&cluster.hooks_log(), "epilog")
            .iter()
            .any(|line| line.contains(" drained node "))
    });
    cluster.wait_for_node("drain", "the epilog drains it");

    // The reason names the GPU and the verdict; `sinfo -R` shows its first 20
    // characters by default, scontrol all of it.
    let (_, reason) = cluster.node_state();
    let verdict = format!(
        "GPU 0 orphaned: 8.6 GiB, held by PID {worker}; kill {worker}",
        worker = worker.0
    );
    assert_eq!(reason, format!("vram: {verdict}"), "{}", cluster.logs());
    let listed = cluster.slurm("sinfo", &["-R", "-h", "-n", &cluster.node]);
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.starts_with("vram: GPU 0 orphaned"), "{listed}");
    // The epilog failed: Slurm saw its exit status.
    let controller = fs::read_to_string(cluster.dir.path().join("slurmctld.log")).unwrap();
    assert!(
        controller.contains(&format!("JobId={job} epilog error on {}", cluster.node)),
        "{controller}"
    );
    // Its log has the verdict, the worker named with its evidence.
    let log = cluster.hooks_log();
    let epilog = logged(&log, "epilog").join("\n");
    assert!(
        epilog.contains(&format!(
            "job {job}: GPUs 0 still hold memory after the job: {verdict}"
        )) && epilog.contains(&format!("still held by PID {} (dataloader, ", worker.0))
            && epilog.contains(&format!(
                "job {job}: drained node {}: vram: {verdict}",
                cluster.node
            )),
        "{log}"
    );

    // The worker killed, the driver frees its memory: the health check resumes the node.
    drop(worker);
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    cluster.wait_for_node("idle", "the health check resumes it");
    let log = cluster.hooks_log();
    assert!(
        logged(&log, "healthcheck").iter().any(|line| line.ends_with(&format!(
            "resumed node {node}, its GPUs clean (GPU 0,1 clear: idle); it was drained for: vram: {verdict}",
            node = cluster.node
        ))),
        "{log}"
    );
}

#[test]
fn a_clean_job_and_one_whose_memory_is_being_freed_leave_the_node_in_service() {
    let rig = Rig::new();
    let model = open_to_the_job(&rig);
    let cluster = Cluster::start_with(Setup {
        rig: Some(&rig),
        epilog: true,
        settings: &["VRAM_EXPORTER_EPILOG_WAIT=30s"],
        ..Setup::default()
    });
    let out = cluster.dir.path().join("out");

    // A job whose process holds GPU 0 until the job ends it.
    let owning = Model::cuda("trainer", &rig.device(0)).spec_json();
    let script = job_script(
        &cluster,
        "clean",
        &format!(
            "/usr/bin/python3 {model} '{owning}' > {out}/trainer &",
            model = model.display(),
            out = out.display()
        ),
    );
    let script_text = fs::read_to_string(&script).unwrap();
    fs::write(&script, format!("{script_text}kill $!\nwait\n")).unwrap();
    let job = cluster.submit_with(&script, &["--gres=gpu:1"]);
    let trainer = number_in(&out.join("trainer"), "READY ", &cluster);
    rig.charge_gpu0(trainer, Some(CHARGED));
    let_it_end(&cluster, &script);
    // Its process gone, the driver frees the memory; the epilog waits for that if it
    // looked first.
    wait_until("the trainer has exited", SLURM_TIMEOUT, || {
        proc_comm(trainer).is_none()
    });
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    wait_for_job(&cluster, job, "COMPLETED");
    cluster.wait_for_node("idle", "the clean job's epilog ends");
    let log = cluster.hooks_log();
    assert!(
        logged(&log, "epilog")
            .iter()
            .any(|line| line.contains(&format!("job {job}: GPUs 0 free: GPU 0 clear: idle"))),
        "{log}"
    );
    assert_eq!(cluster.node_state().1, "none");

    // A job whose owner is still in its exit path when the epilog looks: a /proc tree
    // that shows it so (the moment lasts 0.13-0.18 s on an H200), and the driver still
    // charging it. The epilog waits; the driver frees the memory; the node stays idle.
    let procfs = rig.procfs_with_owner(
        4242,
        &rig.device(0),
        ('D', 4_194_560 | 0x4),
        "SigPnd:\t0000000000000100\nShdPnd:\t0000000000000100\n",
        "uvm_va_space_destroy",
    );
    cluster.settings_with(&[
        "VRAM_EXPORTER_EPILOG_WAIT=30s",
        &format!(
            "VRAM_EXPORTER_CHECK_ARGS=\"$VRAM_EXPORTER_CHECK_ARGS --test.procfs-stand-in --path.procfs {}\"",
            procfs.display()
        ),
    ]);
    rig.charge_gpu0(4242, Some(CHARGED));
    let script = job_script(&cluster, "freeing", "true");
    let job = cluster.submit_with(&script, &["--gres=gpu:1"]);
    let_it_end(&cluster, &script);
    // The epilog's first look, in the report it keeps in its temporary folder.
    wait_until(
        "the epilog sees the memory being freed",
        SLURM_TIMEOUT,
        || {
            fs::read_dir(cluster.dir.path().join("tmp"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|file| {
                    fs::read_to_string(file.path()).is_ok_and(|report| {
                        report.contains(
                            "GPU 0: 8.6 GiB (8,802 MiB) being freed: owner PID 4242 is exiting",
                        )
                    })
                })
        },
    );
    assert_eq!(cluster.node_state().0, "comp", "{}", cluster.logs());
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).gpu(Gpu::idle(1)).into_json());
    wait_for_job(&cluster, job, "COMPLETED");
    cluster.wait_for_node("idle", "the epilog ends once the memory is freed");
    let log = cluster.hooks_log();
    assert!(
        logged(&log, "epilog")
            .iter()
            .any(|line| line.contains(&format!(
                "job {job}: GPUs 0 free: GPU 0 clear: idle (held memory freed after "
            ))),
        "{log}"
    );
    assert_eq!(cluster.node_state().1, "none");
    assert!(!log.contains("drained"), "{log}");
}

#[test]
fn the_prolog_refuses_a_gpu_that_a_process_outside_the_job_holds() {
    let rig = Rig::new();
    open_to_the_job(&rig);
    let cluster = Cluster::start_with(Setup {
        rig: Some(&rig),
        prolog: true,
        ..Setup::default()
    });
    // A process started outside Slurm holds GPU 0, the one Slurm gives the next job.
    let foreign = Model::cuda("notebook", &rig.device(0)).spawn();
    rig.charge_gpu0(foreign.pid, Some(CHARGED));
    let script = job_script(&cluster, "refused", "echo RAN");
    let job = cluster.submit_with(&script, &["--gres=gpu:1"]);
    cluster.wait_for_node("drain", "the prolog drains it");
    wait_until("the job is requeued", SLURM_TIMEOUT, || {
        cluster.job_field(job, "Restarts") == "1"
    });
    assert_eq!(cluster.job_field(job, "JobState"), "PENDING");
    assert_eq!(
        cluster.job_field(job, "Reason"),
        "launch_failed_requeued_held"
    );
    let verdict = format!(
        "GPU 0 in use: 8.6 GiB, by PID {} in no running job",
        foreign.pid
    );
    assert_eq!(cluster.node_state().1, format!("vram: {verdict}"));
    let log = cluster.hooks_log();
    let prolog = logged(&log, "prolog").join("\n");
    assert!(
        prolog.contains(&format!(
            "job {job}: refusing GPUs 0, which hold memory outside the job: {verdict}"
        )) && prolog.contains(&format!(
            "GPU 0: PID {} (notebook) holds 8.6 GiB and is in no Slurm job",
            foreign.pid
        )),
        "{log}"
    );
    // The job never ran (Slurm writes the prolog's failure into its output file).
    let output = cluster
        .dir
        .path()
        .join("out")
        .join(format!("job-{job}.out"));
    let output = fs::read_to_string(output).unwrap_or_default();
    assert!(!output.contains("RAN"), "{output}");
}

#[test]
fn with_nvml_down_every_hook_says_it_cannot_tell_and_none_drains() {
    let rig = Rig::new();
    open_to_the_job(&rig);
    rig.write_scenario(&Gpus::new().init_error("DriverNotLoaded").into_json());
    let cluster = Cluster::start_with(Setup {
        rig: Some(&rig),
        epilog: true,
        prolog: true,
        health_check: Some(2),
        settings: &["VRAM_EXPORTER_EPILOG_WAIT=2s"],
    });
    let script = job_script(&cluster, "blind", "echo RAN");
    let job = cluster.submit_with(&script, &["--gres=gpu:1"]);
    let_it_end(&cluster, &script);
    wait_for_job(&cluster, job, "COMPLETED");
    wait_until("every hook has run", SLURM_TIMEOUT, || {
        let log = cluster.hooks_log();
        ["prolog", "epilog", "healthcheck"]
            .iter()
            .all(|hook| !logged(&log, hook).is_empty())
    });
    cluster.wait_for_node("idle", "the job's epilog ends");
    let log = cluster.hooks_log();
    let why = "NVML down: NVIDIA driver is not loaded (exit status 3)";
    for (hook, said) in [
        (
            "prolog",
            format!("job {job}: cannot tell whether GPUs 0 are free; the job starts: {why}"),
        ),
        (
            "epilog",
            format!("job {job}: cannot tell whether GPUs 0 are free, so the node stays in service: {why}"),
        ),
        (
            "healthcheck",
            format!(
                "node {node}: cannot tell whether the GPUs are free; node {node} is left as it is",
                node = cluster.node
            ),
        ),
    ] {
        assert!(
            logged(&log, hook).iter().any(|line| line.contains(&said)),
            "{said:?} not in:\n{log}"
        );
    }
    assert!(!log.contains("drained"), "{log}");
    assert_eq!(
        cluster.node_state(),
        ("idle".to_string(), "none".to_string())
    );
    // The job ran: a look that cannot tell refuses nothing.
    let output = cluster
        .dir
        .path()
        .join("out")
        .join(format!("job-{job}.out"));
    assert_eq!(fs::read_to_string(output).unwrap(), "RAN\n");
}
