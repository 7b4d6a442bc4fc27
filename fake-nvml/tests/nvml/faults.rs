//! The scenario's faults: an error injected into one call of one device, hangs and
//! delays of a device's or the whole library's calls, a hang without an end refused, and
//! init failing as the scenario says.

use super::{gpu, machine, Fake};
use nvml_wrapper::error::NvmlError;
use serde_json::json;
use std::fs;
use std::time::{Duration, Instant};

#[test]
fn injected_errors_hit_one_call_of_one_device() {
    let mut lost = gpu(1);
    lost["errors"] = json!({ "nvmlDeviceGetMemoryInfo_v2": "GpuLost" });
    let fake = Fake::new("errors", &machine(vec![gpu(0), lost]));
    let nvml = fake.nvml();

    assert!(nvml.device_by_index(0).unwrap().memory_info().is_ok());
    let device = nvml.device_by_index(1).unwrap();
    assert!(matches!(device.memory_info(), Err(NvmlError::GpuLost)));
    assert!(device.uuid().is_ok());
}

#[test]
fn a_hang_blocks_one_call_of_one_device_until_its_file_exists() {
    let mut hung = gpu(1);
    let fake = Fake::new("hang", &machine(vec![]));
    let ended = fake.dir.join("hang-ends");
    hung["hangs"] = json!({ "nvmlDeviceGetMemoryInfo_v2": { "until_file": ended } });
    fake.write(&machine(vec![gpu(0), hung]));
    let nvml = fake.nvml();
    std::thread::scope(|scope| {
        let stuck = scope.spawn(|| nvml.device_by_index(1).unwrap().memory_info());
        // Other calls of the hung GPU, and other GPUs, answer meanwhile (NVML may be
        // called from several threads).
        assert!(nvml.device_by_index(0).unwrap().memory_info().is_ok());
        assert!(nvml.device_by_index(1).unwrap().uuid().is_ok());
        // The hang cannot have ended: its file does not exist yet.
        assert!(!stuck.is_finished());
        fs::write(&ended, "").unwrap();
        assert_eq!(stuck.join().unwrap().unwrap().used, 9_238_806_528);
    });
    // A call that starts after the end does not block.
    assert!(nvml.device_by_index(1).unwrap().memory_info().is_ok());
}

#[test]
fn library_calls_hang_for_a_time_and_every_call_can_be_slow() {
    let mut scenario = machine(vec![gpu(0)]);
    scenario["delays_ms"] = json!({ "*": 30 });
    scenario["hangs"] = json!({ "nvmlDeviceGetCount_v2": { "for_ms": 300 } });
    let fake = Fake::new("slow-library", &scenario);
    let nvml = fake.nvml();
    let started = Instant::now();
    assert_eq!(nvml.device_count().unwrap(), 1);
    assert!(started.elapsed() >= Duration::from_millis(330));
    let started = Instant::now();
    nvml.device_by_index(0).unwrap().memory_info().unwrap();
    // Two calls (the handle, then the memory), each slowed.
    assert!(started.elapsed() >= Duration::from_millis(60));

    // A device's own `*` slows every call on that device alone.
    let mut slow = gpu(1);
    slow["delays_ms"] = json!({ "*": 600, "nvmlDeviceGetUUID": 0 });
    fake.write(&machine(vec![gpu(0), slow]));
    let device = nvml.device_by_index(1).unwrap();
    let started = Instant::now();
    device.memory_info().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(600));
    // A call named in the table takes its own entry over `*`.
    let started = Instant::now();
    device.uuid().unwrap();
    assert!(started.elapsed() < Duration::from_millis(600));
}

#[test]
fn a_hang_that_never_ends_is_refused() {
    let mut endless = gpu(0);
    endless["hangs"] = json!({ "nvmlDeviceGetMemoryInfo_v2": {} });
    let fake = Fake::new("endless", &machine(vec![endless]));
    assert!(matches!(fake.init(), Err(NvmlError::DriverNotLoaded)));
}

#[test]
fn init_fails_as_the_scenario_says() {
    let mut scenario = machine(vec![gpu(0)]);
    scenario["init_error"] = json!("LibRmVersionMismatch");
    let fake = Fake::new("init", &scenario);
    assert!(matches!(fake.init(), Err(NvmlError::LibRmVersionMismatch)));

    fake.write_raw("{ not json");
    assert!(matches!(fake.init(), Err(NvmlError::DriverNotLoaded)));
    fake.remove();
    assert!(matches!(fake.init(), Err(NvmlError::DriverNotLoaded)));

    fake.write(&machine(vec![gpu(0)]));
    let nvml = fake.nvml();
    fake.remove();
    assert!(matches!(nvml.device_count(), Err(NvmlError::Unknown)));
}
