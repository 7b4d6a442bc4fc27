//! What `/proc` says about processes: plain data, serialisable, so a snapshot taken on
//! one machine replays to the same verdict on another.

use super::cgroup::CgroupAttribution;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How the PIDs of the procfs we read relate to ours (and NVML's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcfsView {
    /// The procfs shows our own PID namespace: NVML's PIDs are its PIDs.
    #[default]
    Own,
    /// The procfs belongs to another PID namespace (a container without `hostPID` that
    /// mounts the host's `/proc`): NVML's PIDs were translated through each process's
    /// `NSpid`, and those that could not be are not judged.
    Foreign,
    /// The exporter cannot find itself in the procfs (it shows no `self`, or another
    /// namespace whose ancestry cannot be read): whose PIDs it shows is unknown, so no
    /// owner NVML names can be judged in it.
    Unknown,
}

/// Who a process is: a PID names a process only together with its start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Start time in clock ticks after boot.
    pub start_time_ticks: u64,
    /// Command name when first seen.
    pub comm: String,
    /// Parent PID when first seen: a child whose parent died is adopted by the nearest
    /// subreaper, often this parent's own parent.
    pub ppid: u32,
    /// Process group when first seen; a forked child keeps it after the owner dies.
    pub pgid: u32,
    /// Session when first seen; likewise kept by children.
    pub sid: u32,
}

impl Identity {
    /// The identity of a process as read now.
    pub fn of(facts: &ProcessFacts) -> Identity {
        Identity {
            start_time_ticks: facts.start_time_ticks,
            comm: facts.comm.clone(),
            ppid: facts.ppid,
            pgid: facts.pgid,
            sid: facts.sid,
        }
    }
}

/// What `/proc` says about one PID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ProcessLookup {
    /// No such process in our PID namespace.
    Missing,
    /// The process exists.
    Present(Arc<ProcessFacts>),
    /// The entry exists but could not be read (permissions, a race); not evidence of absence.
    Unreadable {
        /// The error, in one line.
        error: String,
    },
    /// The procfs we read belongs to another PID namespace and shows no process under
    /// this PID of ours: it cannot be judged from here.
    NotVisible,
}

/// Everything one reading of `/proc` says about one process: identity, state, the
/// NVIDIA device files it holds open and maps, and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessFacts {
    /// Its PID in the procfs read (the host's, for an exporter run as documented).
    pub pid: u32,
    /// Its PID in the exporter's own PID namespace, the one NVML and `kill` use here;
    /// `None` when it is not visible there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pid: Option<u32>,
    /// Start time in clock ticks after boot; with the PID, the process's identity.
    pub start_time_ticks: u64,
    /// Command name (`comm`).
    pub comm: String,
    /// The one-letter state of the main thread (`R`, `S`, `D`, `T`, `Z`, ...).
    pub state: char,
    /// Parent PID.
    pub ppid: u32,
    /// Process group: a child keeps its dead parent's group, so it ties a holder to an owner.
    pub pgid: u32,
    /// Session, which a child keeps likewise.
    pub sid: u32,
    /// Threads in the process.
    pub threads: u32,
    /// Real user id, when readable.
    pub uid: Option<u32>,
    /// User name for `uid`, when the host knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kernel function it waits in, read only when in state `D`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// The process is in its exit path: its main thread has begun to exit (`PF_EXITING`),
    /// and every other thread too when the main one is a zombie. The kernel is closing its
    /// files, and the driver frees a context whose last reference closes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exiting: bool,
    /// In uninterruptible sleep with a SIGKILL pending (`SigPnd`/`ShdPnd`, read only in
    /// state `D`): it was killed, and the kill waits until it leaves the call it is in.
    /// The time, in seconds since the Unix epoch, when the exporter first saw it so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_pending_since_unix_seconds: Option<u64>,
    /// Since when it has been seen ending (see [`ProcessFacts::ending`]), in milliseconds
    /// since the Unix epoch: a kill frees a context in a fifth of a second, so the wait is
    /// measured finer than a second. Carried from look to look while it is the same
    /// process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending_since_unix_millis: Option<u64>,
    /// Where it came from, read for NVML's owners when first seen: its parent then, and
    /// whether that parent has exited since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// NVIDIA device files it holds open (any thread's descriptors).
    pub descriptors: References,
    /// NVIDIA device files it maps shared: a CUDA context, own or inherited by fork, maps
    /// its GPU's node read-write (see [`NodeSet::maps_gpu_read_write`]).
    pub mappings: References,
    /// The container and pod its cgroup names.
    #[serde(flatten)]
    pub cgroup: CgroupAttribution,
    /// PID 1 of its PID namespace, when that is nested in ours (a container's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace_init: Option<NamespaceInit>,
}

impl ProcessFacts {
    /// Whether it holds or maps anything of GPU `minor`'s node.
    pub fn touches_gpu(&self, minor: u32) -> bool {
        self.descriptors.has_gpu(minor) || self.mappings.has_gpu(minor)
    }

    /// Whether the process is ending: every thread in its exit path (`exiting`; a zombie
    /// main thread whose other threads live is not, they keep the context), or finished
    /// (see [`ProcessFacts::finished`]).
    pub fn ending(&self) -> bool {
        Self::is_ending(self.exiting, self.state, self.threads, &self.mappings)
    }

    /// [`ProcessFacts::ending`] of a process with these fields, for a reader that has them
    /// before it has the facts.
    pub fn is_ending(exiting: bool, state: char, threads: u32, mappings: &References) -> bool {
        exiting || Self::is_finished(state, threads, mappings)
    }

    /// Whether every thread has exited: a zombie with no other thread and an address space
    /// already gone, which waits only to be reaped and holds nothing of its own. Memory
    /// NVML still charges it is kept by whoever keeps its device file (a child it forked).
    pub fn finished(&self) -> bool {
        Self::is_finished(self.state, self.threads, &self.mappings)
    }

    fn is_finished(state: char, threads: u32, mappings: &References) -> bool {
        state == 'Z' && threads <= 1 && mappings.nodes().is_some_and(NodeSet::is_empty)
    }
}

/// What earlier looks saw of a process that no reading now can see again: where it came
/// from (its parent while that lived), since when a kill has waited on it, since when it
/// has been ending. A server keeps it for `check` and for itself after a restart (the
/// witness state); it counts only for the same process, by PID and start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessedProcess {
    /// Its PID in the procfs read.
    pub pid: u32,
    /// Its start time in clock ticks after boot.
    pub start_time_ticks: u64,
    /// See [`ProcessFacts::lineage`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// See [`ProcessFacts::kill_pending_since_unix_seconds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_pending_since_unix_seconds: Option<u64>,
    /// See [`ProcessFacts::ending_since_unix_millis`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending_since_unix_millis: Option<u64>,
}

impl ProcessFacts {
    /// What of this reading no later one could see again, if anything, by reference:
    /// where it came from, since when a kill has waited, since when it has been ending.
    pub fn witnessed_parts(&self) -> Option<(Option<&Lineage>, Option<u64>, Option<u64>)> {
        let seen = self.lineage.is_some()
            || self.kill_pending_since_unix_seconds.is_some()
            || self.ending_since_unix_millis.is_some();
        seen.then_some((
            self.lineage.as_ref(),
            self.kill_pending_since_unix_seconds,
            self.ending_since_unix_millis,
        ))
    }

    /// What of this reading no later one could see again, if anything.
    pub fn witnessed(&self) -> Option<WitnessedProcess> {
        self.witnessed_parts().map(|_| WitnessedProcess {
            pid: self.pid,
            start_time_ticks: self.start_time_ticks,
            lineage: self.lineage.clone(),
            kill_pending_since_unix_seconds: self.kill_pending_since_unix_seconds,
            ending_since_unix_millis: self.ending_since_unix_millis,
        })
    }
}

/// Where an owner came from: what `/proc` said of its parent, process group and session
/// when the exporter first read it, and whether the parent has exited since. A worker
/// whose server was killed lives on, adopted by PID 1 or a subreaper, and holds its
/// memory for nobody; a service meant to run alone looks the same from its own stat
/// line, so only these say which it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// Its parent when first read, by identity.
    pub parent: Relative,
    /// When the exporter saw that parent gone (its PID gone, or naming a process with
    /// another start time), in seconds since the Unix epoch: `None` while it lives, or
    /// when the owner had no readable parent when first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_exit_seen_unix_seconds: Option<u64>,
    /// Its process group's leader when first read.
    pub group_leader: Leader,
    /// Its session's leader when first read.
    pub session_leader: Leader,
    /// Its command line is that of a worker a parent spawns and talks to (Python's
    /// `multiprocessing`); read only when its group's leader is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spawned_worker: bool,
    /// It holds a pipe it reads and another it writes, beyond the standard streams,
    /// whose other ends no process outside its group holds: a worker's pipes to a
    /// parent that has exited (a `multiprocessing` worker's, whatever its command line
    /// says). Read only when its group's leader is gone and it was adopted from outside
    /// the group, and its command line says nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pipes_to_parent_closed: bool,
}

/// A process related to another (its parent), by identity as first read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relative {
    /// Its PID in the procfs read.
    pub pid: u32,
    /// Its start time in clock ticks after boot; `None` when it could not be read (PID 0:
    /// the owner is a PID namespace's init, whose parent is outside it).
    pub start_time_ticks: Option<u64>,
    /// Its command name, when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Its process group, when read: a parent outside its child's group adopted it (a
    /// group holds only its leader's descendants, and an adopter is the leader's
    /// ancestor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgid: Option<u32>,
}

/// What a process group's or session's leader was when an owner was first read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Leader {
    /// The owner leads it.
    Itself,
    /// Its leader lives (a process under the leader's PID started before the owner).
    Alive,
    /// Its leader has exited. The kernel keeps a PID from reuse while it names a live
    /// group or session, so no other process can be under it.
    Gone,
    /// Could not be read.
    Unknown,
}

/// What could be read of one kind of reference a process has to NVIDIA device files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum References {
    /// Read: these nodes.
    Read(NodeSet),
    /// Denied: another user's descriptors and mappings need root, or CAP_DAC_READ_SEARCH
    /// and CAP_SYS_PTRACE.
    Unreadable,
    /// Not looked at.
    NotRead,
}

impl References {
    /// Whether GPU `minor`'s node is among what was read.
    pub fn has_gpu(&self, minor: u32) -> bool {
        matches!(self, References::Read(nodes) if nodes.gpus.contains(&minor))
    }

    /// Whether these mappings were read and map GPU `minor`'s node read-write (see
    /// [`NodeSet::maps_gpu_read_write`]).
    pub fn maps_gpu_read_write(&self, minor: u32) -> bool {
        matches!(self, References::Read(nodes) if nodes.maps_gpu_read_write(minor))
    }

    /// The nodes read, if they could be.
    pub fn nodes(&self) -> Option<&NodeSet> {
        match self {
            References::Read(nodes) => Some(nodes),
            References::Unreadable | References::NotRead => None,
        }
    }
}

/// A set of NVIDIA device nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSet {
    /// Minor numbers of GPU nodes (`/dev/nvidia<minor>`), ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// `/dev/nvidiactl`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control: bool,
    /// `/dev/nvidia-uvm` or `/dev/nvidia-uvm-tools`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uvm: bool,
    /// Minor numbers of capability nodes (`/dev/nvidia-caps/nvidia-cap<minor>`), ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<u32>,
    /// Any other `/dev/nvidia*` node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub other: bool,
    /// Of a process's mapped GPU nodes, those none of whose shared mappings is read-write,
    /// by minor number, with how they are mapped. Empty for descriptors, and for mappings
    /// read by versions that did not record how (their "maps GPU N" meant a context, and
    /// still does).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpus_without_read_write: BTreeMap<u32, NarrowAccess>,
    /// How `/dev/nvidiactl` is mapped when it is mapped and none of its shared mappings is
    /// read-write (a context maps it read-write); `None` otherwise, and for descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_without_read_write: Option<NarrowAccess>,
}

/// How a node is mapped shared when none of its mappings is both readable and writable.
///
/// Measured on an H200 (driver 580): a CUDA context, own or inherited by fork, maps its
/// GPU's node `rw-s` (beside two `-w-s` lines) and `/dev/nvidiactl` `rw-s` (beside one
/// `r--s`); the MPS control daemon, which initialised the driver but holds no context,
/// maps the GPU's node only `-w-s` and `/dev/nvidiactl` only `r--s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NarrowAccess {
    /// Some mapping may be written, none both read and written (`-w-s`).
    WriteOnly,
    /// Some mapping may be read, none written (`r--s`).
    ReadOnly,
    /// No mapping may be read or written (`---s`).
    NoAccess,
}

impl NodeSet {
    /// Whether GPU `minor`'s node is mapped read-write: a CUDA context there, own or
    /// inherited by fork. A node mapped only write-only or read-only is a process that
    /// initialised the driver without a context (measured: the MPS control daemon).
    pub fn maps_gpu_read_write(&self, minor: u32) -> bool {
        self.gpus.contains(&minor) && !self.gpus_without_read_write.contains_key(&minor)
    }

    /// How GPU `minor`'s node is mapped, when it is mapped but never read-write.
    pub fn gpu_without_read_write(&self, minor: u32) -> Option<NarrowAccess> {
        self.gpus_without_read_write
            .get(&minor)
            .copied()
            .filter(|_| self.gpus.contains(&minor))
    }

    /// Whether the set names no node.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
            && !self.control
            && !self.uvm
            && self.capabilities.is_empty()
            && !self.other
    }
}

/// PID 1 of a nested PID namespace, as seen from ours. A container with its own PID
/// namespace (the default of Docker, containerd, CRI-O and Kubernetes) lives exactly as
/// long as that process: when it exits, the kernel SIGKILLs every other process in the
/// namespace, so one that is still there could not die (it is stuck, typically in the
/// driver). The kernel keeps the exited PID 1 in its exit path, with every thread marked
/// exiting (`PF_EXITING`), until the last of them is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum NamespaceInit {
    /// PID 1 of the namespace is alive: the container runs.
    Running {
        /// Its PID in our namespace.
        pid: u32,
    },
    /// Every thread of PID 1 is exiting: the container has ended.
    Exited {
        /// Its PID in our namespace.
        pid: u32,
    },
    /// PID 1 could not be found or read (permissions, the scan's time budget).
    Unknown,
}

impl NamespaceInit {
    /// Whether this says the container has ended.
    pub fn exited(init: Option<NamespaceInit>) -> bool {
        matches!(init, Some(NamespaceInit::Exited { .. }))
    }
}

/// The result of scanning every process for NVIDIA device files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderScan {
    /// Every process (other than the exporter) holding an NVIDIA device file open, with
    /// what it maps.
    pub holders: Vec<ProcessFacts>,
    /// Processes whose descriptors we were not allowed to read.
    pub permission_errors: u64,
    /// Whether the scan stopped at its time budget before seeing every process.
    pub cut_short: bool,
    /// How long the scan took.
    pub duration_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mappings_of_older_versions_keep_meaning_a_context() {
        // Written before the access of a mapping was recorded: "maps GPU 0" was a context.
        let old: NodeSet =
            serde_json::from_value(json!({ "gpus": [0], "control": true, "uvm": true })).unwrap();
        assert!(old.maps_gpu_read_write(0));
        assert_eq!(old.gpu_without_read_write(0), None);
        // A context is written as it was then: no new keys.
        assert_eq!(
            serde_json::to_value(&old).unwrap(),
            json!({ "gpus": [0], "control": true, "uvm": true })
        );
    }

    #[test]
    fn a_write_only_mapping_round_trips_and_is_no_context() {
        let daemon = NodeSet {
            gpus: vec![0],
            control: true,
            gpus_without_read_write: BTreeMap::from([(0, NarrowAccess::WriteOnly)]),
            control_without_read_write: Some(NarrowAccess::ReadOnly),
            ..NodeSet::default()
        };
        let text = serde_json::to_value(&daemon).unwrap();
        assert_eq!(
            text,
            json!({
                "gpus": [0],
                "control": true,
                "gpus_without_read_write": { "0": "write_only" },
                "control_without_read_write": "read_only",
            })
        );
        let back: NodeSet = serde_json::from_value(text).unwrap();
        assert_eq!(back, daemon);
        assert!(!back.maps_gpu_read_write(0));
        assert!(!back.maps_gpu_read_write(1));
    }
}
