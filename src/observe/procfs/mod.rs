//! `/proc`: the processes NVML names and those that hold NVIDIA device files, read by
//! one reader with its own I/O (held-open stat files read with `pread`, a time budget
//! for every walk over processes, the `/proc/PID/task/TID` fallbacks of zombie leaders).
//!
//! - `reading`: what a look yields ([`ProcessFacts`], [`HolderScan`], ...), plain
//!   serialisable data.
//! - `root`: the procfs mount and the small files read whole ([`ProcRoot`]).
//! - `placement`: the exporter's own place in it, found once ([`Placement`]).
//! - `process_reader`: the one reader of processes, for NVML's owners and the holder scan
//!   ([`ProcessReader`]).
//! - `looks`: one observation's looks through it, served from and adding to
//!   `earlier_looks`.
//! - `references`: the descriptors and mappings of NVIDIA device files of one process.
//! - `earlier_looks`: what is kept of each process from one look to the next
//!   ([`EarlierLooks`]).
//! - `pidns`: whether a process's container has ended, from its PID namespace.
//! - `cgroup`: the container, pod and Slurm job step a process runs in
//!   ([`CgroupAttribution`]).
//! - `own_process`: the exporter's own CPU time, memory and descriptors ([`OwnProcess`]).
//! - [`parse`]: the text formats, parsed by hand where procfs-core cannot serve.

mod cgroup;
mod earlier_looks;
mod looks;
mod own_process;
pub mod parse;
mod pidns;
mod placement;
mod process_reader;
mod reading;
mod references;
mod root;

pub use cgroup::{
    parse_cgroup_file, parse_cgroup_path, short_container_id, slurm_step_in, CgroupAttribution,
    Runtime, SlurmStep,
};
pub use earlier_looks::{remember_witnessed, EarlierLooks, Remembered};
pub(crate) use looks::{look_at_owners, look_for_holders, Owners, OwnersScope};
pub use own_process::{OwnProcess, OwnProcessReading};
pub use placement::Placement;
pub(crate) use process_reader::OwnersRead;
pub use process_reader::{Looked, ProcessReader};
pub use reading::{
    HolderScan, Identity, Leader, Lineage, NamespaceInit, NarrowAccess, NodeSet, ProcessFacts,
    ProcessLookup, ProcfsView, References, Relative, WitnessedProcess,
};
pub use root::{PidNamespace, ProcRoot, DEVICE_PREFIX};
