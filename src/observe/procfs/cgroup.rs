//! Container attribution from `/proc/PID/cgroup`: the container and the Kubernetes pod a
//! process runs in, read from the cgroup names that container runtimes create.
//!
//! The file has one line per hierarchy, `ID:CONTROLLERS:PATH`: a single `0::PATH` on a
//! cgroup v2 host, one line per controller on a v1 host, both on a hybrid one. The path
//! is where the runtime put the container, and every runtime names it after the
//! container's 64-hex-digit id:
//!
//! | runtime, cgroup driver | the container's cgroup |
//! | --- | --- |
//! | Docker, systemd | `/system.slice/docker-<id>.scope` |
//! | Docker, cgroupfs | `/docker/<id>` |
//! | containerd (Kubernetes), systemd | `.../kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` |
//! | containerd (Kubernetes), systemd, older | `.../kubepods-burstable-pod<uid>.slice:cri-containerd:<id>` |
//! | containerd or Docker (Kubernetes), cgroupfs | `/kubepods/burstable/pod<uid>/<id>` |
//! | CRI-O, systemd | `.../kubepods-besteffort-pod<uid>.slice/crio-<id>.scope` |
//! | CRI-O, cgroupfs | `/kubepods/besteffort/pod<uid>/crio-<id>` |
//! | Podman | `.../libpod-<id>.scope` |
//!
//! Guaranteed pods have no QoS level (`kubepods-pod<uid>.slice`, `/kubepods/pod<uid>`),
//! kind nodes prefix `kubelet-`, and a static pod's uid is a 32-digit hash instead of a
//! UUID. Paths seen from another cgroup namespace start with `/..`; only the names
//! matter here, so that does not change the answer. Real lines of each shape, with where
//! they were recorded, are the fixtures under `tests/fixtures/cgroup/`.
//!
//! Slurm's cgroup plugins name the job and step every task runs in, so a process's job is
//! known without a prolog or a mapping file:
//!
//! | Slurm plugin | a task's cgroup |
//! | --- | --- |
//! | `cgroup/v2` | `/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>` |
//! | `cgroup/v1` | `/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>` (`task_<n>` only where task/cgroup constrains that controller) |
//!
//! A build with `--enable-multiple-slurmd` (Debian's) puts the node's name in the first
//! part: `<node>_slurmstepd.scope`, `/slurm_<node>`. Steps are numbers or `batch`,
//! `extern`, `interactive`; slurmstepd itself sits in `.../step_<step>/slurm` (v2) or
//! in the job's own cgroup (v1's freezer).

use crate::observe::pod_uid::is_pod_uid;
use serde::{Deserialize, Serialize};

/// Most bytes of a cgroup file worth reading: a v1 host lists about a dozen hierarchies
/// with paths of a few hundred bytes; anything longer is not a cgroup file.
pub(crate) const MAX_CGROUP_FILE_BYTES: usize = 64 * 1024;

/// Hex digits of a container id (Docker, containerd, CRI-O and Podman alike).
const CONTAINER_ID_DIGITS: usize = 64;

/// Runtime prefixes of a container's systemd scope or cgroupfs directory name.
const CONTAINER_PREFIXES: &[(&str, Runtime)] = &[
    ("cri-containerd-", Runtime::Containerd),
    ("docker-", Runtime::Docker),
    ("crio-", Runtime::CriO),
    ("libpod-", Runtime::Podman),
];

/// What a process's cgroup file says about where it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupAttribution {
    /// The cgroup path the container, pod or Slurm job was read from (`None` when none
    /// was found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Full id of the innermost container the process runs in (64 lowercase hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The runtime whose name the container's cgroup carries (`docker-`, `libpod-`, ...),
    /// which says which engine can name the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// UID of the Kubernetes pod, with dashes (`1d9e...-...`), or a static pod's 32-digit hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The Slurm job step the process runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmStep>,
}

impl CgroupAttribution {
    /// Whether the file named neither a container nor a pod.
    pub fn is_empty(&self) -> bool {
        self.container_id.is_none() && self.pod_uid.is_none()
    }
}

/// The container runtime a cgroup name says started a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// `docker-<id>.scope`, `/docker/<id>`.
    Docker,
    /// `libpod-<id>.scope`, `/libpod_parent/libpod-<id>`.
    Podman,
    /// `cri-containerd-<id>.scope`.
    Containerd,
    /// `crio-<id>.scope`, `crio-<id>`.
    CriO,
}

/// A Slurm job step, as the cgroup of a process in it names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SlurmStep {
    /// The job id.
    pub job_id: u64,
    /// The step: a number, `batch`, `extern` or `interactive`; `None` for a process in
    /// the job's own cgroup (slurmstepd, under cgroup v1's freezer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The job's user, which cgroup v1 paths carry (`uid_<uid>`); v2 paths do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// Reads the container and pod out of the content of a `/proc/PID/cgroup` file.
///
/// Pure and total: any bytes give an answer, malformed lines are skipped. The cgroup v2
/// line is preferred, then systemd's named v1 hierarchy, then the other v1 lines in
/// file order: on a hybrid host the unified line may stay at `/` while the controllers
/// carry the container.
pub fn parse_cgroup_file(content: &[u8]) -> CgroupAttribution {
    let content = &content[..content.len().min(MAX_CGROUP_FILE_BYTES)];
    let mut lines: Vec<(u8, &[u8])> = content
        .split(|&byte| byte == b'\n')
        .filter_map(|line| {
            let mut fields = line.splitn(3, |&byte| byte == b':');
            let id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            if id.is_empty() || !id.iter().all(u8::is_ascii_digit) || !path.starts_with(b"/") {
                return None;
            }
            let rank = if id == b"0" && controllers.is_empty() {
                0
            } else if controllers == b"name=systemd" {
                1
            } else {
                2
            };
            Some((rank, path))
        })
        .collect();
    // A stable sort keeps file order within a rank.
    lines.sort_by_key(|(rank, _)| *rank);
    let mut attribution = lines
        .iter()
        .map(|(_, path)| parse_cgroup_path(path))
        .find(|attribution| !attribution.is_empty())
        .unwrap_or_default();
    // Slurm's v1 plugins place a task in each controller they use, some down to the
    // task, others (the freezer) only to the step: the first line that names a step
    // wins, and the job's user comes from any line.
    let steps: Vec<(&[u8], SlurmStep)> = lines
        .iter()
        .filter_map(|(_, path)| Some((*path, slurm_step_in(path)?)))
        .collect();
    let chosen = steps
        .iter()
        .find(|(_, step)| step.step.is_some())
        .or(steps.first());
    if let Some((path, step)) = chosen {
        let mut step = step.clone();
        step.uid = step
            .uid
            .or_else(|| steps.iter().find_map(|(_, other)| other.uid));
        if attribution.cgroup.is_none() {
            attribution.cgroup = Some(String::from_utf8_lossy(path).into_owned());
        }
        attribution.slurm = Some(step);
    }
    attribution
}

/// The container and pod one cgroup path names; the innermost of each wins (a kind
/// node's containers run inside the node's own Docker container).
pub fn parse_cgroup_path(path: &[u8]) -> CgroupAttribution {
    // Systemd's older notation for a scope under a slice, `SLICE:PREFIX:ID`, puts the
    // slice, the runtime and the id in one component; read its parts as components.
    let components: Vec<&[u8]> = path
        .split(|&byte| byte == b'/')
        .flat_map(|component| component.split(|&byte| byte == b':'))
        .filter(|component| !component.is_empty() && *component != b".." && *component != b".")
        .collect();
    let container = components
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, component)| {
            let parent = at.checked_sub(1).map(|parent| components[parent]);
            container_id_in(component, parent)
        });
    let pod_uid = components
        .iter()
        .rev()
        .find_map(|component| pod_uid_in(component));
    if container.is_none() && pod_uid.is_none() {
        return CgroupAttribution::default();
    }
    let (container_id, runtime) = match container {
        Some((id, runtime)) => (Some(id), runtime),
        None => (None, None),
    };
    CgroupAttribution {
        cgroup: Some(String::from_utf8_lossy(path).into_owned()),
        container_id,
        runtime,
        pod_uid,
        slurm: None,
    }
}

/// The container id a cgroup name carries, with the runtime its name says: `docker-<id>.scope`,
/// `crio-<id>`, a bare `<id>` (Docker's when its parent is `docker`), ...
/// (`crio-conmon-<id>.scope` is CRI-O's monitor process, not the container).
fn container_id_in(component: &[u8], parent: Option<&[u8]>) -> Option<(String, Option<Runtime>)> {
    let name = component.strip_suffix(b".scope").unwrap_or(component);
    let (id, runtime) = CONTAINER_PREFIXES
        .iter()
        .find_map(|(prefix, runtime)| Some((name.strip_prefix(prefix.as_bytes())?, Some(*runtime))))
        .unwrap_or((
            name,
            (parent == Some(b"docker".as_slice())).then_some(Runtime::Docker),
        ));
    is_hex(id, CONTAINER_ID_DIGITS)
        .then(|| (String::from_utf8_lossy(id).to_ascii_lowercase(), runtime))
}

/// The Slurm job step one cgroup path names: `.../[<node>_]slurmstepd.scope/job_<id>[/step_<step>...]`
/// (cgroup/v2) or `/slurm[_<node>]/uid_<uid>/job_<id>[/step_<step>...]` (cgroup/v1).
/// Only below one of those two roots: a `job_1` elsewhere is someone else's name.
pub fn slurm_step_in(path: &[u8]) -> Option<SlurmStep> {
    let components: Vec<&[u8]> = path
        .split(|&byte| byte == b'/')
        .filter(|component| !component.is_empty() && *component != b".." && *component != b".")
        .collect();
    components.iter().enumerate().find_map(|(at, component)| {
        let rest = &components[at + 1..];
        let (uid, rest) = if component.ends_with(b"slurmstepd.scope") {
            (None, rest)
        } else if *component == b"slurm" || component.starts_with(b"slurm_") {
            let (uid, rest) = rest.split_first()?;
            (Some(number_after(uid, b"uid_")?), rest)
        } else {
            return None;
        };
        let (job, rest) = rest.split_first()?;
        let job_id = number_after(job, b"job_")?;
        let step = rest
            .first()
            .and_then(|step| step.strip_prefix(b"step_"))
            .filter(|step| is_step_name(step))
            .map(|step| String::from_utf8_lossy(step).into_owned());
        Some(SlurmStep {
            job_id,
            step,
            uid: uid.and_then(|uid| u32::try_from(uid).ok()),
        })
    })
}

/// The decimal number after `prefix` in `component`, when that is all there is.
fn number_after(component: &[u8], prefix: &[u8]) -> Option<u64> {
    let digits = component.strip_prefix(prefix)?;
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// A step's name as Slurm writes it: a number, `batch`, `extern`, `interactive`, or a
/// heterogeneous step's `<step>+<component>`.
fn is_step_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .iter()
            .all(|&byte| byte.is_ascii_alphanumeric() || byte == b'+')
}

/// The pod uid a cgroup name carries: `pod<uid>` (cgroupfs) or `...kubepods...-pod<uid>.slice`
/// (systemd, where the uid's dashes became underscores).
fn pod_uid_in(component: &[u8]) -> Option<String> {
    let name = component.strip_suffix(b".slice").unwrap_or(component);
    let uid = match name.strip_prefix(b"pod") {
        Some(uid) => uid,
        None => {
            let at = name.windows(4).rposition(|window| window == b"-pod")?;
            if !contains(&name[..at], b"kubepods") {
                return None;
            }
            &name[at + 4..]
        }
    };
    let uid: Vec<u8> = uid
        .iter()
        .map(|&byte| if byte == b'_' { b'-' } else { byte })
        .collect();
    is_pod_uid(&uid).then(|| String::from_utf8_lossy(&uid).to_ascii_lowercase())
}

fn is_hex(text: &[u8], digits: usize) -> bool {
    text.len() == digits && text.iter().all(u8::is_ascii_hexdigit)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// The first `digits` characters of a container id, as `docker ps` and `crictl ps` show it.
pub fn short_container_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture under `tests/fixtures/cgroup/`: the content of one `/proc/PID/cgroup`.
    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cgroup")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    fn expect(name: &str, container_id: Option<&str>, pod_uid: Option<&str>) {
        let attribution = parse_cgroup_file(&fixture(name));
        assert_eq!(
            attribution.container_id.as_deref(),
            container_id,
            "container of {name}: {attribution:?}"
        );
        assert_eq!(
            attribution.pod_uid.as_deref(),
            pod_uid,
            "pod of {name}: {attribution:?}"
        );
        assert_eq!(
            attribution.cgroup.is_some(),
            container_id.is_some() || pod_uid.is_some(),
            "{name}: {attribution:?}"
        );
    }

    // Every fixture, with where it was recorded, is listed in tests/fixtures/cgroup/README.md.

    #[test]
    fn docker_cgroupfs_v1() {
        expect(
            "docker-cgroupfs-v1-ubuntu.txt",
            Some("31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"),
            None,
        );
        expect(
            "docker-cgroupfs-v1-debian.txt",
            Some("4f797c539e6c745de61a93ca3ff892358ecbcaccd8414d5db545c38428142970"),
            None,
        );
    }

    #[test]
    fn docker_systemd_v1() {
        expect(
            "docker-systemd-v1-centos.txt",
            Some("9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"),
            None,
        );
    }

    #[test]
    fn docker_systemd_v2() {
        expect(
            "docker-systemd-v2.txt",
            Some("9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"),
            None,
        );
    }

    #[test]
    fn docker_in_docker_names_the_inner_container() {
        expect(
            "docker-in-docker-v1-rancheros.txt",
            Some("ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a"),
            None,
        );
    }

    #[test]
    fn kubernetes_docker_cgroupfs_v1() {
        expect(
            "kubernetes-docker-cgroupfs-v1.txt",
            Some("cb1eadb7abe3a6545e9856411207073277838e1bdc003337c2f8685faeedc32c"),
            Some("74ba62da-1a3d-11e7-bb11-080027cb0e22"),
        );
    }

    #[test]
    fn kubernetes_docker_systemd_v1() {
        expect(
            "kubernetes-docker-systemd-v1.txt",
            Some("b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70"),
            Some("045b1e35-7f13-11e7-ac42-0050568ffca0"),
        );
    }

    #[test]
    fn kubernetes_containerd_cgroupfs_v1() {
        expect(
            "kubernetes-containerd-cgroupfs-v1.txt",
            Some("5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61"),
            Some("a36d0c1d-0b26-4451-8d80-9c195e004afa"),
        );
    }

    #[test]
    fn kubernetes_containerd_systemd_hybrid() {
        expect(
            "kubernetes-containerd-systemd-hybrid-bottlerocket.txt",
            Some("f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830"),
            Some("dd1bf9d1-241d-47f5-8e25-12de83135812"),
        );
    }

    #[test]
    fn kubernetes_containerd_systemd_colon_notation() {
        expect(
            "kubernetes-containerd-systemd-colon-v1.txt",
            Some("d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e"),
            Some("2105e389-7471-476e-a50f-6074cef29bbd"),
        );
    }

    #[test]
    fn kubernetes_containerd_guaranteed_pod_has_no_qos_level() {
        expect(
            "kubernetes-containerd-systemd-v1-guaranteed.txt",
            Some("7ee34913fbefa6a0dbbdf1bbc302cc29a1bde3b83b8b9f2252a4d4360c373848"),
            Some("ea2e69b4-0bd4-48f0-b75f-cc7c79111027"),
        );
    }

    #[test]
    fn kind_containerd_systemd_v2() {
        expect(
            "kind-containerd-systemd-v2.txt",
            Some("a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"),
            Some("1e597579-417e-482f-bf65-5fe170c3aebd"),
        );
    }

    #[test]
    fn kubernetes_in_kind_names_the_innermost_container_and_static_pod() {
        expect(
            "kind-containerd-in-docker-v1.txt",
            Some("ecbcea5cd29afb25ba519715e827cda9e66cd0a914207f49ce0a292a6aa84d66"),
            Some("d8992f589d8dd12c4342376ccb459375"),
        );
    }

    #[test]
    fn kubernetes_crio_systemd_v1() {
        expect(
            "kubernetes-crio-systemd-v1-openshift.txt",
            Some("d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607"),
            Some("8ca306fa-3c03-47fa-97dd-19979c345572"),
        );
    }

    #[test]
    fn kubernetes_crio_systemd_v1_with_an_unused_hierarchy() {
        expect(
            "kubernetes-crio-systemd-v1-calico.txt",
            Some("5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"),
            Some("a5c1f8d5-1919-434d-add7-4afaafdaef89"),
        );
    }

    #[test]
    fn kubernetes_crio_static_pod_has_a_hash_for_uid() {
        expect(
            "kubernetes-crio-systemd-v1-static-pod.txt",
            Some("7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e"),
            Some("487a0dc6dccaeefbcfedba7a7ce1ca18"),
        );
    }

    #[test]
    fn kubernetes_sub_cgroup_inside_a_container_keeps_the_container() {
        expect(
            "kubernetes-docker-cgroupfs-v1-sub-cgroup.txt",
            Some("c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903"),
            Some("f8a694f2-7c08-11e9-98da-000c29077430"),
        );
    }

    #[test]
    fn host_processes_have_no_container() {
        expect("host-v1.txt", None, None);
        expect("host-user-session-v1.txt", None, None);
        expect("host-talos-system-service-v2.txt", None, None);
        // A sandbox's memory cgroup named with a 32-digit id: no container id has 32.
        let sandbox = "0::/\n4:memory:/job_runner/0f1e2d3c4b5a69788796a5b4c3d2e1f0\n";
        assert_eq!(
            parse_cgroup_file(sandbox.as_bytes()),
            CgroupAttribution::default()
        );
    }

    #[test]
    fn crio_monitor_is_not_the_container() {
        let id = "0bc5eac79e3ae7a0c2651f14722aa10fa333eb2325c2ca97da33aa284cda81b0";
        let line = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b7632a2_a56e_4278_987a_22de18008dbe.slice/crio-conmon-{id}.scope\n");
        let attribution = parse_cgroup_file(line.as_bytes());
        assert_eq!(attribution.container_id, None);
        assert_eq!(
            attribution.pod_uid.as_deref(),
            Some("0b7632a2-a56e-4278-987a-22de18008dbe")
        );
    }

    #[test]
    fn crio_cgroupfs_and_podman_names() {
        let id = "80d85a3a585f1575028ebe468d83093c301eda20d37d1671ff2a0be50fc0e460";
        let crio =
            format!("0::/kubepods/besteffort/pod69349abe-d645-11ea-9c4c-08002709c05c/crio-{id}\n");
        let attribution = parse_cgroup_file(crio.as_bytes());
        assert_eq!(attribution.container_id.as_deref(), Some(id));
        assert_eq!(
            attribution.pod_uid.as_deref(),
            Some("69349abe-d645-11ea-9c4c-08002709c05c")
        );
        let podman = format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{id}.scope/container\n");
        assert_eq!(
            parse_cgroup_file(podman.as_bytes()).container_id.as_deref(),
            Some(id)
        );
    }

    #[test]
    fn paths_seen_from_another_cgroup_namespace_keep_their_names() {
        let id = "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830";
        let line = format!("0::/../../kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-{id}.scope\n");
        let attribution = parse_cgroup_file(line.as_bytes());
        assert_eq!(attribution.container_id.as_deref(), Some(id));
        assert_eq!(
            attribution.pod_uid.as_deref(),
            Some("dd1bf9d1-241d-47f5-8e25-12de83135812")
        );
    }

    #[test]
    fn near_misses_are_not_containers_or_pods() {
        for line in [
            // 63 and 65 digits
            "0::/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee3\n",
            "0::/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee300\n",
            // not hex
            "0::/docker/zzcb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30\n",
            // a pod marker outside kubepods, and a malformed uid
            "0::/system.slice/backup-pod0b7632a2_a56e_4278_987a_22de18008dbe.slice\n",
            "0::/kubepods/burstable/pod0b7632a2-a56e-4278-987a\n",
            // not a path, no fields, garbage
            "0::relative/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30\n",
            "\n",
            "x:y\n",
        ] {
            assert_eq!(
                parse_cgroup_file(line.as_bytes()),
                CgroupAttribution::default(),
                "{line:?}"
            );
        }
    }

    #[test]
    fn invalid_utf8_and_huge_files_are_survived() {
        let mut bytes = b"0::/docker/\xff\xfe/".to_vec();
        bytes.extend(b"31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30\n");
        let attribution = parse_cgroup_file(&bytes);
        assert_eq!(
            attribution.container_id.as_deref(),
            Some("31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30")
        );
        let huge = vec![b'/'; 10 * MAX_CGROUP_FILE_BYTES];
        assert_eq!(parse_cgroup_file(&huge), CgroupAttribution::default());
    }

    #[test]
    fn upper_case_ids_are_normalised() {
        let line = "0::/docker/31CB02944DA7A12196A193CF0E0F6C226D7C453A1DB62E65BA98287593A2EE30\n";
        assert_eq!(
            parse_cgroup_file(line.as_bytes()).container_id.as_deref(),
            Some("31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30")
        );
    }

    fn expect_slurm(name: &str, job_id: u64, step: Option<&str>, uid: Option<u32>) {
        let attribution = parse_cgroup_file(&fixture(name));
        assert_eq!(
            attribution.slurm,
            Some(SlurmStep {
                job_id,
                step: step.map(str::to_string),
                uid,
            }),
            "{name}: {attribution:?}"
        );
        assert!(attribution.cgroup.is_some(), "{name}: {attribution:?}");
        assert_eq!(attribution.container_id, None, "{name}");
    }

    #[test]
    fn slurm_cgroup_v2_names_the_job_and_step() {
        expect_slurm("slurm-v2-task.txt", 1392969, Some("0"), None);
        expect_slurm("slurm-v2-extern-step.txt", 3385, Some("extern"), None);
        expect_slurm("slurm-v2-slurmstepd.txt", 3385, Some("0"), None);
        let attribution = parse_cgroup_file(&fixture("slurm-v2-task.txt"));
        assert_eq!(
            attribution.cgroup.as_deref(),
            Some("/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0")
        );
    }

    #[test]
    fn slurm_cgroup_v1_names_the_job_step_and_user() {
        expect_slurm("slurm-v1-freezer-only.txt", 748468, Some("0"), Some(7319));
        expect_slurm(
            "slurm-v1-interactive-step.txt",
            280678,
            Some("interactive"),
            Some(2101171),
        );
        expect_slurm(
            "slurm-v1-debian-multiple-slurmd-batch-step.txt",
            2,
            Some("batch"),
            Some(0),
        );
    }

    #[test]
    fn slurmstepd_under_v1_is_in_its_jobs_cgroup_and_its_steps() {
        // The freezer holds it in the job's cgroup; cpuset, memory and devices in the
        // step's: the step wins.
        expect_slurm("slurm-v1-debian-slurmstepd.txt", 2, Some("0"), Some(0));
        assert_eq!(
            slurm_step_in(b"/slurm_localhost/uid_0/job_2"),
            Some(SlurmStep {
                job_id: 2,
                step: None,
                uid: Some(0)
            })
        );
    }

    #[test]
    fn slurmd_itself_and_look_alikes_are_not_jobs() {
        assert_eq!(
            parse_cgroup_file(&fixture("slurm-v2-slurmd-multiple-slurmd.txt")),
            CgroupAttribution::default()
        );
        for path in [
            "0::/user.slice/job_12/step_0\n",
            "0::/slurm/job_12/step_0\n",
            "0::/system.slice/slurmstepd.scope/system\n",
            "0::/system.slice/slurmstepd.scope/job_x/step_0\n",
            "4:memory:/slurm/uid_1000/job_/step_0\n",
            "4:memory:/slurm/uid_1000/job_123456789012345678901234/step_0\n",
        ] {
            assert_eq!(parse_cgroup_file(path.as_bytes()).slurm, None, "{path:?}");
        }
    }

    #[test]
    fn slurm_nodename_prefixes_and_het_steps_are_read() {
        let step =
            slurm_step_in(b"/system.slice/node7_slurmstepd.scope/job_44/step_1+2/user/task_0");
        assert_eq!(
            step,
            Some(SlurmStep {
                job_id: 44,
                step: Some("1+2".into()),
                uid: None
            })
        );
    }

    #[test]
    fn a_slurm_job_inside_a_pod_keeps_both() {
        let line = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n";
        let attribution = parse_cgroup_file(line.as_bytes());
        assert_eq!(
            attribution.pod_uid.as_deref(),
            Some("dd1bf9d1-241d-47f5-8e25-12de83135812")
        );
        assert_eq!(attribution.runtime, Some(Runtime::Containerd));
        assert_eq!(attribution.slurm.map(|step| step.job_id), Some(9));
    }

    #[test]
    fn the_runtime_is_read_from_the_name() {
        let runtime = |name: &str| parse_cgroup_file(&fixture(name)).runtime;
        assert_eq!(runtime("podman-cgroupfs-hybrid.txt"), Some(Runtime::Podman));
        assert_eq!(runtime("docker-systemd-v2.txt"), Some(Runtime::Docker));
        assert_eq!(
            runtime("docker-cgroupfs-v1-ubuntu.txt"),
            Some(Runtime::Docker)
        );
        // Docker inside a container sees its bare id at its root: no name says which.
        assert_eq!(runtime("docker-cgroupfs-v1-debian.txt"), None);
        assert_eq!(
            runtime("kubernetes-crio-systemd-v1-openshift.txt"),
            Some(Runtime::CriO)
        );
        // A bare id under a pod: the runtime is not named.
        assert_eq!(runtime("kubernetes-containerd-cgroupfs-v1.txt"), None);
        assert_eq!(
            parse_cgroup_file(&fixture("podman-cgroupfs-hybrid.txt"))
                .container_id
                .as_deref(),
            Some("a7bf71c4eb3968e1ee96f65a135da712aebd7f7a68d3fcd9622cec36048bbf31")
        );
    }

    #[test]
    fn short_ids_are_twelve_digits() {
        assert_eq!(
            short_container_id("31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"),
            "31cb02944da7"
        );
        assert_eq!(short_container_id("abc"), "abc");
    }
}
