//! The exporter's own place in the procfs it reads, found once: a process does not move
//! between PID namespaces or change its capabilities.

use super::parse;
use super::reading::ProcfsView;
use super::root::ProcRoot;
use std::fs;

/// Where the exporter stands relative to the procfs it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Position {
    /// The procfs shows our own PID namespace.
    Own,
    /// It shows an ancestor namespace, in which ours is `namespace`, `level` levels down.
    Foreign { level: usize, namespace: u64 },
    /// It shows another namespace and ours cannot be located in it.
    Lost,
}

/// The exporter's place in the procfs it reads.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// The procfs's PID for the exporter itself, which the holder scan leaves out.
    pub(super) own_pid: u32,
    pub(super) position: Position,
    /// Whether a denied `readlink` of a descriptor makes the process unreadable. Listing
    /// another user's descriptors needs CAP_DAC_READ_SEARCH, reading where they point
    /// CAP_SYS_PTRACE: an exporter with only the first may list every process and read no
    /// link, and would miss holders in a scan that looks complete. With CAP_SYS_PTRACE a
    /// denial comes from beyond what capabilities grant (a process of a parent user
    /// namespace, such as a sandbox's own init) and is passed over.
    pub(super) count_denied_links: bool,
}

impl Placement {
    /// Locate the exporter in `root`.
    pub fn locate(root: &ProcRoot) -> Placement {
        let ours = std::process::id();
        let found = root.self_pid();
        let own_pid = found.unwrap_or(ours);
        // A procfs shows `self` to every process of its PID namespace and its ancestors':
        // one that shows it no `self` belongs to a namespace this process cannot see
        // into, where the PIDs NVML gives name other processes, if any.
        let position = if found.is_none() && !root.stand_in {
            Position::Lost
        } else if own_pid == ours {
            Position::Own
        } else {
            let dir = root.pid_dir(own_pid);
            let level = root
                .status(&dir)
                .ok()
                .and_then(|status| status.nspid)
                .map(|levels| levels.len() - 1);
            match (level, root.pid_namespace(&dir)) {
                (Some(level), Some(namespace)) => Position::Foreign { level, namespace },
                _ => Position::Lost,
            }
        };
        let count_denied_links = fs::read(root.root.join("self/status"))
            .ok()
            .and_then(|status| parse::status(&status).effective_capabilities)
            .is_none_or(|caps| caps & (1 << parse::CAP_SYS_PTRACE) == 0);
        Placement {
            own_pid,
            position,
            count_denied_links,
        }
    }

    /// Whether the procfs shows our own PID namespace.
    pub(crate) fn view(self) -> ProcfsView {
        match self.position {
            Position::Own => ProcfsView::Own,
            Position::Foreign { .. } => ProcfsView::Foreign,
            Position::Lost => ProcfsView::Unknown,
        }
    }
}
