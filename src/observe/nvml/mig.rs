//! The capability device nodes of MIG instances, from the driver's
//! `/proc/driver/nvidia-caps/mig-minors`.
//!
//! A context in a MIG instance holds `/dev/nvidia<gpu minor>` and the instance's
//! capability nodes `/dev/nvidia-caps/nvidia-cap<minor>` open; this file says which
//! minor grants access to which GPU instance (`gpu<N>/gi<G>/access <minor>`) and compute
//! instance (`gpu<N>/gi<G>/ci<C>/access <minor>`), where N is the GPU's minor number.

use super::reading::{GpuReading, MigCapabilities, NvmlReading};
use std::collections::BTreeMap;
use std::path::Path;

/// Where the driver publishes the minors, under the procfs mount point.
pub(crate) const MIG_MINORS: &str = "driver/nvidia-caps/mig-minors";

/// What a capability grants access to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Capability {
    /// A GPU instance of the GPU with this minor.
    GpuInstance {
        /// The GPU's minor number.
        gpu: u32,
        /// The GPU instance id.
        gi: u32,
    },
    /// A compute instance within a GPU instance.
    ComputeInstance {
        /// The GPU's minor number.
        gpu: u32,
        /// The GPU instance id.
        gi: u32,
        /// The compute instance id.
        ci: u32,
    },
}

/// The instance capabilities of a `mig-minors` text, with their device minors. Lines of
/// other shapes (`config`, `monitor`, anything a newer driver adds) are left out.
fn parse_mig_minors(text: &str) -> BTreeMap<Capability, u32> {
    text.lines()
        .filter_map(|line| {
            let (path, minor) = line.trim().split_once(char::is_whitespace)?;
            Some((parse_capability(path)?, minor.trim().parse().ok()?))
        })
        .collect()
}

/// `gpu<N>/gi<G>/access` or `gpu<N>/gi<G>/ci<C>/access`.
fn parse_capability(path: &str) -> Option<Capability> {
    let number = |part: &str, prefix: &str| part.strip_prefix(prefix)?.parse::<u32>().ok();
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [gpu, gi, "access"] => Some(Capability::GpuInstance {
            gpu: number(gpu, "gpu")?,
            gi: number(gi, "gi")?,
        }),
        [gpu, gi, ci, "access"] => Some(Capability::ComputeInstance {
            gpu: number(gpu, "gpu")?,
            gi: number(gi, "gi")?,
            ci: number(ci, "ci")?,
        }),
        _ => None,
    }
}

/// Whether some GPU of `reading` has MIG devices, whose capabilities
/// [`attach_capabilities`] would attach: a reading without any need not go to the `/proc`
/// reader for them.
pub(crate) fn has_mig_devices(reading: &NvmlReading) -> bool {
    let NvmlReading::Up { gpus, .. } = reading else {
        return false;
    };
    gpus.iter()
        .any(|gpu| gpu.mig.as_ref().is_some_and(|mig| !mig.devices.is_empty()))
}

/// Fills in the capability minors of every MIG device of `reading` from the file at
/// `path`. A missing file (no MIG-capable GPU, no driver) leaves them unknown; so does an
/// unreadable one, which is logged once per observation at debug level.
pub(crate) fn attach_capabilities(reading: &mut NvmlReading, path: &Path) {
    if !has_mig_devices(reading) {
        return;
    }
    let NvmlReading::Up { gpus, .. } = reading else {
        return;
    };
    let minors = match std::fs::read_to_string(path) {
        Ok(text) => parse_mig_minors(&text),
        Err(error) => {
            tracing::debug!(path = %path.display(), error = %error, "cannot read the MIG capability minors");
            return;
        }
    };
    for gpu in gpus.iter_mut() {
        attach_to_gpu(gpu, &minors);
    }
}

fn attach_to_gpu(gpu: &mut GpuReading, minors: &BTreeMap<Capability, u32>) {
    let (Some(minor), Some(mig)) = (gpu.minor, gpu.mig.as_mut()) else {
        return;
    };
    for device in &mut mig.devices {
        let Some(gi) = device.gpu_instance_id else {
            continue;
        };
        let gpu_instance = minors
            .get(&Capability::GpuInstance { gpu: minor, gi })
            .copied();
        let compute_instance = device.compute_instance_id.and_then(|ci| {
            minors
                .get(&Capability::ComputeInstance { gpu: minor, gi, ci })
                .copied()
        });
        if gpu_instance.is_some() || compute_instance.is_some() {
            device.capabilities = Some(MigCapabilities {
                gpu_instance,
                compute_instance,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::nvml::reading::{
        GpuError, GpuHealth, GpuState, MigDeviceReading, MigReading,
    };

    /// The shape NVIDIA's MIG guide and the container toolkit read: two GPUs, GPU 0 with
    /// two GPU instances, each with one compute instance.
    const MINORS: &str = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
                          gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu1/gi1/access 147\n\
                          gpu1/gi1/ci0/access 148\n";

    #[test]
    fn instance_lines_are_read_and_others_left_out() {
        let minors = parse_mig_minors(MINORS);
        assert_eq!(minors.len(), 6);
        assert_eq!(
            minors.get(&Capability::GpuInstance { gpu: 0, gi: 2 }),
            Some(&21)
        );
        assert_eq!(
            minors.get(&Capability::ComputeInstance {
                gpu: 1,
                gi: 1,
                ci: 0
            }),
            Some(&148)
        );
        // Garbage and half lines are skipped, not fatal.
        let odd = parse_mig_minors("gpu0/gi1/access\ngpuX/gi1/access 4\ngpu0/gi1/ci0/access 5 \n");
        assert_eq!(odd.len(), 1);
    }

    fn mig_gpu(minor: u32, instances: &[(u32, u32)]) -> GpuReading {
        GpuReading {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H200".into(),
            pci_bus_id: String::new(),
            minor: Some(minor),
            state: GpuState::Failed {
                error: GpuError::Unknown,
                message: String::new(),
            },
            mig: Some(MigReading {
                enabled: true,
                pending: true,
                devices: instances
                    .iter()
                    .enumerate()
                    .map(|(index, &(gi, ci))| MigDeviceReading {
                        index: index as u32,
                        uuid: String::new(),
                        name: String::new(),
                        profile: String::new(),
                        gpu_instance_id: Some(gi),
                        compute_instance_id: Some(ci),
                        capabilities: None,
                        state: GpuState::Failed {
                            error: GpuError::Unknown,
                            message: String::new(),
                        },
                    })
                    .collect(),
                error: None,
            }),
            health: GpuHealth::default(),
        }
    }

    #[test]
    fn each_instance_gets_the_minors_of_its_gpu_minor_and_ids() {
        let mut gpu = mig_gpu(1, &[(1, 0), (5, 0)]);
        attach_to_gpu(&mut gpu, &parse_mig_minors(MINORS));
        let devices = &gpu.mig.as_ref().unwrap().devices;
        assert_eq!(
            devices[0].capabilities,
            Some(MigCapabilities {
                gpu_instance: Some(147),
                compute_instance: Some(148)
            })
        );
        // An instance the file does not know keeps no capabilities.
        assert_eq!(devices[1].capabilities, None);
    }

    #[test]
    fn a_missing_file_leaves_capabilities_unknown() {
        let mut reading = NvmlReading::Up {
            driver_version: String::new(),
            gpus: vec![mig_gpu(0, &[(1, 0)])],
        };
        attach_capabilities(&mut reading, Path::new("/nonexistent/mig-minors"));
        let NvmlReading::Up { gpus, .. } = reading else {
            unreachable!()
        };
        assert_eq!(gpus[0].mig.as_ref().unwrap().devices[0].capabilities, None);
    }
}
