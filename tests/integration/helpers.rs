//! What every integration test needs: the fake NVML and its scenario, fake device nodes,
//! the real exporter binary on a free port, real child processes as GPU owners, and a
//! small HTTP client and metrics parser.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Once};
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

/// The exporter binary cargo built for these tests.
pub fn exporter_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vram-exporter"))
}

/// The fake NVML cargo built as a dev-dependency.
pub fn fake_nvml_library() -> PathBuf {
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

/// A test's world: a temporary folder with the fake NVML linked as `libnvidia-ml.so.1`,
/// a scenario file, and files standing in for `/dev/nvidia*`.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub scenario: PathBuf,
    pub library: PathBuf,
    pub devices: PathBuf,
}

impl Rig {
    /// A rig with four GPU nodes, the control node and the UVM node.
    pub fn new() -> Rig {
        let dir = tempfile::tempdir().expect("temporary folder");
        let library = dir.path().join("libnvidia-ml.so.1");
        std::os::unix::fs::symlink(fake_nvml_library(), &library).expect("link fake NVML");
        let devices = dir.path().join("dev");
        fs::create_dir(&devices).unwrap();
        for node in [
            "nvidia0",
            "nvidia1",
            "nvidia2",
            "nvidia3",
            "nvidiactl",
            "nvidia-uvm",
        ] {
            // A page, so that model CUDA processes can map it as they map the real node.
            fs::write(devices.join(node), [0u8; 4096]).unwrap();
        }
        let rig = Rig {
            scenario: dir.path().join("scenario.json"),
            dir,
            library,
            devices,
        };
        rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
        rig
    }

    /// Replace the scenario atomically, so the fake never reads half a file.
    pub fn write_scenario(&self, scenario: &Value) {
        let temporary = self.scenario.with_extension("tmp");
        fs::write(&temporary, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
        fs::rename(&temporary, &self.scenario).unwrap();
    }

    /// One GPU with the H200's figures for one 8 GiB owner: `USED` in use, `bytes`
    /// charged to `pid` (`None`: unavailable).
    pub fn charge_gpu0(&self, pid: u32, bytes: Option<u64>) {
        self.write_scenario(
            &Gpus::new()
                .gpu(Gpu::idle(0).used(USED).process(pid, bytes))
                .into_json(),
        );
    }

    /// The stand-in for `/dev/nvidia<minor>`.
    pub fn device(&self, minor: u32) -> PathBuf {
        self.devices.join(format!("nvidia{minor}"))
    }

    /// The stand-in for `/dev/nvidiactl`.
    pub fn control_device(&self) -> PathBuf {
        self.devices.join("nvidiactl")
    }

    /// The device prefix the exporter must use to recognise these files.
    pub fn device_prefix(&self) -> PathBuf {
        self.devices.join("nvidia")
    }

    /// The exporter binary with this rig's NVML, scenario and device prefix.
    pub fn command(&self) -> Command {
        let mut command = Command::new(exporter_binary());
        command
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .arg("--nvml.library")
            .arg(&self.library)
            .arg("--test.device-prefix")
            .arg(self.device_prefix());
        command
    }

    /// Start the exporter on a free loopback port and wait until it serves.
    pub fn start(&self, extra: &[&str]) -> Exporter {
        let mut command = self.command();
        command
            .args(["--web.listen-address", "127.0.0.1:0"])
            .args(extra);
        start(command)
    }

    /// The exporter as a user without the right to read other users' descriptors: run as
    /// `nobody` when the tests run as root, from copies every user may read.
    pub fn unprivileged_command(&self, args: &[&str]) -> Command {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let folder = self.dir.path().join("shared");
        fs::create_dir_all(&folder).unwrap();
        let binary = folder.join("vram-exporter");
        let library = folder.join("libnvidia-ml.so.1");
        copy_for_exec(&exporter_binary(), &binary);
        copy_for_exec(&fake_nvml_library(), &library);
        for (path, mode) in [
            (self.dir.path(), 0o755),
            (folder.as_path(), 0o755),
            (binary.as_path(), 0o755),
            (library.as_path(), 0o644),
            (self.scenario.as_path(), 0o644),
        ] {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        }
        let mut command = Command::new(&binary);
        command
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .arg("--nvml.library")
            .arg(&library)
            .arg("--test.device-prefix")
            .arg(self.device_prefix())
            .args(args);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            command.uid(65534).gid(65534);
        }
        command
    }

    /// Run a one-shot command (`check`, `snapshot`, `textfile`) to completion.
    pub fn run(&self, args: &[&str]) -> Outcome {
        let output = self.command().args(args).output().expect("run exporter");
        Outcome {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// Copy `from` to `to` once, for executing or loading. The copy's write descriptor is
/// close-on-exec, but a process that another test thread forks while the copy is being
/// written holds it until that process calls exec; executing the copy meanwhile fails
/// with ETXTBSY ("Text file busy"). So wait until no process holds it open.
fn copy_for_exec(from: &Path, to: &Path) {
    if to.exists() {
        return;
    }
    let partial = to.with_extension("partial");
    fs::copy(from, &partial).unwrap();
    fs::rename(&partial, to).unwrap();
    wait_until(
        &format!("no process holds {} open", to.display()),
        Duration::from_secs(10),
        || {
            fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
                .all(|pid| !holds(pid, to) && !holds(pid, &partial))
        },
    );
}

/// What a finished command said.
#[derive(Debug)]
pub struct Outcome {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A scenario's GPU list being built.
pub struct Gpus {
    gpus: Vec<Value>,
    init_error: Option<String>,
}

impl Gpus {
    pub fn new() -> Gpus {
        Gpus {
            gpus: Vec::new(),
            init_error: None,
        }
    }

    pub fn gpu(mut self, gpu: Gpu) -> Gpus {
        self.gpus.push(gpu.0);
        self
    }

    pub fn init_error(mut self, error: &str) -> Gpus {
        self.init_error = Some(error.into());
        self
    }

    pub fn into_json(self) -> Value {
        json!({
            "driver_version": "580.159.04",
            "init_error": self.init_error,
            "gpus": self.gpus,
        })
    }
}

/// One GPU of a scenario.
pub struct Gpu(pub Value);

impl Gpu {
    /// An idle H200 with index and minor `index`.
    pub fn idle(index: u32) -> Gpu {
        Gpu(json!({
            "uuid": format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
            "name": "NVIDIA H200",
            "pci_bus_id": format!("00000000:{:02x}:00.0", 0x19 + index),
            "minor": index,
            "memory": { "total": TOTAL, "reserved": RESERVED, "used": 0 },
            "compute_processes": [],
        }))
    }

    /// The UUID `idle(index)` gives.
    pub fn uuid(index: u32) -> String {
        format!("GPU-{index:08x}-0000-4000-8000-000000000000")
    }

    pub fn used(mut self, used: u64) -> Gpu {
        self.0["memory"]["used"] = json!(used);
        self
    }

    /// NVML lists `pid` as a compute process charged `bytes` (`None`: unavailable).
    pub fn process(mut self, pid: u32, bytes: Option<u64>) -> Gpu {
        self.0["compute_processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "pid": pid, "used_bytes": bytes }));
        self
    }

    /// The named NVML call fails with `error` for this GPU.
    pub fn error(mut self, symbol: &str, error: &str) -> Gpu {
        self.0["errors"][symbol] = json!(error);
        self
    }
}

/// A running exporter, killed when dropped.
pub struct Exporter {
    pub child: Child,
    pub address: SocketAddr,
    log: Arc<Mutex<String>>,
}

/// Start an exporter `command` (which listens on port 0) and wait for its address.
pub fn start(command: Command) -> Exporter {
    Exporter::start(command)
}

impl Exporter {
    fn start(mut command: Command) -> Exporter {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start exporter");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (address_sender, address_receiver) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        // Keep draining stderr for the exporter's whole life so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("msg=listening") {
                    if let Some(address) = line
                        .split_whitespace()
                        .find_map(|field| field.strip_prefix("address="))
                    {
                        let _ = address_sender.send(address.parse::<SocketAddr>().unwrap());
                    }
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let address = match address_receiver.recv_timeout(Duration::from_secs(20)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "exporter did not start ({status:?}); its log:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Exporter {
            child,
            address,
            log,
        }
    }

    /// Everything the exporter logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// GET `path` and parse the metrics.
    pub fn scrape(&self) -> Metrics {
        let response = self.get("/metrics");
        assert_eq!(response.status, 200, "scrape failed: {}", response.body);
        Metrics::parse(&response.body)
    }

    /// One request with `method`, `path` and extra header lines.
    pub fn request(&self, method: &str, path: &str, headers: &[&str]) -> Response {
        http(self.address, method, path, headers)
    }

    /// A GET request.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[])
    }

    /// Send SIGTERM and wait for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), libc::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "exporter ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// A minimal HTTP/1.1 client: one request per connection.
pub fn http(address: SocketAddr, method: &str, path: &str, headers: &[&str]) -> Response {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// Parsed Prometheus text: every sample with its labels.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub text: String,
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(parse_sample)
            .collect();
        Metrics {
            text: text.to_string(),
            samples,
        }
    }

    /// Samples of `name` whose labels include all of `labels`.
    pub fn find(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Vec<&(String, BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|(sample, sample_labels, _)| {
                sample == name
                    && labels.iter().all(|(key, value)| {
                        sample_labels.get(*key).map(String::as_str) == Some(*value)
                    })
            })
            .collect()
    }

    /// The value of the one sample of `name` with `labels`; fails if there is not exactly one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.find(name, labels);
        assert_eq!(
            found.len(),
            1,
            "expected one sample {name}{labels:?}, found {}:\n{}",
            found.len(),
            self.text
        );
        found[0].2
    }

    /// Whether any sample of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(sample, _, _)| sample == name)
    }
}

fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (name_and_labels, value) = line.rsplit_once(' ').expect("sample value");
    let value: f64 = value.parse().expect("numeric value");
    let Some((name, labels)) = name_and_labels.split_once('{') else {
        return (name_and_labels.to_string(), BTreeMap::new(), value);
    };
    let labels = labels.strip_suffix('}').expect("closing brace");
    let mut parsed = BTreeMap::new();
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").expect("label");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = 0;
        while let Some((index, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, escaped) = chars.next().expect("escape");
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => {
                    end = index + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        parsed.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end..].trim_start_matches(',');
    }
    (name.to_string(), parsed, value)
}

/// `promtool` from Debian's `prometheus` package; a missing one fails the test with the fix.
pub fn promtool() -> PathBuf {
    require_tool("promtool", "prometheus")
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

/// Run `promtool check metrics` on `text` and fail with its complaints.
pub fn assert_promtool_clean(text: &str) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics complained:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Send `signal` to `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal}) failed");
}

/// The one-letter state of `pid`, or `None` once it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Whether `pid` has `path` open.
pub fn holds(pid: u32, path: &Path) -> bool {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    entries
        .flatten()
        .any(|entry| fs::read_link(entry.path()).is_ok_and(|target| target == path))
}

/// The model processes: a Python program that names itself, opens and maps the files it
/// is told to, then holds them, forks children that inherit them, or lets its main
/// thread exit. A CUDA process opens *and* maps its GPU's node and the control node (a
/// context is shared mappings of both, measured on an H200); an NVML client such as a
/// monitoring agent opens the same nodes and maps nothing.
const MODEL: &str = r#"
import ctypes, json, mmap, os, signal, sys, threading, time
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None)
def rename(name):
    libc.prctl(15, ctypes.c_char_p(name.encode()), 0, 0, 0)
def park():
    while True:
        time.sleep(1000)
if spec["session_leader"]:
    os.setsid()
rename(spec["name"])
kept = []
for path in spec["open"]:
    kept.append(os.open(path, os.O_RDWR))
for path in spec["map"]:
    fd = os.open(path, os.O_RDWR)
    kept.append(fd)
    kept.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
mode = spec["mode"]
if mode == "fork-and-stay":
    # A container's PID 1 and its child, both holding the context.
    for _ in range(spec["children"]):
        if os.fork() == 0:
            park()
    park()
if mode == "hold-then-fork":
    # A live owner first; on SIGUSR1 it becomes the fork-inherited orphan.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    print("READY", os.getpid(), flush=True)
    signal.sigwait([signal.SIGUSR1])
    mode = "fork"
if mode == "fork":
    children = []
    for _ in range(spec["children"]):
        child = os.fork()
        if child == 0:
            rename(spec["child_name"])
            if spec["child_zombie_leader"]:
                threading.Thread(target=park).start()
                libc.pthread_exit(None)
            park()
        children.append(child)
    for child in children:
        print("CHILD", child, flush=True)
    os._exit(0)
print("READY", os.getpid(), flush=True)
if mode == "zombie-leader":
    threading.Thread(target=park).start()
    libc.pthread_exit(None)
park()
"#;

/// The model program, for `python3 -c`.
pub fn model_program() -> &'static str {
    MODEL
}

/// A model process to start (see [`MODEL`]).
#[derive(Clone)]
pub struct Model {
    name: String,
    open: Vec<PathBuf>,
    map: Vec<PathBuf>,
    session_leader: bool,
}

impl Model {
    /// A CUDA process with a context on `device`'s GPU: it opens the GPU node, the
    /// control node and the UVM node, and maps the GPU node and the control node.
    pub fn cuda(name: &str, device: &Path) -> Model {
        Model {
            name: name.into(),
            open: vec![uvm_node(device)],
            map: vec![device.to_path_buf(), control_node(device)],
            session_leader: true,
        }
    }

    /// An NVML client (a monitoring agent, a device plugin): it opens the GPU node, the
    /// control node and the UVM node, and maps nothing.
    pub fn agent(name: &str, device: &Path) -> Model {
        Model {
            name: name.into(),
            open: vec![device.to_path_buf(), control_node(device), uvm_node(device)],
            map: Vec::new(),
            session_leader: true,
        }
    }

    /// Run in the session and process group of this test, as a process started by a
    /// launcher is, rather than leading its own as a job started from a shell does. The
    /// kernel keeps a PID from reuse while it names a live session or group, so only a
    /// dead owner that led neither can see its PID come round again.
    pub fn in_launchers_session(mut self) -> Model {
        self.session_leader = false;
        self
    }

    /// Also open `file` (another GPU's node, as the CUDA runtime opens every visible GPU's).
    pub fn also_opening(mut self, file: &Path) -> Model {
        self.open.push(file.to_path_buf());
        self
    }

    fn spec(&self, mode: &str) -> Value {
        json!({
            "name": self.name,
            "open": self.open,
            "map": self.map,
            "mode": mode,
            "children": 1,
            "child_name": self.name,
            "child_zombie_leader": false,
            "session_leader": self.session_leader,
        })
    }

    /// Its description for the model program, to start it some other way.
    pub fn spec_json(&self) -> String {
        self.spec("hold").to_string()
    }

    /// Its description for a model that forks `children` and then holds its files beside
    /// them (a container's PID 1 and a child), to start it some other way.
    pub fn spec_forking_and_staying(&self, children: usize) -> String {
        let mut spec = self.spec("fork-and-stay");
        spec["children"] = json!(children);
        spec.to_string()
    }

    /// Also map `device` (a context on a second GPU).
    pub fn also_mapping(mut self, device: &Path) -> Model {
        self.map.push(device.to_path_buf());
        self
    }

    fn command(spec: &Value) -> Command {
        let mut command = Command::new("python3");
        command
            .arg("-c")
            .arg(MODEL)
            .arg(spec.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        command
    }

    /// Start it, holding its files, and return once it holds them.
    pub fn spawn(&self) -> Holder {
        self.spawn_with(Self::command(&self.spec("hold")))
    }

    fn spawn_with(&self, mut command: Command) -> Holder {
        let mut child = command
            .spawn()
            .expect("spawn python3 (install it with: apt-get install -y python3)");
        let pid = child.id();
        let line = first_line(&mut child);
        assert_eq!(
            line.trim(),
            format!("READY {pid}"),
            "the model did not start"
        );
        wait_until("the model is asleep", Duration::from_secs(10), || {
            proc_state(pid) == Some('S')
        });
        Holder {
            pid,
            child: Some(child),
        }
    }

    /// Start it as a live owner that forks `children` named `child_name` and exits when
    /// told ([`ForkingOwner::orphan_now`]).
    pub fn spawn_forking_later(&self, children: usize, child_name: &str) -> ForkingOwner {
        let mut spec = self.spec("hold-then-fork");
        spec["children"] = json!(children);
        spec["child_name"] = json!(child_name);
        // Children must reach this process when the owner exits.
        become_subreaper();
        ForkingOwner {
            owner: self.spawn_with(Self::command(&spec)),
            children,
            child_name: child_name.into(),
        }
    }

    /// Start it at exactly `pid` (free, as a reaped process's PID is): how a dead owner's
    /// PID comes round again. `clone3` with `set_tid` asks the kernel for that PID alone,
    /// so no other process of the test run is steered onto it meanwhile (as writing
    /// `/proc/sys/kernel/ns_last_pid` would). Needs root.
    pub fn spawn_at(&self, pid: u32) -> Holder {
        use std::ffi::CString;
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        assert_eq!(
            effective_uid(),
            0,
            "starting a process at a chosen PID (clone3 with set_tid) needs the tests to run as root"
        );
        // Everything the child needs, made before the clone: after it, in a copy of this
        // multithreaded process, only async-signal-safe calls are allowed.
        let program = CString::new(
            require_tool("python3", "python3")
                .into_os_string()
                .into_vec(),
        )
        .unwrap();
        let spec = self.spec("hold").to_string();
        let argv_owned: Vec<CString> = ["python3", "-c", MODEL, spec.as_str()]
            .iter()
            .map(|arg| CString::new(*arg).unwrap())
            .collect();
        let mut argv: Vec<*const libc::c_char> =
            argv_owned.iter().map(|arg| arg.as_ptr()).collect();
        argv.push(std::ptr::null());
        let env_owned: Vec<CString> = std::env::vars_os()
            .map(|(key, value)| {
                let mut pair = key.as_bytes().to_vec();
                pair.push(b'=');
                pair.extend_from_slice(value.as_bytes());
                CString::new(pair).unwrap()
            })
            .collect();
        let mut envp: Vec<*const libc::c_char> =
            env_owned.iter().map(|pair| pair.as_ptr()).collect();
        envp.push(std::ptr::null());
        let mut pipe = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0,
            "pipe2"
        );
        let tid = [pid as libc::pid_t];
        // SAFETY: clone_args is plain data; zero is "not set" for every field we leave.
        let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
        args.exit_signal = libc::SIGCHLD as u64;
        args.set_tid = tid.as_ptr() as u64;
        args.set_tid_size = 1;
        // SAFETY: a fork-like clone (no shared memory); the child below only duplicates a
        // descriptor, execs and exits, all async-signal-safe, on data made before.
        let cloned = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const libc::clone_args,
                std::mem::size_of::<libc::clone_args>(),
            )
        };
        if cloned == 0 {
            // SAFETY: see above.
            unsafe {
                libc::dup2(pipe[1], 1);
                libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
                libc::_exit(127);
            }
        }
        let error = std::io::Error::last_os_error();
        // SAFETY: closing the write end we own; the child has its copy.
        unsafe { libc::close(pipe[1]) };
        assert!(
            cloned == i64::from(pid),
            "could not start a process at PID {pid}: {error}"
        );
        // SAFETY: the read end is ours; File closes it when dropped.
        let mut output = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
        let mut line = Vec::new();
        let mut byte = [0u8];
        while output.read(&mut byte).expect("read the model's output") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        assert_eq!(
            String::from_utf8_lossy(&line),
            format!("READY {pid}"),
            "the model did not start"
        );
        wait_until("the model is asleep", Duration::from_secs(10), || {
            proc_state(pid) == Some('S')
        });
        // Not a std Child: it is reaped with waitpid when dropped, as an adopted one is.
        Holder { pid, child: None }
    }

    /// The fork-inherited orphan: it forks `children` named `child_name` that inherit its
    /// descriptors and mappings, and exits. Returns the dead (and reaped) owner's PID and
    /// the live children, whose parent becomes this test process (a child subreaper).
    pub fn fork_orphan(&self, children: usize, child_name: &str) -> (u32, Vec<Holder>) {
        self.fork(children, child_name, false)
    }

    /// Like [`Model::fork_orphan`] with one child whose main thread then calls
    /// pthread_exit while another thread lives on: state Z, empty `/proc/PID/fd` and
    /// `/proc/PID/maps`, the files and mappings only in the live thread's lists.
    pub fn fork_orphan_with_zombie_leader(&self, child_name: &str) -> (u32, Holder) {
        let (owner, mut children) = self.fork(1, child_name, true);
        let child = children.remove(0);
        wait_until(
            "the child's main thread is a zombie",
            Duration::from_secs(10),
            || proc_state(child.pid) == Some('Z'),
        );
        (owner, child)
    }

    fn fork(&self, children: usize, child_name: &str, zombie_leader: bool) -> (u32, Vec<Holder>) {
        become_subreaper();
        let mut spec = self.spec("fork");
        spec["children"] = json!(children);
        spec["child_name"] = json!(child_name);
        spec["child_zombie_leader"] = json!(zombie_leader);
        let mut owner = Self::command(&spec).spawn().expect("spawn python3");
        let owner_pid = owner.id();
        let mut lines = BufReader::new(owner.stdout.take().unwrap()).lines();
        let pids: Vec<u32> = (0..children)
            .map(|_| {
                let line = lines.next().expect("a CHILD line").expect("read");
                line.strip_prefix("CHILD ")
                    .and_then(|pid| pid.trim().parse().ok())
                    .unwrap_or_else(|| panic!("not a CHILD line: {line}"))
            })
            .collect();
        owner.wait().expect("reap the owner");
        let holders = pids
            .into_iter()
            .map(|pid| {
                wait_until(
                    "the child is named and asleep",
                    Duration::from_secs(10),
                    || {
                        proc_comm(pid).as_deref() == Some(child_name)
                            && matches!(proc_state(pid), Some('S' | 'Z'))
                    },
                );
                Holder { pid, child: None }
            })
            .collect();
        (owner_pid, holders)
    }

    /// Start it and let its main thread exit while another thread lives on with the
    /// files: state Z, an empty `/proc/PID/fd`, the files only in a thread's list.
    pub fn zombie_leader(&self) -> Holder {
        let mut child = Self::command(&self.spec("zombie-leader"))
            .spawn()
            .expect("spawn python3");
        let pid = child.id();
        let line = first_line(&mut child);
        assert_eq!(
            line.trim(),
            format!("READY {pid}"),
            "the model did not start"
        );
        wait_until(
            "the main thread is a zombie",
            Duration::from_secs(10),
            || proc_state(pid) == Some('Z'),
        );
        Holder {
            pid,
            child: Some(child),
        }
    }
}

/// The next line a model prints on its standard output, read byte by byte so that
/// nothing after it is taken from the pipe.
fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = Vec::new();
    let mut byte = [0u8];
    while stdout.read(&mut byte).expect("read the model's output") == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// A live model CUDA owner that becomes a fork-inherited orphan when told to.
pub struct ForkingOwner {
    /// The owner, alive.
    pub owner: Holder,
    children: usize,
    child_name: String,
}

impl ForkingOwner {
    /// Fork the children (they inherit the descriptors and mappings) and exit; returns
    /// the dead (and reaped) owner's PID and the live children.
    pub fn orphan_now(mut self) -> (u32, Vec<Holder>) {
        become_subreaper();
        let pid = self.owner.pid;
        signal(pid, libc::SIGUSR1);
        let mut child = self.owner.child.take().expect("our own child");
        let pids: Vec<u32> = (0..self.children)
            .map(|_| {
                let line = first_line(&mut child);
                line.strip_prefix("CHILD ")
                    .and_then(|pid| pid.trim().parse().ok())
                    .unwrap_or_else(|| panic!("not a CHILD line: {line}"))
            })
            .collect();
        child.wait().expect("reap the owner");
        let children = pids
            .into_iter()
            .map(|child_pid| {
                wait_until(
                    "the child is named and asleep",
                    Duration::from_secs(10),
                    || {
                        proc_comm(child_pid).as_deref() == Some(self.child_name.as_str())
                            && proc_state(child_pid) == Some('S')
                    },
                );
                Holder {
                    pid: child_pid,
                    child: None,
                }
            })
            .collect();
        (pid, children)
    }
}

/// A real process holding a device file, killed and reaped when dropped.
pub struct Holder {
    pub pid: u32,
    child: Option<Child>,
}

impl Holder {
    /// A model CUDA process named `cuda-job` with a context on `device`'s GPU.
    pub fn spawn(device: &Path) -> Holder {
        Model::cuda("cuda-job", device).spawn()
    }

    /// A `sleep` process with just `file` open: a process that never touched a GPU when
    /// `file` is not a device node.
    pub fn opening(file: &Path) -> Holder {
        let child = Command::new("sh")
            .arg("-c")
            .arg("exec 3<\"$1\"; exec sleep 1000")
            .arg("sh")
            .arg(file)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn holder");
        let pid = child.id();
        wait_until(
            "the process has opened its file",
            Duration::from_secs(10),
            || holds(pid, file) && proc_state(pid) == Some('S'),
        );
        Holder {
            pid,
            child: Some(child),
        }
    }

    /// The fork-inherited orphan: a model CUDA process `cuda-job` forks one child,
    /// `dataloader`, that inherits its descriptors and mappings, and exits. Returns the
    /// dead (and reaped) owner's PID and the live child.
    pub fn fork_orphan(device: &Path) -> (u32, Holder) {
        let (owner, mut children) = Model::cuda("cuda-job", device).fork_orphan(1, "dataloader");
        (owner, children.remove(0))
    }

    /// A model CUDA owner `cuda-job` whose main thread called pthread_exit while another
    /// thread lives on with its context: state Z, an empty `/proc/PID/fd`.
    pub fn zombie_main_thread(device: &Path) -> Holder {
        Model::cuda("cuda-job", device).zombie_leader()
    }

    /// Stop it with SIGSTOP and wait until the kernel says so.
    pub fn stop(&self) {
        signal(self.pid, libc::SIGSTOP);
        wait_until("the process is stopped", Duration::from_secs(10), || {
            proc_state(self.pid) == Some('T')
        });
    }

    /// SIGKILL it and reap it.
    pub fn kill(mut self) {
        self.kill_and_reap();
    }

    fn kill_and_reap(&mut self) {
        let _ = unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        match self.child.take() {
            Some(mut child) => {
                let _ = child.wait();
            }
            None => {
                // Our adopted child (we are its subreaper): reap it ourselves.
                // SAFETY: waitpid on a PID we adopted; the status pointer may be null.
                unsafe { libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0) };
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if self.child.is_some() || proc_state(self.pid).is_some() {
            self.kill_and_reap();
        }
    }
}

/// The UVM node beside a GPU node (`nvidia-uvm` in the same folder).
fn uvm_node(device: &Path) -> PathBuf {
    device.with_file_name("nvidia-uvm")
}

/// The control node beside a GPU node (`nvidiactl` in the same folder).
fn control_node(device: &Path) -> PathBuf {
    device.with_file_name("nvidiactl")
}

/// Make this test process adopt orphaned grandchildren, so their parent PID is ours
/// (not init's) and the tests can reap them.
pub fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument.
        let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(result, 0, "prctl(PR_SET_CHILD_SUBREAPER)");
    });
}

/// A PID that no process has: above the kernel's pid_max.
pub fn nonexistent_pid() -> u32 {
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(4_194_304);
    max + 1
}

// Helpers of the holder, check, snapshot and textfile tests.

/// The command name of `pid`, or `None` once it is gone.
pub fn proc_comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|comm| comm.trim_end().to_string())
}

/// The start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
pub fn start_time_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process exists");
    let after_comm = stat.rsplit_once(") ").expect("stat format").1;
    // Fields after the command name start at field 3 (the state).
    after_comm
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|ticks| ticks.parse().ok())
        .expect("start time")
}

/// The effective user id of this test process (the owner of every process it spawns).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The name the host's password file gives `uid`.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.get(2)?.parse::<u32>().ok()? == uid).then(|| fields[0].to_string())
    })
}

impl Outcome {
    /// Standard output parsed as JSON (`check --json`, `snapshot`).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "standard output is not JSON ({error}):\n{}\nstandard error:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl Rig {
    /// The exporter started through a shell that opens `device` and the UVM node beside
    /// it and then execs it: the exporter holds the files itself, as a CUDA process
    /// does. It runs under the name `gpu-watch`, because `vram-exporter` is a known NVML
    /// client that is never called a culprit, which would hide a scan that does not
    /// leave itself out. The process keeps the shell's PID.
    pub fn command_holding(&self, device: &Path) -> Command {
        let renamed = self.dir.path().join("gpu-watch");
        if !renamed.exists() {
            std::os::unix::fs::symlink(exporter_binary(), &renamed).expect("link the binary");
        }
        let mut command = Command::new("sh");
        command
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .env("DEVICE", device)
            .env("UVM", uvm_node(device))
            .arg("-c")
            .arg("exec 5<\"$DEVICE\" 6<\"$UVM\"; exec \"$0\" \"$@\"")
            .arg(renamed)
            .arg("--nvml.library")
            .arg(&self.library)
            .arg("--test.device-prefix")
            .arg(self.device_prefix());
        command
    }

    /// A procfs for `--path.procfs` whose only entry, `self/ns/pid`, is not the host's
    /// `pid:[4026531836]`: an exporter reading it is blind.
    pub fn blind_procfs(&self) -> PathBuf {
        let procfs = self.dir.path().join("proc");
        fs::create_dir_all(procfs.join("self/ns")).unwrap();
        std::os::unix::fs::symlink("pid:[4026532999]", procfs.join("self/ns/pid")).unwrap();
        procfs
    }

    /// Start a one-shot command in the background, collecting its output as it comes.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running::spawn(self.command().args(args))
    }
}

/// A one-shot command still running, whose output is collected line by line, so a test
/// can wait for what it has printed so far.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn spawn(command: &mut Command) -> Running {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the exporter");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect_lines(child.stdout.take().unwrap(), Arc::clone(&stdout)),
            collect_lines(child.stderr.take().unwrap(), Arc::clone(&stderr)),
        ];
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Standard output so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait for the exit (failing after `timeout`) and return everything it printed.
    pub fn finish(mut self, timeout: Duration) -> Outcome {
        let mut status = None;
        wait_until("the command exits", timeout, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        Outcome {
            status: status.unwrap().code(),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn collect_lines(
    stream: impl Read + Send + 'static,
    sink: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    })
}

/// The cells of a row of `check`'s table: columns are separated by at least two spaces.
pub fn columns(row: &str) -> Vec<&str> {
    row.split("  ")
        .map(str::trim)
        .filter(|cell| !cell.is_empty())
        .collect()
}

/// The verdict sentence `check` prints for `gpu` (the line that starts `GPU N: `).
pub fn verdict_line(stdout: &str, gpu: u32) -> &str {
    let prefix = format!("GPU {gpu}: ");
    stdout
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no verdict for GPU {gpu}:\n{stdout}"))
}

/// The process group and session of `pid`, from `/proc/PID/stat`.
pub fn process_group_and_session(pid: u32) -> (u32, u32) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat.rsplit_once(") ").expect("comm").1.split(' ').collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap())
}

// Helpers of the least-privilege, container and bad-input tests.

impl Rig {
    /// The exporter as `nobody` (through util-linux's `setpriv`) holding only
    /// `capabilities` (names as `setpriv` takes them: `sys_ptrace`, `dac_read_search`),
    /// in its effective, inheritable and ambient sets; the tests must run as root.
    pub fn command_as_nobody_with(&self, capabilities: &[&str], args: &[&str]) -> Command {
        assert_eq!(
            effective_uid(),
            0,
            "switching to nobody with chosen capabilities needs the tests to run as root"
        );
        let prepared = self.unprivileged_command(args);
        let setpriv = require_tool("setpriv", "util-linux");
        let mut wanted = String::from("-all");
        for capability in capabilities {
            wanted.push_str(",+");
            wanted.push_str(capability);
        }
        let mut command = Command::new(setpriv);
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps={wanted}"))
            .arg(format!("--ambient-caps={wanted}"))
            .arg(prepared.get_program())
            .args(prepared.get_args());
        for (key, value) in prepared.get_envs() {
            if let Some(value) = value {
                command.env(key, value);
            }
        }
        command
    }
}

/// The PIDs whose parent is `pid`, from every `/proc/PID/stat`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(") ")?.1.to_string();
                    after.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The kernel's `PF_*` flags of `pid` (field 9 of `/proc/PID/stat`), `None` once it is gone.
pub fn task_flags(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(6)?.parse().ok()
}

// Helpers of the MIG and GPU-health tests: MIG devices, what the driver says a GPU
// needs, Xid events, and the capability nodes of MIG instances.

/// Memory of a `1g.18gb` GPU instance of an H200, as NVML reports it (17.8 GiB).
pub const MIG_1G_TOTAL: u64 = 19_092_471_808;

impl Gpu {
    /// MIG enabled (now and after the next reset) with these MIG devices, in index order.
    pub fn mig(mut self, devices: Vec<MigDevice>) -> Gpu {
        let devices: Vec<Value> = devices.into_iter().map(|device| device.0).collect();
        self.0["mig"] = json!({ "current": true, "pending": true, "devices": devices });
        self
    }

    /// MIG supported but disabled, as on a GPU that never had it turned on.
    pub fn mig_disabled(mut self) -> Gpu {
        self.0["mig"] = json!({ "current": false, "pending": false });
        self
    }

    /// The raw `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` value (0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset).
    pub fn recovery_action(mut self, raw: u32) -> Gpu {
        self.0["recovery_action"] = json!(raw);
        self
    }

    /// What `nvmlDeviceGetRemappedRows` answers.
    pub fn remapped_rows(
        mut self,
        correctable: u32,
        uncorrectable: u32,
        pending: bool,
        failure: bool,
    ) -> Gpu {
        self.0["remapped_rows"] = json!({
            "correctable": correctable, "uncorrectable": uncorrectable,
            "pending": pending, "failure": failure,
        });
        self
    }

    /// What the retired-page calls answer.
    pub fn retired_pages(mut self, single_bit: u32, double_bit: u32, pending: bool) -> Gpu {
        self.0["retired_pages"] = json!({
            "multiple_single_bit": single_bit, "double_bit": double_bit, "pending": pending,
        });
        self
    }

    /// The GPU's memory is NUMA node `node`, managed by the operating system.
    pub fn numa_node(mut self, node: u32) -> Gpu {
        self.0["numa_node"] = json!(node);
        self
    }

    /// The named NVML call sleeps `ms` first for this GPU (a hung driver).
    pub fn delay(mut self, symbol: &str, ms: u64) -> Gpu {
        self.0["delays_ms"][symbol] = json!(ms);
        self
    }
}

/// One MIG device of a scenario.
pub struct MigDevice(pub Value);

impl MigDevice {
    /// An idle `1g.18gb` MIG device of GPU `gpu`: GPU instance `gi`, compute instance 0.
    pub fn new(gpu: u32, gi: u32) -> MigDevice {
        MigDevice(json!({
            "uuid": MigDevice::uuid(gpu, gi),
            "name": "NVIDIA H200 MIG 1g.18gb",
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "memory": { "total": MIG_1G_TOTAL, "reserved": 0, "used": 0 },
            "compute_processes": [],
        }))
    }

    /// The UUID `new(gpu, gi)` gives.
    pub fn uuid(gpu: u32, gi: u32) -> String {
        format!("MIG-{gpu:04x}{gi:04x}-0000-4000-8000-000000000000")
    }

    pub fn used(mut self, used: u64) -> MigDevice {
        self.0["memory"]["used"] = json!(used);
        self
    }

    /// NVML lists `pid` as a compute process of this instance charged `bytes`.
    pub fn process(mut self, pid: u32, bytes: Option<u64>) -> MigDevice {
        self.0["compute_processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "pid": pid, "used_bytes": bytes }));
        self
    }

    /// The named NVML call fails with `error` on this MIG device.
    pub fn error(mut self, symbol: &str, error: &str) -> MigDevice {
        self.0["errors"][symbol] = json!(error);
        self
    }
}

/// The process-list calls a caller without privileges is refused on a MIG GPU.
pub const PROCESS_LIST_CALLS: [&str; 3] = [
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
];

/// `scenario` with these critical Xid events, as (sequence number, GPU index, Xid).
pub fn with_xid_events(mut scenario: Value, events: &[(u64, u32, u64)]) -> Value {
    scenario["xid_events"] = events
        .iter()
        .map(|&(seq, gpu, xid)| json!({ "seq": seq, "gpu": gpu, "xid": xid }))
        .collect();
    scenario
}

impl Rig {
    /// The stand-in for `/dev/nvidia-caps/nvidia-cap<minor>`, created on first use.
    pub fn capability(&self, minor: u32) -> PathBuf {
        let folder = self.devices.join("nvidia-caps");
        fs::create_dir_all(&folder).unwrap();
        let node = folder.join(format!("nvidia-cap{minor}"));
        if !node.exists() {
            fs::write(&node, b"").unwrap();
        }
        node
    }

    /// A `mig-minors` table for `--test.mig-minors`, one line per (GPU minor, GPU
    /// instance, compute instance, minor of the GPU instance's node, minor of the
    /// compute instance's node).
    pub fn mig_minors(&self, instances: &[(u32, u32, u32, u32, u32)]) -> PathBuf {
        let mut text = String::from("config 1\nmonitor 2\n");
        for &(gpu, gi, ci, gi_minor, ci_minor) in instances {
            text.push_str(&format!("gpu{gpu}/gi{gi}/access {gi_minor}\n"));
            text.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {ci_minor}\n"));
        }
        let path = self.dir.path().join("mig-minors");
        fs::write(&path, text).unwrap();
        path
    }
}

impl Holder {
    /// A model CUDA process in a MIG instance: it maps `files[0]`, the GPU's node (and the
    /// control node), and holds the rest open, the instance's capability nodes.
    pub fn holding(files: &[&Path]) -> Holder {
        mig_model(files).spawn()
    }

    /// The fork-inherited orphan of such a process: the owner forks a child `dataloader`
    /// that inherits its files and mappings, and exits. Returns the dead (and reaped)
    /// owner's PID and the live child.
    pub fn fork_orphan_holding(files: &[&Path]) -> (u32, Holder) {
        let (owner, mut children) = mig_model(files).fork_orphan(1, "dataloader");
        (owner, children.remove(0))
    }
}

/// A model CUDA process mapping `files[0]` and holding the others open.
fn mig_model(files: &[&Path]) -> Model {
    files[1..]
        .iter()
        .fold(Model::cuda("cuda-job", files[0]), |model, file| {
            model.also_opening(file)
        })
}
