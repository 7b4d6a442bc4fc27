//! The MPS control daemon and MPS server of a GPU shared through MPS (CUDA Multi-Process
//! Service), told apart from a client's heir by what an H200 showed (driver 580), never by
//! their names alone:
//!
//! - the server (`nvidia-cuda-mps-server`) is a live owner that NVML lists on the GPU's
//!   compute list and not on its MPS list, while the MPS list names the clients (a dead
//!   client stays on both lists for as long as its memory is held); it is the control
//!   daemon's child, in the daemon's session;
//! - the control daemon (`nvidia-cuda-mps-control -d`) is the server's parent, NVML lists
//!   it on no GPU, and it leads its own session (it daemonised).
//!
//! Both hold the GPU's device file. Killing the daemon freed no client's orphan and took
//! the server down with it, ending MPS for every client; killing the client's forked child
//! alone freed it. So neither is ever a culprit of a client's orphan, whatever it maps:
//! this guard stands beside the mapping rule (the daemon maps the GPU's node only
//! write-only, the server read-write, as it holds every client's context). Their command
//! name, `nvidia-cuda-mps` for both, is only a label.

use crate::classify::owners::Owner;
use crate::observe::{NvmlLists, ProcessFacts};
use std::collections::{BTreeMap, BTreeSet};

/// The command name (15 bytes, as the kernel keeps it) of the MPS control daemon and of
/// the MPS server alike: a label, never a reason.
pub(crate) const MPS_COMM: &str = "nvidia-cuda-mps";

/// What a holder is to MPS on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MpsPart {
    /// The control daemon, parent of the server with this PID (here).
    ControlDaemon {
        /// The server's PID.
        server: u32,
    },
    /// The server, child of the control daemon with this PID (here).
    Server {
        /// The daemon's PID.
        daemon: u32,
    },
}

/// The MPS parts among `holders` of the GPU (or MIG instance) whose judged `owners` are
/// given, by each holder's PID in the procfs; `listed` is every PID NVML lists on any GPU.
/// Empty unless the GPU's MPS list names a client.
pub(crate) fn mps_parts(
    holders: &[ProcessFacts],
    owners: &[Owner],
    listed: &BTreeSet<u32>,
) -> BTreeMap<u32, MpsPart> {
    let mut parts = BTreeMap::new();
    if !owners.iter().any(|owner| owner.lists.mps) {
        return parts;
    }
    for server in holders {
        let Some(here) = server.local_pid else {
            continue;
        };
        let listed_as_server = owners.iter().any(|owner| {
            owner.pid == here && owner.state().is_live() && listed_as_server(owner.lists)
        });
        if !listed_as_server {
            continue;
        }
        // Parents, sessions and holders' PIDs are all the procfs's.
        let daemon = holders.iter().find(|daemon| {
            daemon.pid == server.ppid
                && daemon.sid == daemon.pid
                && server.sid == daemon.sid
                && daemon.local_pid.is_none_or(|pid| !listed.contains(&pid))
        });
        if let Some(daemon) = daemon {
            parts.insert(
                server.pid,
                MpsPart::Server {
                    daemon: pid_here(daemon),
                },
            );
            parts.insert(
                daemon.pid,
                MpsPart::ControlDaemon {
                    server: pid_here(server),
                },
            );
        }
    }
    parts
}

/// On the compute (or graphics) list and not the MPS list: the server's listing, known
/// only where the lists were recorded.
fn listed_as_server(lists: NvmlLists) -> bool {
    (lists.compute || lists.graphics) && !lists.mps
}

/// The PID the verdict names a process by (see [`super::Process::new`]).
fn pid_here(facts: &ProcessFacts) -> u32 {
    facts.local_pid.unwrap_or(facts.pid)
}
