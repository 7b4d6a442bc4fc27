//! What every integration test needs: the fake NVML and its scenario, fake device nodes,
//! the real exporter binary on a free port, real child processes as GPU owners, and a
//! small HTTP client and metrics parser. Tests take it all with `use crate::helpers::*`
//! (the integration tests' crate names this crate `helpers`); the benches use some of it.
//! A crate of its own, so that a bench that needs a part of it compiles without the rest
//! being dead code to it.

mod console;
mod exporter;
mod model;
mod namespaces;
mod output;
mod processes;
mod rig;
mod scenario;

pub use console::{
    assert_block_matches, console_blocks, matches_with_elisions, run_as_in_a_terminal, ConsoleBlock,
};
pub use exporter::{
    collect_lines, http, parse_response, request_head, start, Exporter, Outcome, Response, Running,
};
pub use model::{model_program, Model, Mps, Server};
pub use namespaces::OtherNamespaceProcfs;
pub use output::{
    assert_per_gpu_series_carry_no_workload_labels, assert_promtool_clean, columns, kill_line,
    pids_of, promtool, said, suggestion, verdict_line, Metrics, SPARSE_FAMILIES,
};
pub use processes::{
    children_of, effective_uid, holds, nonexistent_pid, proc_comm, proc_state,
    process_group_and_session, signal, start_time_ticks, task_flags, thread_count, user_name,
    Holder, Unreaped,
};
pub use rig::Rig;
pub use scenario::{with_xid_events, Gpu, Gpus, MigDevice, MIG_1G_TOTAL, PROCESS_LIST_CALLS};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bytes the H200 charged one PyTorch process holding an 8 GiB tensor.
pub const CHARGED: u64 = 9_229_565_952;
/// v2 `used` with that one process.
pub const USED: u64 = 9_238_806_528;
/// A gibibyte.
pub const GIB: u64 = 1 << 30;
/// The H200's memory.
pub const TOTAL: u64 = 150_754_820_096;
/// The driver's reservation on an idle H200.
pub const RESERVED: u64 = 644_939_776;

/// The exporter binary cargo built beside the test or bench running now: cargo puts
/// those in `deps/` under the folder of the binaries (as `CARGO_BIN_EXE_*` would say to
/// the test target itself, which this crate is not).
pub fn exporter_binary() -> PathBuf {
    binaries_folder().join("vram-exporter")
}

/// The folder of the binaries cargo built for this profile.
fn binaries_folder() -> PathBuf {
    let running = std::env::current_exe().expect("the test's own path");
    let deps = running.parent().expect("cargo's deps folder");
    deps.parent().expect("cargo's profile folder").to_path_buf()
}

/// The fake NVML cargo built as a dev-dependency, as it was when a test first asked for
/// it: a copy in cargo's scratch folder for tests, taken once per test process. The
/// library cargo builds has no hash in its name, so `cargo build -p fake-nvml` (which
/// `fake_nvml_docs` runs, as the docs say) rewrites it in place, and an exporter loading
/// it meanwhile would find half a file. The copy replaces an older one by a rename, so a
/// process that loaded the older one keeps it whole.
pub fn fake_nvml_library() -> PathBuf {
    static SNAPSHOT: OnceLock<PathBuf> = OnceLock::new();
    SNAPSHOT
        .get_or_init(|| {
            // Cargo's scratch folder for tests (`CARGO_TARGET_TMPDIR`): `tmp` in its
            // target folder.
            let target = binaries_folder();
            let folder = target.parent().expect("cargo's target folder").join("tmp");
            std::fs::create_dir_all(&folder).expect("cargo's scratch folder for tests");
            let snapshot = folder.join("libfake_nvml.so");
            let partial = folder.join(format!("libfake_nvml.so.{}", std::process::id()));
            std::fs::copy(built_fake_nvml_library(), &partial).expect("copy the fake NVML");
            std::fs::rename(&partial, &snapshot).expect("put the fake NVML's copy in place");
            snapshot
        })
        .clone()
}

/// The fake NVML where cargo built it.
fn built_fake_nvml_library() -> PathBuf {
    let folder = exporter_binary()
        .parent()
        .expect("binary folder")
        .to_path_buf();
    for candidate in [
        folder.join("deps/libfake_nvml.so"),
        folder.join("libfake_nvml.so"),
    ] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("libfake_nvml.so is not built; run the tests with `cargo test --workspace`");
}

/// Poll `condition` every 10 ms until it holds, or fail after `timeout` saying `what`.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A program from a Debian package, or a failure naming the install line.
pub fn require_tool(program: &str, package: &str) -> PathBuf {
    for folder in std::env::var("PATH").unwrap_or_default().split(':') {
        let candidate = Path::new(folder).join(program);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{program} is not installed; install it with: apt-get install -y {package}");
}

/// The repository's root: where the documents, charts and deployment files are.
pub fn repository() -> std::path::PathBuf {
    // This crate is `tests/helpers` in it.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .nth(2)
        .expect("the repository")
        .to_path_buf()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a loopback port")
        .port()
}
