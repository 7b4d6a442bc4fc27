//! MIG devices: their own handles, a GPU without MIG, instance ids and errors through
//! raw calls.

use super::{gpu, library, machine, process, Fake};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;
use serde_json::{json, Value};

/// A MIG device entry of a scenario.
fn mig_device(gi: u32, profile: &str, used: u64, processes: Vec<Value>) -> Value {
    json!({
        "uuid": format!("MIG-6f1c2a51-0000-0000-0000-00000000{gi:04}"),
        "name": format!("NVIDIA H200 MIG {profile}"),
        "gpu_instance_id": gi,
        "compute_instance_id": 0,
        "memory": { "total": 18_253_611_008_u64, "reserved": 0, "used": used },
        "compute_processes": processes,
    })
}

/// GPU 0 with MIG on and two instances, the second one busy.
fn mig_machine() -> Value {
    let mut parent = gpu(0);
    parent["mig"] = json!({
        "current": true,
        "devices": [
            mig_device(7, "1g.18gb", 0, vec![]),
            mig_device(9, "1g.18gb", 4_294_967_296, vec![process(510, Some(4_290_000_000))]),
        ],
    });
    machine(vec![parent])
}

#[test]
fn mig_devices_answer_through_their_own_handles() {
    let fake = Fake::new("mig", &mig_machine());
    let nvml = fake.nvml();
    let parent = nvml.device_by_index(0).unwrap();
    let mode = parent.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(parent.mig_device_count().unwrap(), 7);
    assert!(!parent.mig_is_mig_device_handle().unwrap());

    let busy = parent.mig_device_by_index(1).unwrap();
    assert!(busy.mig_is_mig_device_handle().unwrap());
    assert_eq!(
        busy.uuid().unwrap(),
        "MIG-6f1c2a51-0000-0000-0000-000000000009"
    );
    assert_eq!(busy.name().unwrap(), "NVIDIA H200 MIG 1g.18gb");
    assert_eq!(busy.memory_info().unwrap().used, 4_294_967_296);
    let listed = busy.running_compute_processes().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].pid,
            listed[0].gpu_instance_id,
            listed[0].compute_instance_id
        ),
        (510, Some(9), Some(0))
    );
    assert_eq!(
        busy.mig_parent_device().unwrap().uuid().unwrap(),
        parent.uuid().unwrap()
    );
    // The parent's list is the aggregate over its instances.
    let aggregate = parent.running_compute_processes().unwrap();
    assert_eq!(aggregate.iter().map(|p| p.pid).collect::<Vec<_>>(), [510]);
    // Past the devices but below the maximum: nothing there; at the maximum: wrong.
    assert!(matches!(
        parent.mig_device_by_index(2),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        parent.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn a_gpu_without_mig_says_so() {
    let fake = Fake::new("mig-none", &machine(vec![gpu(0)]));
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();
    assert!(matches!(device.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        device.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn mig_instance_ids_and_errors_come_through_raw_calls() {
    let mut scenario = mig_machine();
    scenario["gpus"][0]["errors"]["nvmlDeviceGetComputeRunningProcesses_v3"] =
        json!("NoPermission");
    scenario["gpus"][0]["mig"]["devices"][0]["errors"]["nvmlDeviceGetComputeRunningProcesses_v3"] =
        json!("NoPermission");
    let fake = Fake::new("mig-raw", &scenario);
    let nvml = fake.nvml();
    let parent = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        parent.running_compute_processes(),
        Err(NvmlError::NoPermission)
    ));
    let denied = parent.mig_device_by_index(0).unwrap();
    assert!(matches!(
        denied.running_compute_processes(),
        Err(NvmlError::NoPermission)
    ));
    assert_eq!(denied.memory_info().unwrap().used, 0);
    let open = parent.mig_device_by_index(1).unwrap();
    assert_eq!(open.running_compute_processes().unwrap().len(), 1);
    let lib = unsafe { NvmlLib::new(library()) }.unwrap();
    unsafe {
        let (mut gi, mut ci) = (0, 0);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceId(open.handle(), &mut gi),
            nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(
            lib.nvmlDeviceGetComputeInstanceId(open.handle(), &mut ci),
            nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!((gi, ci), (9, 0));
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceId(parent.handle(), &mut gi),
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
    }
    // Disabling MIG takes the instances away; their old handles go stale.
    let stale = unsafe { open.handle() };
    scenario["gpus"][0]["mig"]["current"] = json!(false);
    fake.write(&scenario);
    assert_eq!(parent.mig_mode().unwrap().current, 0);
    assert!(matches!(
        parent.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    let mut used = 0;
    let stale = unsafe { lib.nvmlDeviceIsMigDeviceHandle(stale, &mut used) };
    assert_eq!(stale, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
}
