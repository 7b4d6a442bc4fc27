//! Loads the built library through nvml-wrapper, exactly as the exporter does.
//!
//! This module holds the scenario and its helpers; the tests are in `devices.rs`,
//! `faults.rs`, `calls.rs`, `docs.rs` (the documented scenarios), `mig.rs` and
//! `health.rs` (health fields and Xid events).

mod calls;
mod devices;
mod docs;
mod faults;
mod health;
mod mig;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::{env, fs, process};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Nvml;
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
