//! Pod names by uid, from the kubelet's pod log directories.
//!
//! A process's cgroup names its pod only by uid, and the pod-resources API names pods
//! without their uids. The kubelet makes one directory per pod under `/var/log/pods`,
//! named `<namespace>_<name>_<uid>`, before the pod's containers start: a local,
//! read-only answer, one `readdir` per refresh, with no credentials. (The API server
//! knows too, but asking it needs a token and RBAC; the kubelet's read API needs them as
//! well.) Namespace and pod names are DNS labels and subdomains, which never contain `_`,
//! so the three parts split cleanly.

use super::reading::{PodName, SourceError};
use crate::observe::pod_uid::is_pod_uid;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Most uids remembered. Names are kept after a pod's directory goes (a stuck process
/// can outlive its pod by days, and a uid never changes its name), so the cache is
/// bounded instead: a node runs at most a few hundred pods at once.
const MAX_REMEMBERED_PODS: usize = 4096;

/// The uid and name a pod log directory's name gives, or `None` for another name.
fn parse_log_dir_name(name: &str) -> Option<(String, PodName)> {
    let mut parts = name.split('_');
    let (namespace, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || namespace.is_empty() || pod.is_empty() {
        return None;
    }
    if !is_pod_uid(uid.as_bytes()) {
        return None;
    }
    Some((
        uid.to_ascii_lowercase(),
        PodName {
            namespace: namespace.to_string(),
            name: pod.to_string(),
        },
    ))
}

/// The directory of pod log directories could not be listed.
#[derive(Debug, Error)]
#[error("cannot list {}", dir.display())]
pub(super) struct ListError {
    dir: PathBuf,
    source: io::Error,
}

impl ListError {
    /// The kind of failure, as the metrics name it.
    pub(super) fn kind(&self) -> SourceError {
        match self.source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => SourceError::Absent,
            _ => SourceError::Unreadable,
        }
    }
}

/// Every pod directory under `dir`; entries with other names are skipped.
pub(super) fn read_pod_log_dirs(dir: &Path) -> Result<Vec<(String, PodName)>, ListError> {
    let failed = |source| ListError {
        dir: dir.to_path_buf(),
        source,
    };
    let mut pods = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if let Some(pod) = entry.file_name().to_str().and_then(parse_log_dir_name) {
            pods.push(pod);
        }
    }
    Ok(pods)
}

/// Pod names by uid, remembered across refreshes.
#[derive(Debug, Default)]
pub(super) struct PodNameCache {
    /// Each uid's name and the refresh that last saw its directory.
    names: HashMap<String, (PodName, u64)>,
    refreshes: u64,
}

impl PodNameCache {
    /// Takes in one listing of the directories; the least recently seen uids go once
    /// there are more than [`MAX_REMEMBERED_PODS`].
    pub(super) fn update(&mut self, listing: Vec<(String, PodName)>) {
        self.refreshes += 1;
        for (uid, name) in listing {
            self.names.insert(uid, (name, self.refreshes));
        }
        if self.names.len() > MAX_REMEMBERED_PODS {
            let mut by_age: Vec<(u64, String)> = self
                .names
                .iter()
                .map(|(uid, (_, seen))| (*seen, uid.clone()))
                .collect();
            by_age.sort();
            let excess = self.names.len() - MAX_REMEMBERED_PODS;
            for (_, uid) in by_age.into_iter().take(excess) {
                self.names.remove(&uid);
            }
        }
    }

    /// The name of the pod with `uid`, if it was ever seen.
    pub(super) fn get(&self, uid: &str) -> Option<&PodName> {
        self.names.get(uid).map(|(name, _)| name)
    }

    /// The names of those of `uids` that are known.
    pub(super) fn names_of<'a>(
        &self,
        uids: impl IntoIterator<Item = &'a str>,
    ) -> BTreeMap<String, PodName> {
        uids.into_iter()
            .filter_map(|uid| Some((uid.to_string(), self.get(uid)?.clone())))
            .collect()
    }

    /// How many uids are remembered.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(namespace: &str, pod: &str) -> PodName {
        PodName {
            namespace: namespace.into(),
            name: pod.into(),
        }
    }

    #[test]
    fn log_directory_names_split_into_namespace_name_and_uid() {
        assert_eq!(
            parse_log_dir_name("ml_sglang-0_1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e"),
            Some((
                "1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e".into(),
                name("ml", "sglang-0")
            ))
        );
        // A static pod's uid is a hash; dots are allowed in pod names.
        assert_eq!(
            parse_log_dir_name("kube-system_etcd-node.a_487a0dc6dccaeefbcfedba7a7ce1ca18"),
            Some((
                "487a0dc6dccaeefbcfedba7a7ce1ca18".into(),
                name("kube-system", "etcd-node.a")
            ))
        );
        assert_eq!(
            parse_log_dir_name("ml_train_1D9E2C4A-7B3F-4E1A-9C2D-5F6A7B8C9D0E")
                .unwrap()
                .0,
            "1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e"
        );
    }

    #[test]
    fn other_names_are_not_pods() {
        for other in [
            "ml_sglang-0",
            "ml_sglang-0_not-a-uid",
            "_sglang-0_1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e",
            "ml__1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e",
            "ml_a_b_1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e",
            "lost+found",
            "",
        ] {
            assert_eq!(parse_log_dir_name(other), None, "{other}");
        }
    }

    #[test]
    fn names_outlive_their_directories_within_the_bound() {
        let mut cache = PodNameCache::default();
        cache.update(vec![
            ("a".into(), name("ml", "a")),
            ("b".into(), name("ml", "b")),
        ]);
        cache.update(vec![("b".into(), name("ml", "b"))]);
        assert_eq!(cache.get("a"), Some(&name("ml", "a")), "gone, still named");
        let many: Vec<(String, PodName)> = (0..MAX_REMEMBERED_PODS)
            .map(|n| (format!("u{n}"), name("batch", &format!("job-{n}"))))
            .collect();
        cache.update(many);
        assert_eq!(cache.len(), MAX_REMEMBERED_PODS);
        // The two older ones went, the least recently seen first.
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b"), None);
        assert!(cache.get("u0").is_some());
        let named = cache.names_of(["u1", "missing"]);
        assert_eq!(named.len(), 1);
        assert_eq!(named["u1"], name("batch", "job-1"));
    }

    #[test]
    fn a_directory_is_read_and_strangers_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(
            dir.path()
                .join("ml_sglang-0_1d9e2c4a-7b3f-4e1a-9c2d-5f6a7b8c9d0e"),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("lost+found")).unwrap();
        let pods = read_pod_log_dirs(dir.path()).unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].1, name("ml", "sglang-0"));
        assert!(read_pod_log_dirs(&dir.path().join("missing")).is_err());
    }
}
