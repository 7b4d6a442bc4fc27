//! The container image: `deploy/image/build.sh` builds it with Debian's buildah from
//! scratch (no base image), and Debian's podman runs it the way the DaemonSet does, with
//! NVML where the NVIDIA container toolkit puts it (the fake NVML mounted at
//! `/usr/lib/<triplet>/libnvidia-ml.so.1`, found without `--nvml.library`), a stand-in
//! kubelet's socket directory and the pod log directories mounted read-only.
//!
//! The image is built from the binary cargo built for these tests (the debug build, no
//! extra compile); `build.sh` without `--binary` builds the release binary first. podman
//! runs with Debian's runc (its default crun fails on hybrid cgroup hosts) and explicit
//! rlimits: podman asks for more open files than a host without CAP_SYS_RESOURCE allows.
//! A missing tool fails the test with the line that installs it.

use crate::containers::Cgroup;
use crate::helpers::*;
use crate::helpers::{repository, said};
use crate::kubelet::{Behaviour, Pod, StandInKubelet};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RUNC: &str = "/usr/sbin/runc";
/// The address the test asks build.sh to label the image's source with.
const SOURCE_URL: &str = "https://git.example.org/gpu/vram-exporter";
const POD_UID: &str = "dd1bf9d1-241d-47f5-8e25-12de83135812";
const CONTAINER: &str = "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830";
/// Where the NVIDIA container toolkit mounts the driver's libraries on a Debian-like
/// x86-64 image.
const TOOLKIT_NVML: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// podman with Debian's runc and cgroupfs, as on a host with a hybrid cgroup layout.
pub(crate) fn podman() -> Command {
    let podman = require_tool("podman", "podman");
    assert!(
        Path::new(RUNC).is_file(),
        "{RUNC} is not installed; install it with: apt-get install -y runc"
    );
    let mut command = Command::new(podman);
    command.args(["--runtime", RUNC, "--cgroup-manager=cgroupfs"]);
    command
}

/// `--ulimit` flags no higher than this host's hard limits (podman's defaults are).
pub(crate) fn ulimits() -> Vec<String> {
    let hard = |resource| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        let result = unsafe { libc::getrlimit(resource, &mut limit) };
        assert_eq!(result, 0, "getrlimit");
        limit.rlim_max.min(4096)
    };
    let (files, processes) = (hard(libc::RLIMIT_NOFILE), hard(libc::RLIMIT_NPROC));
    vec![
        "--ulimit".into(),
        format!("nofile={files}:{files}"),
        "--ulimit".into(),
        format!("nproc={processes}:{processes}"),
    ]
}

/// An image built for one test, removed when dropped.
struct Image(String);

impl Image {
    fn build() -> Image {
        require_tool("buildah", "buildah");
        let name = format!("localhost/vram-exporter-test:{}", std::process::id());
        let output = Command::new(repository().join("deploy/image/build.sh"))
            .env("VRAM_EXPORTER_SOURCE_URL", SOURCE_URL)
            .arg("--binary")
            .arg(exporter_binary())
            .args(["--image", &name])
            .output()
            .expect("run deploy/image/build.sh");
        let image = Image(name);
        assert!(
            output.status.success(),
            "build.sh failed: {}",
            said(&output)
        );
        assert_eq!(text(&output.stdout).trim(), image.0);
        image
    }

    /// `podman run --rm` of this image with `options` and the exporter's `args`.
    fn run(&self, options: &[&str], args: &[&str]) -> Output {
        podman()
            .args(["run", "--rm"])
            .args(ulimits())
            .args(options)
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run podman")
    }

    fn inspect(&self) -> Value {
        let output = podman()
            .args(["image", "inspect", &self.0])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", said(&output));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()[0].clone()
    }

    /// Every path in the image, relative to its root.
    fn files(&self) -> Vec<String> {
        let output = podman().args(["image", "mount", &self.0]).output().unwrap();
        assert!(output.status.success(), "{}", said(&output));
        let root = PathBuf::from(text(&output.stdout).trim());
        let mut found = Vec::new();
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                found.push(path.strip_prefix(&root).unwrap().display().to_string());
                if entry.file_type().unwrap().is_dir() {
                    pending.push(path);
                }
            }
        }
        let _ = podman().args(["image", "unmount", &self.0]).output();
        found.sort();
        found
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", "--force", &self.0]).output();
    }
}

/// A container started in the background, removed when dropped.
struct Running(String);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "--force", &self.0]).output();
    }
}

#[test]
fn the_image_builds_from_scratch_and_runs_the_exporter_under_podman() {
    let image = Image::build();

    // What is in it: the exporter, the loader and the libraries it links, the parts of
    // glibc NVML links, a user table, and the directories the toolkit mounts into.
    let files = image.files();
    let expected = [
        "etc",
        "etc/group",
        "etc/ld.so.conf",
        "etc/passwd",
        "lib64",
        "lib64/ld-linux-x86-64.so.2",
        "usr",
        "usr/lib",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu/libc.so.6",
        "usr/lib/x86_64-linux-gnu/libdl.so.2",
        "usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "usr/lib/x86_64-linux-gnu/libm.so.6",
        "usr/lib/x86_64-linux-gnu/libpthread.so.0",
        "usr/lib/x86_64-linux-gnu/librt.so.1",
        "usr/lib64",
        "usr/local",
        "usr/local/bin",
        "usr/local/bin/vram-exporter",
    ];
    assert_eq!(files, expected);
    let config = &image.inspect()["Config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/vram-exporter"])
    );
    assert_eq!(config["User"], "65534:65534", "non-root by default");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "vram-exporter");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(labels["org.opencontainers.image.source"], SOURCE_URL);
    for key in ["revision", "created", "description"] {
        let value = labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_default();
        assert!(!value.is_empty(), "label {key}: {labels:#}");
    }

    let version = image.run(&[], &["--version"]);
    assert!(version.status.success(), "{}", said(&version));
    // The revision the binary carries is the one the image is labelled with.
    assert_eq!(
        text(&version.stdout).trim(),
        format!(
            "vram-exporter {} (revision {})",
            env!("CARGO_PKG_VERSION"),
            labels["org.opencontainers.image.revision"]
                .as_str()
                .unwrap()
        )
    );

    let examples = format!("{}:/examples:ro", repository().join("examples").display());
    let check = image.run(
        &["--volume", &examples],
        &["check", "--replay", "/examples/story-gpu2-orphaned.json"],
    );
    assert_eq!(check.status.code(), Some(1), "{}", said(&check));
    assert!(
        verdict_line(&text(&check.stdout), 2).starts_with("GPU 2: 74.3 GiB (76,104 MiB) held"),
        "{}",
        said(&check)
    );

    // As the DaemonSet runs it: the host's PID namespace and /proc, user 0 with only the
    // holder scan's two capabilities, a read-only root, NVML from the toolkit's place, the
    // kubelet's socket directory and pod log directories mounted read-only.
    let rig = Rig::new();
    let (dead_owner, child) = Holder::fork_orphan(&rig.device(0));
    let cgroup = Cgroup::create(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CONTAINER}.scope",
        POD_UID.replace('-', "_")
    ));
    cgroup.add(child.pid);
    rig.charge_gpu0(dead_owner, Some(CHARGED));
    let logs = rig.dir.path().join("pods");
    std::fs::create_dir_all(logs.join(format!("ml_sglang-0_{POD_UID}/server"))).unwrap();
    let kubelet = StandInKubelet::start(Behaviour::Answer(vec![
        Pod::new("ml", "sglang-0").container("server", &[("nvidia.com/gpu", &[&Gpu::uuid(0)])])
    ]));
    let rig_dir = rig.dir.path().display().to_string();
    let name = format!("vram-exporter-test-{}", std::process::id());
    let mut command = podman();
    command
        .args(["run", "--rm", "--name", &name])
        .args(ulimits())
        .args(["--network", "host", "--pid", "host", "--read-only"])
        .args(["--user", "0", "--cap-drop", "all"])
        .args(["--cap-add", "DAC_READ_SEARCH", "--cap-add", "SYS_PTRACE"])
        .args(["--security-opt", "no-new-privileges"])
        .args(["--volume", "/proc:/host/proc:ro"])
        .arg("--volume")
        .arg(format!(
            "{}:{TOOLKIT_NVML}:ro",
            fake_nvml_library().display()
        ))
        .arg("--volume")
        .arg(format!(
            "{}:/var/lib/kubelet/pod-resources:ro",
            kubelet.dir.path().display()
        ))
        .arg("--volume")
        .arg(format!("{}:/var/log/pods:ro", logs.display()))
        // The scenario and the stand-in device files, at the paths the host sees.
        .arg("--volume")
        .arg(format!("{rig_dir}:{rig_dir}:ro"))
        .arg("--env")
        .arg(format!("FAKE_NVML_SCENARIO={}", rig.scenario.display()))
        .arg(&image.0)
        .args(["--path.procfs", "/host/proc"])
        .args(["--web.listen-address", "127.0.0.1:0"])
        .arg("--test.device-prefix")
        .arg(rig.device_prefix());
    let _container = Running(name);
    let exporter = start(command);
    let metrics = exporter.scrape();
    assert_eq!(
        metrics.value("vram_nvml_up", &[]),
        1.0,
        "NVML was not found at {TOOLKIT_NVML}"
    );
    assert_eq!(metrics.value("vram_host_pid_namespace", &[]), 1.0);
    assert_eq!(
        metrics.value("vram_holder_scan_complete", &[]),
        1.0,
        "the two capabilities did not let the scan read every process"
    );
    for source in ["pod_resources", "pod_logs"] {
        assert_eq!(metrics.value("vram_kubelet_up", &[("source", source)]), 1.0);
    }
    assert_eq!(
        metrics.value(
            "vram_gpu_pod_info",
            &[("gpu", "0"), ("namespace", "ml"), ("pod", "sglang-0")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "vram_holder_info",
            &[
                ("gpu", "0"),
                ("pid", &child.pid.to_string()),
                ("container_id", CONTAINER),
                ("namespace", "ml"),
                ("pod", "sglang-0"),
            ]
        ),
        1.0
    );
    assert_promtool_clean(&metrics.text);
    drop(exporter);
    drop(cgroup);
}
