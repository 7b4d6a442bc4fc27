//! The fake NVML's scenario: GPUs, MIG devices, what the driver says a GPU needs, Xid
//! events, and NVML calls that fail or hang.

use crate::{CHARGED, RESERVED, TOTAL, USED};
use serde_json::{json, Value};
use std::path::Path;

/// A scenario's GPU list being built.
pub struct Gpus {
    gpus: Vec<Value>,
    init_error: Option<String>,
    hangs: Value,
}

impl Default for Gpus {
    fn default() -> Gpus {
        Gpus::new()
    }
}

impl Gpus {
    pub fn new() -> Gpus {
        Gpus {
            gpus: Vec::new(),
            init_error: None,
            hangs: json!({}),
        }
    }

    /// The named NVML call blocks, whatever it is asked about, until `until_file`
    /// exists: a wedged driver whose init or device count hangs.
    pub fn hang(mut self, symbol: &str, until_file: &Path) -> Gpus {
        self.hangs[symbol] = json!({ "until_file": until_file });
        self
    }

    pub fn gpu(mut self, gpu: Gpu) -> Gpus {
        self.gpus.push(gpu.0);
        self
    }

    pub fn init_error(mut self, error: &str) -> Gpus {
        self.init_error = Some(error.into());
        self
    }

    pub fn into_json(self) -> Value {
        json!({
            "driver_version": "580.159.04",
            "init_error": self.init_error,
            "gpus": self.gpus,
            "hangs": self.hangs,
        })
    }
}

/// One GPU of a scenario.
pub struct Gpu(pub Value);

impl Gpu {
    /// An idle H200 with index and minor `index`.
    pub fn idle(index: u32) -> Gpu {
        Gpu(json!({
            "uuid": format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
            "name": "NVIDIA H200",
            "pci_bus_id": format!("00000000:{:02x}:00.0", 0x19 + index),
            "minor": index,
            "memory": { "total": TOTAL, "reserved": RESERVED, "used": 0 },
            "compute_processes": [],
        }))
    }

    /// GPU `index` with the H200's figures for one 8 GiB owner: `USED` in use, `CHARGED`
    /// charged to `pid`.
    pub fn one_owner(index: u32, pid: u32) -> Gpu {
        Gpu::idle(index).used(USED).process(pid, Some(CHARGED))
    }

    /// The UUID `idle(index)` gives.
    pub fn uuid(index: u32) -> String {
        format!("GPU-{index:08x}-0000-4000-8000-000000000000")
    }

    pub fn used(mut self, used: u64) -> Gpu {
        self.0["memory"]["used"] = json!(used);
        self
    }

    /// NVML lists `pid` as a compute process charged `bytes` (`None`: unavailable).
    pub fn process(mut self, pid: u32, bytes: Option<u64>) -> Gpu {
        self.0["compute_processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "pid": pid, "used_bytes": bytes }));
        self
    }

    /// NVML lists `pid` as an MPS client charged `bytes`: on the compute list and on the
    /// MPS list, as the H200 listed every client, live or dead (driver 580).
    pub fn mps_client(mut self, pid: u32, bytes: Option<u64>) -> Gpu {
        self = self.process(pid, bytes);
        let entry = json!({ "pid": pid, "used_bytes": bytes });
        match self.0["mps_processes"].as_array_mut() {
            Some(list) => list.push(entry),
            None => self.0["mps_processes"] = json!([entry]),
        }
        self
    }

    /// The named NVML call fails with `error` for this GPU.
    pub fn error(mut self, symbol: &str, error: &str) -> Gpu {
        self.0["errors"][symbol] = json!(error);
        self
    }

    /// MIG enabled (now and after the next reset) with these MIG devices, in index order.
    pub fn mig(mut self, devices: Vec<MigDevice>) -> Gpu {
        let devices: Vec<Value> = devices.into_iter().map(|device| device.0).collect();
        self.0["mig"] = json!({ "current": true, "pending": true, "devices": devices });
        self
    }

    /// MIG supported but disabled, as on a GPU that never had it turned on.
    pub fn mig_disabled(mut self) -> Gpu {
        self.0["mig"] = json!({ "current": false, "pending": false });
        self
    }

    /// The raw `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` value (0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset).
    pub fn recovery_action(mut self, raw: u32) -> Gpu {
        self.0["recovery_action"] = json!(raw);
        self
    }

    /// What `nvmlDeviceGetRemappedRows` answers.
    pub fn remapped_rows(
        mut self,
        correctable: u32,
        uncorrectable: u32,
        pending: bool,
        failure: bool,
    ) -> Gpu {
        self.0["remapped_rows"] = json!({
            "correctable": correctable, "uncorrectable": uncorrectable,
            "pending": pending, "failure": failure,
        });
        self
    }

    /// What the retired-page calls answer.
    pub fn retired_pages(mut self, single_bit: u32, double_bit: u32, pending: bool) -> Gpu {
        self.0["retired_pages"] = json!({
            "multiple_single_bit": single_bit, "double_bit": double_bit, "pending": pending,
        });
        self
    }

    /// The GPU's memory is NUMA node `node`, managed by the operating system.
    pub fn numa_node(mut self, node: u32) -> Gpu {
        self.0["numa_node"] = json!(node);
        self
    }

    /// The named NVML call sleeps `ms` first for this GPU (a hung driver).
    pub fn delay(mut self, symbol: &str, ms: u64) -> Gpu {
        self.0["delays_ms"][symbol] = json!(ms);
        self
    }

    /// The named NVML call blocks for this GPU until `until_file` exists: a GPU that
    /// fell off the bus, whose calls hang.
    pub fn hang(mut self, symbol: &str, until_file: &Path) -> Gpu {
        self.0["hangs"][symbol] = json!({ "until_file": until_file });
        self
    }
}

/// Memory of a `1g.18gb` GPU instance of an H200, as NVML reports it (17.8 GiB).
pub const MIG_1G_TOTAL: u64 = 19_092_471_808;

/// One MIG device of a scenario.
pub struct MigDevice(pub Value);

impl MigDevice {
    /// An idle `1g.18gb` MIG device of GPU `gpu`: GPU instance `gi`, compute instance 0.
    pub fn new(gpu: u32, gi: u32) -> MigDevice {
        MigDevice(json!({
            "uuid": MigDevice::uuid(gpu, gi),
            "name": "NVIDIA H200 MIG 1g.18gb",
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "memory": { "total": MIG_1G_TOTAL, "reserved": 0, "used": 0 },
            "compute_processes": [],
        }))
    }

    /// The UUID `new(gpu, gi)` gives.
    pub fn uuid(gpu: u32, gi: u32) -> String {
        format!("MIG-{gpu:04x}{gi:04x}-0000-4000-8000-000000000000")
    }

    pub fn used(mut self, used: u64) -> MigDevice {
        self.0["memory"]["used"] = json!(used);
        self
    }

    /// NVML lists `pid` as a compute process of this instance charged `bytes`.
    pub fn process(mut self, pid: u32, bytes: Option<u64>) -> MigDevice {
        self.0["compute_processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "pid": pid, "used_bytes": bytes }));
        self
    }

    /// The named NVML call fails with `error` on this MIG device.
    pub fn error(mut self, symbol: &str, error: &str) -> MigDevice {
        self.0["errors"][symbol] = json!(error);
        self
    }
}

/// The process-list calls a caller without privileges is refused on a MIG GPU.
pub const PROCESS_LIST_CALLS: [&str; 3] = [
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
];

/// `scenario` with these critical Xid events, as (sequence number, GPU index, Xid).
pub fn with_xid_events(mut scenario: Value, events: &[(u64, u32, u64)]) -> Value {
    scenario["xid_events"] = events
        .iter()
        .map(|&(seq, gpu, xid)| json!({ "seq": seq, "gpu": gpu, "xid": xid }))
        .collect();
    scenario
}
