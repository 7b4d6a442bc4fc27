//! Each device as NVML describes it: identity, MIG devices found by UUID, a name that is
//! not UTF-8, memory with the reserved part apart, and process lists read in two steps.

use super::{gpu, machine, process, used, Fake};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::MemoryInfo;
use serde_json::json;

#[test]
fn devices_have_their_identity() {
    let fake = Fake::new("identity", &machine(vec![gpu(0), gpu(1)]));
    let nvml = fake.nvml();

    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    assert_eq!(nvml.device_count().unwrap(), 2);
    let device = nvml.device_by_index(1).unwrap();
    assert_eq!(device.index().unwrap(), 1);
    assert_eq!(
        device.uuid().unwrap(),
        "GPU-6f1c2a51-0000-0000-0000-000000000001"
    );
    assert_eq!(device.name().unwrap(), "NVIDIA H200");
    assert_eq!(device.minor_number().unwrap(), 1);
    let pci = device.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:1A:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x1a, 0));
    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn mig_devices_are_found_by_uuid_and_lead_to_their_gpu() {
    let mut with_mig = gpu(1);
    let device = |gi: u32, uuid: &str| {
        json!({
            "uuid": uuid,
            "name": "NVIDIA H200 MIG 1g.18gb",
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "memory": { "total": 19_327_352_832u64, "reserved": 0, "used": 0 },
        })
    };
    with_mig["mig"] = json!({
        "current": true,
        "devices": [
            device(1, "MIG-3b1c2a51-0001-4000-8000-000000000000"),
            device(2, "MIG-3b1c2a51-0001-4000-8000-000000000001"),
        ],
    });
    let fake = Fake::new("mig", &machine(vec![gpu(0), with_mig]));
    let nvml = fake.nvml();

    let mig = nvml
        .device_by_uuid("MIG-3b1c2a51-0001-4000-8000-000000000001")
        .unwrap();
    let parent = mig.mig_parent_device().unwrap();
    assert_eq!(parent.index().unwrap(), 1);
    assert_eq!(
        parent.uuid().unwrap(),
        "GPU-6f1c2a51-0000-0000-0000-000000000001"
    );
    // A MIG handle answers for its own instance, and a GPU handle has no parent.
    assert_eq!(mig.memory_info().unwrap().total, 19_327_352_832);
    let whole = nvml
        .device_by_uuid("GPU-6f1c2a51-0000-0000-0000-000000000000")
        .unwrap();
    assert_eq!(whole.index().unwrap(), 0);
    assert!(matches!(
        whole.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("MIG-00000000-0000-4000-8000-000000000000"),
        Err(NvmlError::NotFound)
    ));
}

#[test]
fn name_bytes_can_be_invalid_utf8() {
    let mut bad = gpu(0);
    bad["name_bytes"] = json!([0x4e, 0xff, 0x56]);
    let fake = Fake::new("name-bytes", &machine(vec![bad]));
    let nvml = fake.nvml();

    let name = nvml.device_by_index(0).unwrap().name();
    assert!(matches!(name, Err(NvmlError::Utf8Error(_))), "{name:?}");
}

#[test]
fn memory_v2_reports_reserved_apart() {
    let mut given_free = gpu(1);
    given_free["memory"]["free"] = json!(42);
    let fake = Fake::new("memory", &machine(vec![gpu(0), given_free]));
    let nvml = fake.nvml();

    let derived = nvml.device_by_index(0).unwrap().memory_info().unwrap();
    let MemoryInfo {
        total,
        reserved,
        used,
        free,
        ..
    } = derived;
    assert_eq!(
        (total, reserved, used),
        (150_754_820_096, 644_939_776, 9_238_806_528)
    );
    assert_eq!(free, total - reserved - used);
    assert_eq!(
        nvml.device_by_index(1).unwrap().memory_info().unwrap().free,
        42
    );
}

#[test]
fn process_lists_survive_the_two_step_protocol() {
    let mut busy = gpu(0);
    // More than the 5 entries of headroom nvml-wrapper adds to the count it was told.
    busy["compute_processes"] = (1..=7)
        .map(|pid| process(pid, Some(pid as u64 * 1000)))
        .collect();
    busy["compute_processes"][3] = process(4, None);
    busy["mps_processes"] = json!([process(90, Some(1)), process(91, Some(2))]);
    let fake = Fake::new("processes", &machine(vec![busy]));
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();

    assert_eq!(device.running_compute_processes_count().unwrap(), 7);
    let compute = device.running_compute_processes().unwrap();
    assert_eq!(compute.len(), 7);
    assert_eq!(used(&compute[0]), (1, UsedGpuMemory::Used(1000)));
    assert_eq!(used(&compute[3]), (4, UsedGpuMemory::Unavailable));
    assert_eq!(used(&compute[6]), (7, UsedGpuMemory::Used(7000)));
    assert_eq!(compute[0].gpu_instance_id, None);
    assert_eq!(compute[0].compute_instance_id, None);

    assert!(device.running_graphics_processes().unwrap().is_empty());
    assert_eq!(device.running_graphics_processes_count().unwrap(), 0);
    let mps: Vec<_> = device
        .mps_running_compute_processes()
        .unwrap()
        .iter()
        .map(used)
        .collect();
    assert_eq!(
        mps,
        [(90, UsedGpuMemory::Used(1)), (91, UsedGpuMemory::Used(2))]
    );
}
