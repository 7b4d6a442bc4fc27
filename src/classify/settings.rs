//! Tunables of the classification, and the NVML clients every host has.

/// Tunables of the classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Bytes per listed context that the driver uses without charging any process
    /// (measured: about 9 MiB per context on an H200); below this, used memory that no
    /// process is charged for is noise, not an orphan.
    pub context_overhead_bytes: u64,
    /// Command names of this site's NVML clients (monitoring agents), besides the
    /// built-in ones: a label for bystanders, never a reason to blame or to clear.
    pub agent_comms: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            context_overhead_bytes: 16 * 1024 * 1024,
            agent_comms: Vec::new(),
        }
    }
}

impl Settings {
    /// Whether a command name is a known NVML client's.
    pub fn is_known_agent(&self, comm: &str) -> bool {
        MANAGEMENT_AGENTS.contains(&comm) || self.agent_comms.iter().any(|name| name == comm)
    }
}

/// NVML clients that hold the same device files as a CUDA process (measured on an H200)
/// without a context; names as `comm` shows them (15 bytes). Only a label: the rule that
/// clears them is that they map nothing of the GPU.
const MANAGEMENT_AGENTS: &[&str] = &[
    "vram-exporter",
    "nvidia-persiste",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvidia-smi",
    "nvidia-powerd",
    "nvidia-fabricma",
    "nvidia_gpu_expo",
    "nvtop",
];
