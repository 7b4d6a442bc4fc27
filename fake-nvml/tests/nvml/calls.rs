//! How calls are answered: from the scenario as it is now, each logged by its symbol
//! name, and, for what nvml-wrapper does not expose, by NVML's contracts.

use super::{gpu, library, machine, process, Fake};
use nvml_wrapper_sys::bindings::*;
use serde_json::json;
use std::fs;

#[test]
fn a_rewritten_scenario_shows_on_the_next_call() {
    let fake = Fake::new("rewrite", &machine(vec![gpu(0)]));
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();
    assert_eq!(device.memory_info().unwrap().used, 9_238_806_528);
    assert!(device.running_compute_processes().unwrap().is_empty());

    let mut changed = gpu(0);
    changed["memory"]["used"] = json!(1);
    changed["compute_processes"] = json!([process(7, Some(1))]);
    fake.write(&machine(vec![changed, gpu(1)]));
    assert_eq!(device.memory_info().unwrap().used, 1);
    assert_eq!(device.running_compute_processes().unwrap().len(), 1);
    assert_eq!(nvml.device_count().unwrap(), 2);
}

#[test]
fn every_call_is_logged_by_symbol_name() {
    let mut busy = gpu(0);
    busy["compute_processes"] = json!([process(1, None)]);
    let fake = Fake::new("log", &machine(vec![busy]));
    let log = fake.log_calls();
    {
        let nvml = fake.nvml();
        let device = nvml.device_by_index(0).unwrap();
        device.memory_info().unwrap();
        device.running_compute_processes().unwrap();
        device.running_graphics_processes().unwrap();
    }

    let expected = [
        "nvmlInit_v2",
        // nvml-wrapper asks for the driver version inside init.
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetMemoryInfo_v2",
        // Once for the count, once for the list.
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        // An empty list needs only the count.
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlShutdown",
    ];
    assert_eq!(
        fs::read_to_string(log).unwrap().lines().collect::<Vec<_>>(),
        expected
    );
}

/// What nvml-wrapper does not expose, called through its own raw bindings.
#[test]
fn raw_calls_follow_nvml_contracts() {
    let mut busy = gpu(0);
    busy["compute_processes"] = json!([process(1, None), process(2, Some(5)), process(3, Some(6))]);
    let _fake = Fake::new("raw", &machine(vec![busy]));
    let lib = unsafe { NvmlLib::new(library()) }.unwrap();
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
        let mut device: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(0, &mut device),
            nvmlReturn_enum_NVML_SUCCESS
        );

        let mut v1 = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo(device, &mut v1),
            nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(v1.used, 644_939_776 + 9_238_806_528);
        assert_eq!(v1.free, 150_754_820_096 - 644_939_776 - 9_238_806_528);

        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        let mut infos = [empty; 3];
        let mut count = 2;
        let listed =
            lib.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr());
        assert_eq!(
            (listed, count),
            (nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, 3)
        );
        let listed =
            lib.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr());
        assert_eq!((listed, count), (nvmlReturn_enum_NVML_SUCCESS, 3));
        assert_eq!(infos[0].usedGpuMemory, NVML_VALUE_NOT_AVAILABLE as u64);
        assert_eq!(infos[2].gpuInstanceId, 0xFFFF_FFFF);

        let mut short = [0; 8];
        let uuid = lib.nvmlDeviceGetUUID(device, short.as_mut_ptr(), short.len() as u32);
        assert_eq!(uuid, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        let mut minor = 0;
        let stale = lib.nvmlDeviceGetMinorNumber(std::ptr::without_provenance_mut(7), &mut minor);
        assert_eq!(stale, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        let null = lib.nvmlDeviceGetMinorNumber(device, std::ptr::null_mut());
        assert_eq!(null, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);

        let lost =
            std::ffi::CStr::from_ptr(lib.nvmlErrorString(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST));
        assert_eq!(lost.to_str().unwrap(), "GPU is lost");
        assert_eq!(lib.nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
    }
}
