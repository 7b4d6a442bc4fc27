//! Keeping what a served exporter witnessed that no later look can see again in the
//! witness state (`witness`): each owner's parent as first seen and when its exit was
//! seen, since when a kill has waited on it, since when it has been ending, and the
//! process first seen under each PID NVML lists. `check` beside the exporter and the
//! exporter after a restart start from it, so that every face gives the verdict of the one
//! that watched. What it holds ([`Witnessed`], [`WitnessReading`]) is part of an
//! observation, so it is defined with it (`snapshot`); this file makes it from a look.

use super::procfs::{self, EarlierLooks, Identity, ProcessLookup, WitnessedProcess};
use super::snapshot::{FirstSeen, Observation, WitnessReading, Witnessed};
use super::witness::{self, NoState, StateDirectory};
use super::{GpuState, Lifespan, NvmlReading};
use crate::sync::lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The most processes, and owners first seen, the state keeps: far more than the owners
/// of a host's GPUs, and a bound on the file whatever NVML lists.
pub const MAX_WITNESSED: usize = 4096;

impl Witnessed {
    /// What `observation` witnessed of NVML's owners. When some GPU did not answer, its
    /// owners are not in the observation, so what `before` kept of PIDs this one did not
    /// list is kept too; else only this look's owners are.
    pub fn of(observation: &Observation, before: &Witnessed) -> Witnessed {
        let mut processes: Vec<WitnessedProcess> = observation
            .owners
            .values()
            .filter_map(|owner| match &owner.now {
                ProcessLookup::Present(facts) => facts.witnessed(),
                _ => None,
            })
            .collect();
        let mut owners_first_seen: Vec<FirstSeen> = observation
            .owners
            .iter()
            .filter_map(|(&pid, owner)| {
                Some(FirstSeen {
                    pid,
                    identity: owner.first_seen.clone()?,
                })
            })
            .collect();
        if !answered_in_full(&observation.nvml) {
            let seen: Vec<u32> = processes.iter().map(|process| process.pid).collect();
            processes.extend(
                before
                    .processes
                    .iter()
                    .filter(|process| !seen.contains(&process.pid))
                    .cloned(),
            );
            owners_first_seen.extend(
                before
                    .owners_first_seen
                    .iter()
                    .filter(|first| !observation.owners.contains_key(&first.pid))
                    .cloned(),
            );
        }
        processes.sort_by_key(|process| process.pid);
        processes.truncate(MAX_WITNESSED);
        owners_first_seen.sort_by_key(|first| first.pid);
        owners_first_seen.truncate(MAX_WITNESSED);
        Witnessed {
            processes,
            owners_first_seen,
        }
    }

    /// Whether `observation` witnessed exactly this, with every GPU answering: what a
    /// steady scrape asks, compared in place, without building what it would write.
    fn is_what(&self, observation: &Observation) -> bool {
        if !answered_in_full(&observation.nvml) {
            return false;
        }
        let mut processes = 0;
        let mut first_seen = 0;
        for (&pid, owner) in &observation.owners {
            if let ProcessLookup::Present(facts) = &owner.now {
                let same = match (
                    facts.witnessed_parts(),
                    self.process(facts.pid, facts.start_time_ticks),
                ) {
                    (None, None) => true,
                    (Some((lineage, kill, ending)), Some(kept)) => {
                        kept.lineage.as_ref() == lineage
                            && kept.kill_pending_since_unix_seconds == kill
                            && kept.ending_since_unix_millis == ending
                    }
                    _ => false,
                };
                if !same {
                    return false;
                }
                processes += usize::from(facts.witnessed_parts().is_some());
            }
            if let Some(identity) = &owner.first_seen {
                let kept = self
                    .owners_first_seen
                    .binary_search_by_key(&pid, |first| first.pid)
                    .ok()
                    .map(|at| &self.owners_first_seen[at].identity);
                if kept != Some(identity) {
                    return false;
                }
                first_seen += 1;
            }
        }
        processes == self.processes.len() && first_seen == self.owners_first_seen.len()
    }
}

/// Whether every GPU answered NVML, so that the owners a look lists are all there are.
fn answered_in_full(nvml: &NvmlReading) -> bool {
    match nvml {
        NvmlReading::Up { gpus, .. } => gpus
            .iter()
            .all(|gpu| matches!(gpu.state, GpuState::Ok { .. })),
        NvmlReading::Down { .. } => false,
    }
}

/// The witness state of a live host: read when the host is first looked at, and, for an
/// exporter that keeps it (a server, `textfile`), written whenever a look witnessed
/// something new.
#[derive(Debug)]
pub(super) struct Witness {
    directory: StateDirectory,
    boot_id: String,
    keeps: bool,
    /// The state as read.
    read: Arc<WitnessReading>,
    /// What was last written, written again only when a look changes it; `None` before
    /// the first write, which a keeping exporter makes at its first look whatever it
    /// saw: the file says that an exporter keeps a state here, if an empty one.
    kept: Mutex<Option<Arc<Witnessed>>>,
    /// Why the last write failed, logged once until a write succeeds again.
    unwritable: Mutex<Option<String>>,
}

impl Witness {
    /// The state in `directory` of the host whose procfs is `procfs`, read now; `keeps`
    /// when this exporter writes it as it looks.
    pub(super) fn read(
        directory: PathBuf,
        procfs: &std::path::Path,
        keeps: bool,
        lifespan: Lifespan,
    ) -> Witness {
        let directory = StateDirectory { directory };
        let boot_id = witness::boot_id(procfs);
        let (witnessed, written, no_state) = match directory.load::<Witnessed>(&boot_id) {
            Ok(loaded) => (loaded.witnessed, Some(loaded.written_unix_seconds), None),
            Err(no_state) => (Witnessed::default(), None, Some(no_state)),
        };
        let path = directory.file();
        if lifespan == Lifespan::Serving {
            match &no_state {
                None => tracing::info!(
                    path = %path.display(),
                    processes = witnessed.processes.len(),
                    "read the witness state that an earlier exporter kept"
                ),
                // A server's first start on a host.
                Some(NoState::Missing { .. }) => tracing::debug!(
                    path = %path.display(),
                    "no witness state yet: starting from what this exporter sees"
                ),
                Some(no_state) => {
                    tracing::warn!("{no_state}; starting from what this exporter sees")
                }
            }
        }
        // A server says at once that it cannot keep what it sees, not at the first kill.
        let unwritable = keeps
            .then(|| witness::writable(&directory.directory).err())
            .flatten()
            .map(|error| {
                tracing::warn!(
                    path = %path.display(),
                    error = %error,
                    "cannot write the witness state: check beside this exporter, and this exporter after a restart, will not know what it saw (see --path.state)"
                );
                error.to_string()
            });
        let witnessed = Arc::new(witnessed);
        Witness {
            read: Arc::new(WitnessReading {
                path,
                written_unix_seconds: written,
                no_state,
                witnessed: Arc::clone(&witnessed),
            }),
            kept: Mutex::new(None),
            directory,
            boot_id,
            keeps,
            unwritable: Mutex::new(unwritable),
        }
    }

    /// What the state held, for the `/proc` reader's earlier looks and the first-seen identities.
    pub(super) fn seed(
        &self,
        earlier_looks: &mut EarlierLooks,
        first_seen: &mut HashMap<u32, Identity>,
    ) {
        procfs::remember_witnessed(earlier_looks, &self.read.witnessed.processes);
        for first in &self.read.witnessed.owners_first_seen {
            first_seen
                .entry(first.pid)
                .or_insert_with(|| first.identity.clone());
        }
    }

    /// The state as read, for a look's verdict to say which facts came from it.
    pub(super) fn reading(&self) -> Arc<WitnessReading> {
        Arc::clone(&self.read)
    }

    /// Keep what `observation` witnessed, when this exporter keeps the state and the look
    /// changed it: written whole, or not at all.
    pub(super) fn keep(&self, observation: &Observation) {
        if !self.keeps {
            return;
        }
        let mut kept = lock(&self.kept);
        if kept.as_ref().is_some_and(|kept| kept.is_what(observation)) {
            return;
        }
        let before = kept.as_ref().unwrap_or(&self.read.witnessed);
        let now = Witnessed::of(observation, before);
        if kept.as_deref() == Some(&now) {
            return;
        }
        match self.directory.save(&self.boot_id, &now) {
            Ok(()) => {
                *kept = Some(Arc::new(now));
                if lock(&self.unwritable).take().is_some() {
                    tracing::info!(path = %self.directory.file().display(), "the witness state is written again");
                }
            }
            Err(error) => {
                let error = error.to_string();
                let mut unwritable = lock(&self.unwritable);
                if unwritable.as_deref() != Some(error.as_str()) {
                    tracing::warn!(
                        path = %self.directory.file().display(),
                        error = %error,
                        "cannot write the witness state: check beside this exporter, and this exporter after a restart, will not know what it saw (see --path.state)"
                    );
                    *unwritable = Some(error);
                }
            }
        }
    }
}

/// NVML's owners of an observation by PID, for a test.
#[cfg(test)]
fn owners(pids: &[(u32, ProcessLookup)]) -> std::collections::BTreeMap<u32, super::OwnerLookup> {
    pids.iter()
        .map(|(pid, now)| {
            (
                *pid,
                super::OwnerLookup {
                    first_seen: None,
                    now: now.clone(),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::procfs::{Lineage, ProcessFacts, Relative};
    use crate::observe::Leader;

    fn facts(pid: u32, parent: u32) -> Arc<ProcessFacts> {
        let text = format!(
            r#"{{"pid": {pid}, "start_time_ticks": 500, "comm": "engine", "state": "S",
                "ppid": {parent}, "pgid": {parent}, "sid": {parent}, "threads": 4,
                "uid": 0, "descriptors": {{"status": "read", "gpus": [0]}},
                "mappings": {{"status": "read", "gpus": [0]}}}}"#
        );
        let mut facts: ProcessFacts = serde_json::from_str(&text).unwrap();
        facts.lineage = Some(Lineage {
            parent: Relative {
                pid: parent,
                start_time_ticks: Some(400),
                comm: Some("server".into()),
                pgid: Some(parent),
            },
            parent_exit_seen_unix_seconds: None,
            group_leader: Leader::Alive,
            session_leader: Leader::Alive,
            spawned_worker: false,
            pipes_to_parent_closed: false,
        });
        Arc::new(facts)
    }

    fn observation(
        owners: std::collections::BTreeMap<u32, super::super::OwnerLookup>,
        answered: bool,
    ) -> Observation {
        let text = r#"{"nvml": {"status": "up", "driver_version": "580", "gpus": []},
            "host_pid_namespace": true, "owners": {}, "procfs_errors": 0}"#;
        let mut observation: Observation = serde_json::from_str(text).unwrap();
        if !answered {
            observation.nvml = NvmlReading::Down {
                error: "gone".into(),
                reason: super::super::NvmlFailure::Failed,
                stuck: None,
            };
        }
        observation.owners = owners;
        observation
    }

    #[test]
    fn a_look_keeps_its_owners_and_what_others_kept_only_when_some_gpu_did_not_answer() {
        let first = observation(
            owners(&[
                (100, ProcessLookup::Present(facts(100, 50))),
                (200, ProcessLookup::Missing),
            ]),
            true,
        );
        let witnessed = Witnessed::of(&first, &Witnessed::default());
        assert_eq!(
            witnessed
                .processes
                .iter()
                .map(|process| process.pid)
                .collect::<Vec<_>>(),
            [100]
        );
        assert!(witnessed.process(100, 500).is_some());
        assert!(witnessed.process(100, 501).is_none(), "another process");
        // A look that lists another owner, every GPU answering: the first is gone.
        let second = observation(
            owners(&[(300, ProcessLookup::Present(facts(300, 60)))]),
            true,
        );
        let replaced = Witnessed::of(&second, &witnessed);
        assert_eq!(replaced.processes.len(), 1);
        assert_eq!(replaced.processes[0].pid, 300);
        // NVML did not answer: nothing it listed before is forgotten.
        let kept = Witnessed::of(&observation(Default::default(), false), &witnessed);
        assert_eq!(kept, witnessed);
    }

    #[test]
    fn a_steady_look_is_found_unchanged_in_place_and_a_change_is_not() {
        let look = observation(
            owners(&[(100, ProcessLookup::Present(facts(100, 50)))]),
            true,
        );
        let witnessed = Witnessed::of(&look, &Witnessed::default());
        assert!(witnessed.is_what(&look));
        // The parent seen to exit.
        let mut exited = (*facts(100, 50)).clone();
        exited
            .lineage
            .as_mut()
            .unwrap()
            .parent_exit_seen_unix_seconds = Some(1_796_300_000);
        let changed = observation(
            owners(&[(100, ProcessLookup::Present(Arc::new(exited)))]),
            true,
        );
        assert!(!witnessed.is_what(&changed));
        // An owner more, or one fewer.
        let more = observation(
            owners(&[
                (100, ProcessLookup::Present(facts(100, 50))),
                (200, ProcessLookup::Present(facts(200, 50))),
            ]),
            true,
        );
        assert!(!witnessed.is_what(&more));
        assert!(!witnessed.is_what(&observation(Default::default(), true)));
        // A look some GPU did not answer is never taken as unchanged.
        let mut partial = look.clone();
        partial.nvml = observation(Default::default(), false).nvml;
        assert!(!witnessed.is_what(&partial));
    }
}
