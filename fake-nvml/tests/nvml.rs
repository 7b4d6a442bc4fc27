//! Loads the built library through nvml-wrapper, exactly as the exporter does.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use std::{env, fs, process};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{MemoryInfo, ProcessInfo};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use serde_json::{json, Value};

/// Serialises the tests: the fake reads its configuration from the process environment.
static ENV: Mutex<()> = Mutex::new(());

/// The library cargo built next to this test binary.
fn library() -> PathBuf {
    let exe = env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [deps, deps.parent().expect("profile folder")]
        .iter()
        .map(|dir| dir.join("libfake_nvml.so"))
        .find(|lib| lib.exists())
        .expect("libfake_nvml.so is built along with the tests")
}

/// One test's scenario file and call log, holding the environment for the test's duration.
struct Fake {
    dir: PathBuf,
    _env: MutexGuard<'static, ()>,
}

impl Fake {
    /// Takes the environment and starts a scenario in a fresh folder.
    fn new(name: &str, scenario: &Value) -> Self {
        let guard = ENV.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = env::temp_dir().join(format!("fake-nvml-{}-{name}", process::id()));
        fs::create_dir_all(&dir).unwrap();
        env::set_var("FAKE_NVML_SCENARIO", dir.join("scenario.json"));
        env::remove_var("FAKE_NVML_CALL_LOG");
        let fake = Self { dir, _env: guard };
        fake.write(scenario);
        fake
    }

    /// Replaces the scenario the way the exporter's tests do: write aside, then rename.
    fn write(&self, scenario: &Value) {
        self.write_raw(&scenario.to_string());
    }

    /// Replaces the scenario with text that need not be valid JSON.
    fn write_raw(&self, text: &str) {
        let tmp = self.dir.join("scenario.json.tmp");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, self.dir.join("scenario.json")).unwrap();
    }

    /// Takes the scenario away, as on a machine without the driver.
    fn remove(&self) {
        fs::remove_file(self.dir.join("scenario.json")).unwrap();
    }

    /// Starts the call log and returns its path.
    fn log_calls(&self) -> PathBuf {
        let log = self.dir.join("calls.log");
        env::set_var("FAKE_NVML_CALL_LOG", &log);
        log
    }

    /// Loads the library as the exporter does.
    fn init(&self) -> Result<Nvml, NvmlError> {
        Nvml::builder().lib_path(library().as_os_str()).init()
    }

    /// Loads the library, expecting success.
    fn nvml(&self) -> Nvml {
        self.init().expect("init")
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A healthy idle H200 at `index`.
fn gpu(index: u32) -> Value {
    json!({
        "uuid": format!("GPU-6f1c2a51-0000-0000-0000-00000000000{index}"),
        "name": "NVIDIA H200",
        "pci_bus_id": format!("00000000:{:02X}:00.0", 0x19 + index),
        "minor": index,
        "memory": { "total": 150_754_820_096_u64, "reserved": 644_939_776, "used": 9_238_806_528_u64 },
    })
}

/// A scenario with these GPUs.
fn machine(gpus: Vec<Value>) -> Value {
    json!({ "driver_version": "580.159.04", "gpus": gpus })
}

/// A process entry; `None` for unknown usage.
fn process(pid: u32, used_bytes: Option<u64>) -> Value {
    json!({ "pid": pid, "used_bytes": used_bytes })
}

/// The fields of a process entry the fake controls.
fn used(info: &ProcessInfo) -> (u32, UsedGpuMemory) {
    (info.pid, info.used_gpu_memory.clone())
}

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
