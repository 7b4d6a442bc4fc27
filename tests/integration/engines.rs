//! Container engines: Debian's podman serves its API (`podman system service`) on a
//! socket this test owns, and runs a container whose model process holds the device-file
//! stand-ins; the exporter names it (name, image, Compose project) in `check` and on the
//! per-process series. With the engine's socket absent, or a listener that accepts and
//! never answers, scrapes are as quick as ever and the engine reports itself down.
//!
//! The container's root is a directory of this test's own (the host's `/usr`, mounted
//! read-only, brings python3), imported as an image with `podman import`: a container run
//! with `--rootfs` has no image, and Podman says so (`ImageName` empty), so the image
//! would not be tested. No registry is needed. podman runs as `image.rs` runs it, with
//! Debian's runc and the cgroupfs manager. Needs root.

use crate::containers::Cgroup;
use crate::helpers::said;
use crate::helpers::*;
use crate::image::{podman, ulimits};
use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long podman may take to start its service or a container.
const PODMAN_TIMEOUT: Duration = Duration::from_secs(60);
const CONTAINER: &str = "a7bf71c4eb3968e1ee96f65a135da712aebd7f7a68d3fcd9622cec36048bbf31";

/// `podman system service` on a socket in `dir`, stopped when dropped.
struct Service {
    child: Child,
    socket: PathBuf,
}

impl Service {
    fn start(dir: &Path) -> Service {
        let socket = dir.join("podman.sock");
        let child = podman()
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start podman system service");
        wait_until("podman's service makes its socket", PODMAN_TIMEOUT, || {
            socket.exists()
        });
        Service { child, socket }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// An image imported from a root directory of this test's own, removed when dropped.
struct Image(String);

impl Image {
    fn import(dir: &Path) -> Image {
        let root = dir.join("rootfs");
        for folder in ["usr", "proc", "dev", "sys", "etc", "tmp"] {
            fs::create_dir_all(root.join(folder)).unwrap();
        }
        // Debian's merged /usr: the host's, mounted at run time, serves them all.
        for link in ["bin", "lib", "lib64", "sbin"] {
            std::os::unix::fs::symlink(format!("usr/{link}"), root.join(link)).unwrap();
        }
        let tarball = dir.join("rootfs.tar");
        let tar = Command::new(require_tool("tar", "tar"))
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .output()
            .unwrap();
        assert!(tar.status.success(), "{}", said(&tar));
        let name = format!("localhost/vram-exporter-model:{}", std::process::id());
        let imported = podman()
            .args(["import", "--quiet"])
            .arg(&tarball)
            .arg(&name)
            .output()
            .unwrap();
        assert!(imported.status.success(), "{}", said(&imported));
        Image(name)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", "--force", &self.0]).output();
    }
}

/// A container started in the background, removed when dropped.
struct Container {
    name: String,
    id: String,
    pid: u32,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "--force", &self.name]).output();
    }
}

/// Run `model` in a container of `image` named `name`, with the rig's folder mounted
/// where the host has it; returns once its process holds `holding`.
fn run_model(image: &Image, name: &str, rig: &Rig, model: &Model, holding: &Path) -> Container {
    let rig_dir = rig.dir.path().display().to_string();
    let output = podman()
        .args(["run", "--detach", "--name", name])
        .args(ulimits())
        .args(["--label", "com.docker.compose.project=lab"])
        .args(["--volume", "/usr:/usr:ro"])
        .arg("--volume")
        .arg(format!("{rig_dir}:{rig_dir}"))
        .arg(&image.0)
        .args(["/usr/bin/python3", "-c", model_program()])
        .arg(model.spec_json())
        .output()
        .expect("run podman");
    assert!(output.status.success(), "{}", said(&output));
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let mut container = Container {
        name: name.to_string(),
        id,
        pid: 0,
    };
    let inspect = podman()
        .args(["inspect", "--format", "{{.State.Pid}}", name])
        .output()
        .unwrap();
    container.pid = String::from_utf8_lossy(&inspect.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no PID for the container: {}", said(&inspect)));
    let pid = container.pid;
    wait_until(
        "the container's model holds its files",
        PODMAN_TIMEOUT,
        || holds(pid, holding) && proc_state(pid) == Some('S'),
    );
    container
}

#[test]
fn a_podman_containers_holder_and_owner_are_named_with_name_and_image() {
    let rig = Rig::new();
    let service = Service::start(rig.dir.path());
    let image = Image::import(rig.dir.path());
    let name = format!("vram-exporter-trainer-{}", std::process::id());
    // A container's process is already its session's leader.
    let model = Model::cuda("trainer", &rig.device(0))
        .also_mapping(&rig.device(1))
        .in_launchers_session();
    let container = run_model(&image, &name, &rig, &model, &rig.device(0));
    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", container.pid)).unwrap();
    assert!(
        cgroup.contains(&format!("libpod-{}", container.id)),
        "podman did not name the cgroup after the container:\n{cgroup}"
    );
    // GPU 0: charged to an owner that is gone, held by the container; GPU 1: the
    // container's process is its live owner.
    rig.write_scenario(
        &Gpus::new()
            .gpu(
                Gpu::idle(0)
                    .used(USED)
                    .process(nonexistent_pid(), Some(CHARGED)),
            )
            .gpu(
                Gpu::idle(1)
                    .used(USED)
                    .process(container.pid, Some(CHARGED)),
            )
            .into_json(),
    );
    let socket = service.socket.display().to_string();
    let engine = ["--containers.podman-socket", socket.as_str()];
    let short = &container.id[..12];

    let text = rig.run(&[&["check", "--gpu", "0"][..], &engine].concat());
    assert_eq!(text.status, Some(1), "{text:?}");
    let sentence = verdict_line(&text.stdout, 0);
    assert!(
        sentence.contains(&format!(
            "PID {} (trainer, sleeping, started ",
            container.pid
        )) && sentence.contains(&format!(
            ", container {name} ({short}, image {}, compose project lab), holds a context on GPU 0",
            image.0
        )),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|line| columns(line).first() == Some(&container.pid.to_string().as_str()))
        .expect("the holder's row");
    assert_eq!(columns(row).last(), Some(&name.as_str()));
    let document = rig
        .run(&[&["check", "--json"][..], &engine].concat())
        .json();
    let holder = &document["gpus"][0]["culprits"][0];
    assert_eq!(holder["pid"], container.pid);
    assert_eq!(
        holder["container"],
        serde_json::json!({"engine": "podman", "name": name, "image": image.0, "compose_project": "lab"})
    );

    let exporter = rig.start(&[&["--collector.processes"][..], &engine].concat());
    let pid = container.pid.to_string();
    // The server names containers on a thread of its own: the first scrapes may not
    // have the name yet.
    let mut metrics = exporter.scrape();
    let started = Instant::now();
    while metrics
        .find(
            "vram_holder_info",
            &[("pid", &pid), ("container_name", &name)],
        )
        .is_empty()
    {
        assert!(
            started.elapsed() < PODMAN_TIMEOUT,
            "the container was never named:\n{}",
            metrics.text
        );
        std::thread::sleep(Duration::from_millis(50));
        metrics = exporter.scrape();
    }
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &pid),
                ("container_id", &container.id),
                ("container_name", &name),
                ("container_image", &image.0),
            ]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_process_used_bytes",
            &[
                ("gpu", "1"),
                ("pid", &pid),
                ("container_name", &name),
                ("container_image", &image.0),
            ]
        ),
        CHARGED as f64
    );
    assert_eq!(
        metrics.value("vram_container_engine_up", &[("engine", "podman")]),
        1.0
    );
    assert!(
        metrics.value(
            "vram_container_engine_last_success_timestamp_seconds",
            &[("engine", "podman")]
        ) > 0.0
    );
    // No Docker here: its default socket is absent and was not given, so Docker has no
    // series at all (no `_up 0` for an engine this host does not run).
    assert!(
        metrics
            .find("vram_container_engine_up", &[("engine", "docker")])
            .is_empty(),
        "{}",
        metrics.text
    );
    assert!(
        !metrics.text.contains("engine=\"docker\""),
        "{}",
        metrics.text
    );
    assert_per_gpu_series_carry_no_workload_labels(&metrics);
    assert_promtool_clean(&metrics.text);
    drop(exporter);
    drop(container);
    drop(image);
    drop(service);
}

/// A listener that accepts every connection and never answers, until dropped.
struct HungEngine {
    socket: PathBuf,
}

impl HungEngine {
    fn start(dir: &Path) -> HungEngine {
        let socket = dir.join("hung.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            // Keeps every connection open, answering nothing, as long as the test runs.
            for stream in listener.incoming() {
                held.push(stream);
            }
        });
        HungEngine { socket }
    }
}

/// The seconds the exporter says a scrape took, and the scrape's own wall time.
fn timed_scrape(exporter: &Exporter) -> (Metrics, Duration) {
    let started = Instant::now();
    let metrics = exporter.scrape();
    (metrics, started.elapsed())
}

#[test]
fn an_absent_or_hung_engine_delays_no_scrape_and_reports_itself_down() {
    let rig = Rig::new();
    let hung = HungEngine::start(rig.dir.path());
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    // A Podman container's cgroup, as the cgroupfs manager names it: the exporter asks
    // the (hung) Podman socket for its name.
    let cgroup = Cgroup::create(&format!("libpod_parent/libpod-{CONTAINER}"));
    cgroup.add(child.pid);
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let timeout = Duration::from_secs(3);
    let flags = [
        "--containers.podman-socket",
        hung.socket.to_str().unwrap(),
        "--containers.docker-socket",
        rig.dir.path().join("no-docker.sock").to_str().unwrap(),
        "--containers.timeout",
        "3s",
    ]
    .map(str::to_string);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();

    let exporter = rig.start(&flags);
    let started = Instant::now();
    let pid = child.pid.to_string();
    loop {
        let (metrics, took) = timed_scrape(&exporter);
        assert!(
            took < timeout / 2,
            "a scrape took {took:?} with an engine that never answers"
        );
        // Named by its id, as before any engine.
        assert_eq!(
            metrics.value(
                "vram_holder_info",
                &[
                    ("pid", &pid),
                    ("container_id", CONTAINER),
                    ("container_name", ""),
                    ("container_image", "")
                ]
            ),
            1.0
        );
        assert_eq!(
            metrics.value(
                "vram_container_engine_error",
                &[("engine", "docker"), ("error", "absent")]
            ),
            1.0
        );
        assert_eq!(
            metrics.value("vram_container_engine_up", &[("engine", "podman")]),
            0.0
        );
        let timed_out = metrics.value(
            "vram_container_engine_error",
            &[("engine", "podman"), ("error", "timeout")],
        );
        if timed_out == 1.0 {
            assert_eq!(
                metrics.value(
                    "vram_container_engine_last_success_timestamp_seconds",
                    &[("engine", "podman")]
                ),
                0.0
            );
            break;
        }
        assert!(
            started.elapsed() < 4 * timeout,
            "the hung engine was never reported as timing out:\n{}",
            metrics.text
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(exporter);

    // check waits for its lookups within a budget, then names the container by id.
    let checked = Instant::now();
    let text = rig.run(
        &[
            &["check", "--gpu", "0", "--containers.timeout", "500ms"][..],
            &flags[..4],
        ]
        .concat(),
    );
    assert_eq!(text.status, Some(1), "{text:?}");
    assert!(
        checked.elapsed() < Duration::from_secs(10),
        "check took {:?}",
        checked.elapsed()
    );
    assert!(
        verdict_line(&text.stdout, 0).contains(&format!(", container {}, ", &CONTAINER[..12])),
        "{}",
        text.stdout
    );
    drop(cgroup);
}
