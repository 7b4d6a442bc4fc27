//! docs/fake-nvml.md's scenarios: the example is the shipped one, and the reference
//! scenario is served as described.

use super::{machine, used, Fake};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use std::{env, fs};

/// The JSON blocks of docs/fake-nvml.md, in order.
fn documented_scenarios() -> Vec<String> {
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/fake-nvml.md"));
    let doc = doc.expect("docs/fake-nvml.md");
    doc.split("```json")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_documented_example_is_the_shipped_one_and_healthy_but_for_one_orphan() {
    let blocks = documented_scenarios();
    let shipped = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/healthy-and-orphan.json"),
    )
    .expect("the shipped example scenario");
    let parse = |text: &str| serde_json::from_str::<Value>(text).expect("valid JSON");
    assert_eq!(
        parse(&blocks[0]),
        parse(&shipped),
        "the doc shows the shipped file"
    );

    let fake = Fake::new("doc", &machine(vec![]));
    fake.write_raw(&shipped);
    let nvml = fake.nvml();
    let healthy = nvml.device_by_index(0).unwrap();
    assert_eq!(healthy.memory_info().unwrap().used, 0);
    assert!(healthy.running_compute_processes().unwrap().is_empty());
    let orphan = nvml.device_by_index(1).unwrap();
    let compute = orphan.running_compute_processes().unwrap();
    assert_eq!(
        compute.iter().map(used).collect::<Vec<_>>(),
        [(4_194_304, UsedGpuMemory::Used(9_229_565_952))]
    );
}

#[test]
fn the_documented_reference_scenario_is_served_as_described() {
    let blocks = documented_scenarios();
    let fake = Fake::new("doc-reference", &machine(vec![]));
    fake.write_raw(&blocks[1]);
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();

    let started = Instant::now();
    assert_eq!(device.memory_info().unwrap().used, 9_238_806_528);
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Its file never appears here: the PCI call hangs for its 100 ms.
    let started = Instant::now();
    assert_eq!(device.pci_info().unwrap().bus_id, "00000000:19:00.0");
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert!(matches!(
        device.running_compute_processes(),
        Err(NvmlError::NoPermission)
    ));
    let instance = device.mig_device_by_index(0).unwrap();
    let compute = instance.running_compute_processes().unwrap();
    assert_eq!(
        compute.iter().map(used).collect::<Vec<_>>(),
        [(432, UsedGpuMemory::Used(9_229_565_952))]
    );
}
