//! What the driver says a GPU needs (the health fields, or not supported) and critical
//! Xid events: each delivered once to the sets made before it, to the types a GPU
//! supports.

use super::{gpu, library, machine, Fake};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;
use serde_json::json;
use std::fs;
use std::time::Duration;

#[test]
fn health_fields_answer_or_say_not_supported() {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_ECC_CURRENT, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    };
    let mut reported = gpu(0);
    reported["recovery_action"] = json!(2);
    reported["remapped_rows"] =
        json!({ "correctable": 3, "uncorrectable": 1, "pending": true, "failure": false });
    reported["retired_pages"] =
        json!({ "multiple_single_bit": 2, "double_bit": 1, "pending": true });
    reported["numa_node"] = json!(4);
    let fake = Fake::new("health", &machine(vec![reported, gpu(1)]));
    let nvml = fake.nvml();
    let recovery = FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION);
    let other = FieldId(NVML_FI_DEV_ECC_CURRENT);

    let device = nvml.device_by_index(0).unwrap();
    let values = device
        .field_values_for(&[FieldId(recovery.0), other])
        .unwrap();
    assert!(matches!(
        values[0].as_ref().unwrap().value,
        Ok(SampleValue::U32(2))
    ));
    assert!(matches!(
        values[1].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(device.numa_node_id().unwrap(), 4);
    assert!(device.are_pages_pending_retired().unwrap());
    use nvml_wrapper::enum_wrappers::device::RetirementCause;
    let single = device
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .unwrap();
    assert_eq!(single.len(), 2);
    assert_eq!(
        device
            .retired_pages(RetirementCause::DoubleBitEccError)
            .unwrap()
            .len(),
        1
    );
    let lib = unsafe { NvmlLib::new(library()) }.unwrap();
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0, 0, 0, 0);
    let rows = unsafe {
        lib.nvmlDeviceGetRemappedRows(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    };
    assert_eq!(rows, nvmlReturn_enum_NVML_SUCCESS);
    assert_eq!((corrected, uncorrected, pending, failure), (3, 1, 1, 0));

    // An older driver, or a GPU before Ampere: every one of them is NotSupported.
    let older = nvml.device_by_index(1).unwrap();
    let values = older.field_values_for(&[recovery]).unwrap();
    assert!(matches!(
        values[0].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(older.numa_node_id(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        older.are_pages_pending_retired(),
        Err(NvmlError::NotSupported)
    ));
    let rows = unsafe {
        lib.nvmlDeviceGetRemappedRows(
            older.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    };
    assert_eq!(rows, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
}

#[test]
fn xid_events_are_delivered_once_to_sets_made_before_them() {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let mut scenario = machine(vec![gpu(0), gpu(1)]);
    // Happened before any set existed: never delivered.
    scenario["xid_events"] = json!([{ "seq": 1, "gpu": 0, "xid": 48 }]);
    let fake = Fake::new("events", &scenario);
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();
    assert!(device
        .supported_event_types()
        .unwrap()
        .contains(EventTypes::CRITICAL_XID_ERROR));
    let set = nvml.create_event_set().unwrap();
    let set = device
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    assert!(matches!(set.wait(20), Err(NvmlError::Timeout)));

    scenario["xid_events"] = json!([
        { "seq": 1, "gpu": 0, "xid": 48 },
        { "seq": 2, "gpu": 1, "xid": 31 },
        { "seq": 3, "gpu": 0, "xid": 79 },
        { "seq": 4, "gpu": 0, "xid": 79 },
    ]);
    fake.write(&scenario);
    // GPU 1 is not registered in this set: its event is skipped.
    for _ in 0..2 {
        let event = set.wait(1000).unwrap();
        assert_eq!(event.device.uuid().unwrap(), device.uuid().unwrap());
        assert!(matches!(event.event_data, Some(XidError::Value(79))));
    }
    assert!(matches!(set.wait(20), Err(NvmlError::Timeout)));

    // An event written while a wait is under way ends that wait.
    let writer = {
        let mut later = scenario.clone();
        later["xid_events"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "seq": 5, "gpu": 0, "xid": 94 }));
        let path = fake.dir.join("scenario.json");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let tmp = path.with_extension("later");
            fs::write(&tmp, later.to_string()).unwrap();
            fs::rename(&tmp, &path).unwrap();
        })
    };
    let event = set.wait(5000).unwrap();
    assert!(matches!(event.event_data, Some(XidError::Value(94))));
    writer.join().unwrap();

    // A lost GPU makes the wait fail.
    scenario["gpus"][0]["errors"]["nvmlEventSetWait_v2"] = json!("GpuLost");
    fake.write(&scenario);
    assert!(matches!(set.wait(20), Err(NvmlError::GpuLost)));
    set.release_events().unwrap();
}

#[test]
fn event_registration_follows_the_supported_types() {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let mut quiet = gpu(0);
    quiet["supported_events"] = json!(0);
    let fake = Fake::new("events-unsupported", &machine(vec![quiet]));
    let nvml = fake.nvml();
    let device = nvml.device_by_index(0).unwrap();
    let set = nvml.create_event_set().unwrap();
    let refused = device.register_events(EventTypes::CRITICAL_XID_ERROR, set);
    assert!(matches!(
        refused.map_err(|error| error.error),
        Err(NvmlError::NotSupported)
    ));
}
