//! A GPU's identity (UUID, name, PCI bus id, minor number), kept as last seen so that a
//! GPU that is lost keeps its labels.

use crate::observe::nvml::reading::{GpuHealth, GpuReading, GpuState};
use crate::observe::worker::calling;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

/// Identity of a GPU as last seen, so a GPU that is lost keeps its labels.
#[derive(Debug, Clone, Default)]
pub(in crate::observe::nvml) struct Identity {
    uuid: String,
    name: String,
    pci_bus_id: String,
    minor: Option<u32>,
}

impl Identity {
    /// Whether every part of it has answered.
    pub(super) fn is_whole(&self) -> bool {
        !self.uuid.is_empty()
            && !self.name.is_empty()
            && !self.pci_bus_id.is_empty()
            && self.minor.is_some()
    }

    /// GPU `index` with this identity in `state`, and nothing else known of it (a GPU
    /// that did not answer).
    pub(in crate::observe::nvml) fn reading(&self, index: u32, state: GpuState) -> GpuReading {
        GpuReading {
            index,
            uuid: self.uuid.clone(),
            name: self.name.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            minor: self.minor,
            state,
            mig: None,
            health: GpuHealth::default(),
        }
    }
}

/// Keep what answers; a lost GPU keeps the identity it had when it last answered.
pub(super) fn refresh_identity(device: &Device, cached: &mut Identity) {
    calling("nvmlDeviceGetUUID");
    if let Ok(uuid) = device.uuid() {
        cached.uuid = uuid;
    }
    calling("nvmlDeviceGetName");
    match device.name() {
        Ok(name) => cached.name = name,
        // A name that is not UTF-8 is still a name: keep it, with U+FFFD for what is not.
        Err(NvmlError::Utf8Error(_)) => {
            if let Some(name) = lossy_name(device) {
                cached.name = name;
            }
        }
        Err(_) => {}
    }
    calling("nvmlDeviceGetPciInfo_v3");
    if let Ok(pci) = device.pci_info() {
        cached.pci_bus_id = pci.bus_id;
    }
    calling("nvmlDeviceGetMinorNumber");
    if let Ok(minor) = device.minor_number() {
        cached.minor = Some(minor);
    }
}

/// Bytes of NVML's longest device name, with its terminating NUL
/// (`NVML_DEVICE_NAME_V2_BUFFER_SIZE`).
const NAME_BUFFER_BYTES: usize = 96;

/// The device name as raw bytes, decoded lossily: nvml-wrapper refuses names that are
/// not UTF-8.
pub(super) fn lossy_name(device: &Device) -> Option<String> {
    let get_name = device.nvml().lib().nvmlDeviceGetName.as_ref().ok()?;
    let mut buffer = [0 as std::ffi::c_char; NAME_BUFFER_BYTES];
    // SAFETY: the handle comes from a live `Device` of this library, and NVML writes at
    // most `buffer.len()` bytes, NUL included, into the buffer we own.
    let status = unsafe {
        get_name(
            device.handle(),
            buffer.as_mut_ptr(),
            NAME_BUFFER_BYTES as std::ffi::c_uint,
        )
    };
    if status != 0 {
        return None;
    }
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&byte| byte != 0)
        .map(|&byte| byte as u8)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}
