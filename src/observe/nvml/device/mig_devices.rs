//! A GPU's MIG mode, kept between scrapes, and while MIG is enabled each MIG device read
//! through its own handle; a MIG GPU's process lists completed from its instances'.

use super::identity::lossy_name;
use super::state::{failed, read_state};
use crate::observe::nvml::reading::{
    GpuState, MigDeviceReading, MigReading, NvmlProcess, ProcessList,
};
use crate::observe::worker::calling;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use std::time::{Duration, Instant};

/// A GPU's MIG mode (current, pending) and when it was read; `None` inside: no MIG.
pub(super) type KeptMigMode = Option<(Instant, Option<(u32, u32)>)>;

/// How long a GPU's MIG mode is served from memory. Enabling or disabling MIG takes
/// effect only at a GPU reset, which ends every process on it, so a verdict made with a
/// mode this old concerns a GPU with nothing running yet; a pending change shows this
/// much later at most.
const MIG_MODE_FOR: Duration = Duration::from_secs(30);

/// A MIG GPU's aggregate lists need root, while each MIG device's own lists may answer:
/// when every instance listed its processes, together they are the GPU's.
pub(super) fn complete_from_instances(state: &mut GpuState, mig: &MigReading) {
    let GpuState::Ok { processes, .. } = state else {
        return;
    };
    if processes.denied().is_none() || !mig.enabled || mig.error.is_some() {
        return;
    }
    let mut union = Vec::new();
    for device in &mig.devices {
        match &device.state {
            GpuState::Ok {
                processes: ProcessList::Listed(listed),
                ..
            } => union.extend(listed.iter().copied()),
            _ => return,
        }
    }
    let mut union = NvmlProcess::distinct(union);
    union.sort_by_key(|process| process.pid);
    *processes = ProcessList::Listed(union);
}

/// MIG mode and, while enabled, every MIG device through its own handle; `None` for a
/// GPU (or driver) without MIG.
pub(super) fn read_mig(device: &Device, mig_mode: &mut KeptMigMode) -> Option<MigReading> {
    let now = Instant::now();
    let (current, pending) = match *mig_mode {
        Some((read_at, mode)) if now.duration_since(read_at) < MIG_MODE_FOR => mode?,
        _ => {
            calling("nvmlDeviceGetMigMode");
            let mode = match device.mig_mode() {
                Ok(mode) => Some((mode.current, mode.pending)),
                Err(error) => {
                    tracing::debug!(error = %error, "no MIG mode");
                    None
                }
            };
            *mig_mode = Some((now, mode));
            mode?
        }
    };
    let mut mig = MigReading {
        enabled: current == MIG_ENABLED,
        pending: pending == MIG_ENABLED,
        devices: Vec::new(),
        error: None,
    };
    if !mig.enabled {
        return Some(mig);
    }
    calling("nvmlDeviceGetMaxMigDeviceCount");
    let slots = match device.mig_device_count() {
        Ok(slots) => slots,
        Err(error) => {
            mig.error = Some(error.to_string());
            return Some(mig);
        }
    };
    for index in 0..slots {
        calling("nvmlDeviceGetMigDeviceHandleByIndex");
        match device.mig_device_by_index(index) {
            Ok(instance) => mig.devices.push(read_mig_device(index, &instance)),
            // Indices without a MIG device, below the GPU's maximum.
            Err(NvmlError::NotFound) => {}
            Err(error) => mig.devices.push(MigDeviceReading {
                index,
                uuid: String::new(),
                name: String::new(),
                profile: String::new(),
                gpu_instance_id: None,
                compute_instance_id: None,
                capabilities: None,
                state: failed(error),
            }),
        }
    }
    Some(mig)
}

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

fn read_mig_device(index: u32, device: &Device) -> MigDeviceReading {
    calling("nvmlDeviceGetName");
    let name = match device.name() {
        Ok(name) => name,
        Err(NvmlError::Utf8Error(_)) => lossy_name(device).unwrap_or_default(),
        Err(_) => String::new(),
    };
    calling("nvmlDeviceGetUUID");
    let uuid = device.uuid().unwrap_or_default();
    MigDeviceReading {
        index,
        uuid,
        profile: mig_profile(&name).to_string(),
        name,
        gpu_instance_id: instance_id(device, InstanceKind::Gpu),
        compute_instance_id: instance_id(device, InstanceKind::Compute),
        capabilities: None,
        state: read_state(device),
    }
}

/// The profile a MIG device's name ends with: `1g.18gb` of `NVIDIA H200 MIG 1g.18gb`,
/// `1c.3g.20gb` of a compute instance smaller than its GPU instance.
fn mig_profile(name: &str) -> &str {
    name.rsplit_once(" MIG ")
        .map_or("", |(_, profile)| profile.trim())
}

/// Which id of a MIG device to ask for.
#[derive(Clone, Copy)]
enum InstanceKind {
    Gpu,
    Compute,
}

/// A MIG device's GPU or compute instance id; nvml-wrapper does not wrap these calls.
fn instance_id(device: &Device, kind: InstanceKind) -> Option<u32> {
    let lib = device.nvml().lib();
    let call = match kind {
        InstanceKind::Gpu => {
            calling("nvmlDeviceGetGpuInstanceId");
            lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?
        }
        InstanceKind::Compute => {
            calling("nvmlDeviceGetComputeInstanceId");
            lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?
        }
    };
    let mut id = 0;
    // SAFETY: the handle comes from a live `Device` of this library, and NVML writes one
    // unsigned int into `id`, which we own.
    let status = unsafe { call(device.handle(), &mut id) };
    (status == 0).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::nvml::reading::{MemoryReading, NvmlLists};

    #[test]
    fn mig_profiles_are_the_end_of_the_name() {
        assert_eq!(mig_profile("NVIDIA H200 MIG 1g.18gb"), "1g.18gb");
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"),
            "1c.3g.20gb"
        );
        assert_eq!(mig_profile("NVIDIA H200"), "");
    }

    fn memory(used: u64) -> MemoryReading {
        MemoryReading {
            total: 18 << 30,
            reserved: 0,
            used,
            free: (18 << 30) - used,
        }
    }

    fn instance(index: u32, processes: ProcessList) -> MigDeviceReading {
        MigDeviceReading {
            index,
            uuid: format!("MIG-{index}"),
            name: "NVIDIA H200 MIG 1g.18gb".into(),
            profile: "1g.18gb".into(),
            gpu_instance_id: Some(index + 1),
            compute_instance_id: Some(0),
            capabilities: None,
            state: GpuState::Ok {
                memory: memory(1 << 30),
                processes,
            },
        }
    }

    fn process(pid: u32) -> NvmlProcess {
        NvmlProcess {
            pid,
            used_bytes: Some(1 << 30),
            mps_only: false,
            lists: NvmlLists::COMPUTE,
        }
    }

    fn denied() -> ProcessList {
        ProcessList::Denied {
            denied: "Insufficient Permissions".into(),
            partial: Vec::new(),
        }
    }

    #[test]
    fn a_refused_aggregate_is_completed_from_instances_that_all_answered() {
        let mig = MigReading {
            enabled: true,
            pending: true,
            devices: vec![
                instance(0, ProcessList::Listed(vec![process(30)])),
                instance(1, ProcessList::Listed(vec![])),
                instance(2, ProcessList::Listed(vec![process(20), process(30)])),
            ],
            error: None,
        };
        let mut state = GpuState::Ok {
            memory: memory(2 << 30),
            processes: denied(),
        };
        complete_from_instances(&mut state, &mig);
        let GpuState::Ok { processes, .. } = &state else {
            unreachable!()
        };
        assert_eq!(
            processes,
            &ProcessList::Listed(vec![process(20), process(30)])
        );
    }

    #[test]
    fn one_refused_instance_keeps_the_aggregate_refused() {
        let mig = MigReading {
            enabled: true,
            pending: true,
            devices: vec![
                instance(0, ProcessList::Listed(vec![process(30)])),
                instance(1, denied()),
            ],
            error: None,
        };
        let mut state = GpuState::Ok {
            memory: memory(2 << 30),
            processes: denied(),
        };
        complete_from_instances(&mut state, &mig);
        let GpuState::Ok { processes, .. } = &state else {
            unreachable!()
        };
        assert!(processes.denied().is_some());
    }
}
