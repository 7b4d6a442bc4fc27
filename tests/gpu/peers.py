#!/usr/bin/env python3
"""The peer benchmark: vram-exporter beside the exporters people would pick instead, on
one NVIDIA GPU, in one run, so every figure of the table comes from the same GPU, the
same load and the same minute.

    python3 tests/gpu/peers.py --binary target/release/vram-exporter --out DIR

DIR/peers.md is kept whole in its day's folder of benches/runs/; docs/benchmarks.md
quotes the latest run's figures.

Side by side it starts vram-exporter (--binary), nvitop-exporter (installed from the
wheels in PEERS/whl with `pip install --no-index --no-deps --target` into a temporary
folder, run with PYTHONPATH: the GPU host needs no network), all-smi's API mode
(PEERS/bin/all-smi, with PEERS/lib on LD_LIBRARY_PATH for its libdrm) and times the
`nvidia-smi` query pair that nvidia_gpu_exporter runs per scrape. PEERS is `.peers` at
the repository root unless --peers says otherwise.

With one live PyTorch owner holding --owner-gib GiB (the GPU suite's owner, from run.py)
it measures, for each exporter:
- whether it collects on each scrape or in the background (its CPU while nobody scrapes
  it for --idle seconds, against its CPU while scraped);
- its CPU per second while all of them are scraped once a second at the same time for
  --duration seconds (utime + stime from /proc/PID/stat, and the threads' on-CPU time
  from /proc/PID/task/*/schedstat, which has nanosecond resolution), and that figure's
  ratio to vram-exporter's;
- its resident memory (VmRSS, and the peak VmHWM) after that;
- scrape latency p50/p90/p99 over one kept-alive connection, one exporter at a time
  (--scrapes scrapes; whether the exporter kept the connection alive is recorded).
Then a fork orphan (an owner allocates, forks a child that inherits its context, and
exits): what each exporter reports about the dead PID, its live child and the memory.

It writes peers.json (every figure, the versions, the GPU, driver and kernel) and
peers.md (the tables, the orphan excerpts and the command line) to --out, and each
exporter's log. A peer that cannot start, or stops answering, is named in both files
and on stderr; the others are still measured, and the exit status is 1. It takes about
two minutes with the defaults. It never resets the GPU or changes its settings, and
kills everything it started, however it ends.
"""

import argparse
import glob
import http.client
import importlib.util
import json
import math
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The GPU suite's owners, process handling and NVML queries; run.py does nothing on import.
_spec = importlib.util.spec_from_file_location("gpu_suite", os.path.join(HERE, "run.py"))
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
MiB = 1 << 20
VRAM = "vram-exporter"
NVITOP = "nvitop-exporter"
ALL_SMI = "all-smi"
SMI_PAIR = "nvidia-smi pair"
# Labels that place a series on a GPU or a host; what is left says something about a process.
PLACE_LABELS = {"hostname", "instance", "index", "uuid", "devicename", "gpu", "gpu_index",
                "gpu_uuid", "gpu_name", "device_uuid", "device_id", "type"}
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


class PeerFailed(Exception):
    """A peer that could not start or stopped answering: the message says why."""


# --- reading a process from /proc ---------------------------------------------------

def cpu_ms(pid):
    """utime + stime of every thread of `pid`, in ms (clock-tick resolution)."""
    return suite.cpu_ticks(pid) * TICK_MS


def on_cpu_ms(pid):
    """Time the live threads of `pid` spent on a CPU (schedstat), in ms; threads that
    ended are not counted, so it is a floor."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e6


def status_kib(pid, key):
    """A `kB` line of /proc/PID/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def samples(body):
    """(name, labels, value) of every sample of a Prometheus text body."""
    found = []
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        found.append((match.group(1), dict(LABEL.findall(match.group(2) or "")), value, line))
    return found


def percentile(sorted_values, fraction):
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[max(0, math.ceil(fraction * len(sorted_values)) - 1)]


def latency_figures(seconds):
    ms = sorted(s * 1e3 for s in seconds)
    return dict(n=len(ms), p50_ms=round(percentile(ms, 0.5), 3), p90_ms=round(percentile(ms, 0.9), 3),
                p99_ms=round(percentile(ms, 0.99), 3), max_ms=round(ms[-1], 3))


# --- the exporters ------------------------------------------------------------------

class Peer:
    """One exporter under test: started in its own session, scraped over one kept-alive
    connection, measured from /proc. `error` is set once it failed; it is then left out
    of every later phase."""

    def __init__(self, name, label, argv, env, out):
        self.name = name
        self.label = label  # what the table adds to its version: the mode it runs in
        self.env = env
        self.port = suite.free_port()
        self.argv = [part.replace("{PORT}", str(self.port)) for part in argv]
        self.log_path = os.path.join(out, f"{name}.log")
        self.proc = None
        self.conn = None
        self.error = None
        self.kept_alive = True
        self.reconnects = 0
        self.figures = {}

    def fail(self, why):
        if self.error is None:
            self.error = why
            print(f"peers: {self.name} failed: {why}", file=sys.stderr, flush=True)

    def start(self, spawned):
        try:
            with open(self.log_path, "w") as log:
                self.proc = spawned.add(subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=self.env), group=True)
        except OSError as error:
            self.fail(f"cannot run {self.argv[0]}: {error}")

    def log_tail(self, limit=600):
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return " ".join(text[-limit:].split())

    def wait_ready(self, limit):
        """Poll /metrics until it answers 200 with a body; the startup time in s."""
        started = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise PeerFailed(f"exited with status {self.proc.returncode} before serving; "
                                 f"its log ends: {self.log_tail()!r}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/metrics")
                response = conn.getresponse()
                body = response.read()
                conn.close()
                if response.status == 200 and body:
                    return time.monotonic() - started
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() - started > limit:
                raise PeerFailed(f"not serving /metrics on port {self.port} after {limit} s; "
                                 f"its log ends: {self.log_tail()!r}")
            time.sleep(0.1)

    def scrape(self):
        """One GET /metrics on the kept-alive connection: (body, seconds). An exporter
        that closes the connection after each answer gets a new one per scrape (as
        Prometheus would), and `kept_alive` turns False."""
        reused = self.conn is not None
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        started = time.perf_counter()
        try:
            try:
                self.conn.request("GET", "/metrics")
                response = self.conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A server may close a connection that sat idle (vram-exporter after 10 s
                # without a request); Prometheus's client then asks again on a new one,
                # and so does this one, once.
                if not reused:
                    raise
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.reconnects += 1
                started = time.perf_counter()
                self.conn.request("GET", "/metrics")
                response = self.conn.getresponse()
                body = response.read()
        except (OSError, http.client.HTTPException) as error:
            self.conn.close()
            self.conn = None
            alive = self.proc.poll() is None
            raise PeerFailed(f"scrape failed: {type(error).__name__}: {error}"
                             + ("" if alive else f"; it exited with status {self.proc.returncode}, "
                                                  f"its log ends: {self.log_tail()!r}"))
        took = time.perf_counter() - started
        if response.status != 200:
            raise PeerFailed(f"/metrics answered {response.status}")
        if response.will_close:
            self.kept_alive = False
        return body.decode(errors="replace"), took

    def stop(self):
        if self.conn is not None:
            self.conn.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


def install_nvitop(wheels, target):
    """Install the carried wheels into `target` without the network; None, or why not."""
    found = sorted(glob.glob(os.path.join(wheels, "*.whl")))
    if not found:
        return f"no wheels in {shown_path(wheels)}"
    # --no-deps: dependencies the Python already has (psutil, prometheus_client) need no
    # wheel; what is still missing shows as an import error below, by name.
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                             "--disable-pip-version-check", "--quiet", "--target", target, *found],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        return f"pip install of {len(found)} wheels failed: {' '.join(result.stderr.split())[-400:]}"
    return None


def nvitop_import_error(env):
    """Why nvitop-exporter cannot be imported with `env`, or None."""
    probe = ("import importlib, sys\n"
             "missing = []\n"
             "for name in ('psutil', 'prometheus_client', 'pynvml', 'nvitop', 'nvitop_exporter'):\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except Exception as error:\n"
             "        missing.append(f'{name} ({type(error).__name__}: {error})')\n"
             "print('; '.join(missing))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=env, timeout=60)
    missing = result.stdout.strip() or result.stderr.strip()[-300:]
    if result.returncode == 0 and not missing:
        return None
    return f"cannot import {missing}: carry the missing packages' wheels in the wheels folder"


def version_of(argv, env):
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    except OSError as error:
        return f"unknown ({error})"
    return (result.stdout.strip() or result.stderr.strip() or "unknown").splitlines()[0]


def make_peers(args, gpu, out, wheel_dir):
    """The three exporters, not started; a peer whose parts are missing is already failed."""
    peers_dir = os.path.abspath(args.peers)
    vram = Peer(VRAM, "",
                [args.binary, "--web.listen-address", "127.0.0.1:{PORT}", *gpu.exporter_args()],
                gpu.env(), out)
    vram.version_argv = [args.binary, "--version"]

    nvitop_env = gpu.env()
    nvitop_env["PYTHONPATH"] = os.pathsep.join(p for p in (wheel_dir, nvitop_env.get("PYTHONPATH")) if p)
    nvitop = Peer(NVITOP, "",
                  [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1",
                   "--port", "{PORT}", "--interval", "1"], nvitop_env, out)
    nvitop.version_argv = [sys.executable, "-m", "nvitop_exporter", "--version"]
    why = install_nvitop(os.path.join(peers_dir, "whl"), wheel_dir) or nvitop_import_error(nvitop_env)
    if why:
        nvitop.fail(why)

    all_smi_env = gpu.env()
    all_smi_env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (os.path.join(peers_dir, "lib"), all_smi_env.get("LD_LIBRARY_PATH")) if p)
    all_smi_binary = os.path.join(peers_dir, "bin", "all-smi")
    all_smi = Peer(ALL_SMI, "`api --interval 1 --processes`",
                   [all_smi_binary, "api", "--interval", "1", "--processes", "--port", "{PORT}"],
                   all_smi_env, out)
    all_smi.version_argv = [all_smi_binary, "--version"]
    if not os.access(all_smi_binary, os.X_OK):
        all_smi.fail(f"no executable all-smi in {shown_path(os.path.join(peers_dir, 'bin'))}")
    return [vram, nvitop, all_smi]


def live(peers):
    return [peer for peer in peers if peer.error is None]


def scrape_all(peers):
    """Scrape each live peer once; one that fails is failed and left out from then on."""
    for peer in live(peers):
        try:
            peer.scrape()
        except PeerFailed as error:
            peer.fail(str(error))


def meters(peer):
    pid = peer.proc.pid
    return cpu_ms(pid), on_cpu_ms(pid)


def at_one_hz(peers, seconds):
    """Scrape every live peer once a second for `seconds`; the wall time it took."""
    started = time.monotonic()
    for tick in range(int(seconds)):
        scrape_all(peers)
        time.sleep(max(0.0, started + tick + 1 - time.monotonic()))
    return time.monotonic() - started


def measure_cpu(peers, seconds, scraped):
    """CPU per second of every live peer over `seconds`, scraped at 1 Hz or left alone."""
    before = {peer.name: meters(peer) for peer in live(peers)}
    started = time.monotonic()
    if scraped:
        at_one_hz(peers, seconds)
    else:
        time.sleep(seconds)  # the measurement window itself: nothing to wait for
    wall = time.monotonic() - started
    figures = {}
    for peer in live(peers):
        ticks, on_cpu = meters(peer)
        figures[peer.name] = dict(
            wall_s=round(wall, 2),
            cpu_ms_per_s=round((ticks - before[peer.name][0]) / wall, 3),
            on_cpu_ms_per_s=round((on_cpu - before[peer.name][1]) / wall, 3))
    return figures


def latency(peer, scrapes, warmup=10):
    """Scrape latency over one connection, and how often two scrapes in a row, a
    millisecond or so apart, got the same body: an exporter that collects on each scrape
    answers anew (vram-exporter's own scrape duration changes every time), one that
    serves a cache gives the same answer until its next collection."""
    for _ in range(warmup):
        peer.scrape()
    times = []
    bodies = []
    for _ in range(scrapes):
        body, took = peer.scrape()
        times.append(took)
        bodies.append(body)
    same = sum(1 for a, b in zip(bodies, bodies[1:]) if a == b) / (len(bodies) - 1)
    figures = latency_figures(times)
    figures.update(body_bytes=len(bodies[-1].encode()), series=len(samples(bodies[-1])),
                   kept_alive=peer.kept_alive, reconnects_after_idle=peer.reconnects, same_body_in_a_row=round(same, 3),
                   collects="in the background, serves a cache" if same > 0.5 else "on each scrape")
    return figures


def smi_pair(gpu, runs):
    """Latency of nvidia_gpu_exporter's per-scrape work and the CPU it costs (the
    nvidia-smi children's, from getrusage): at 1 Hz its CPU per second."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        gpu.nvidia_smi_pair()
        times.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3 / runs
    figures = latency_figures(times)
    figures["cpu_ms_per_scrape"] = round(cpu, 3)
    return figures


# --- the fork orphan ----------------------------------------------------------------

def number(value):
    """A sample's value as its exporter would print a count or a byte figure."""
    return str(int(value)) if value == int(value) and abs(value) < 1e18 else f"{value:g}"


def own_labels(labels):
    """A series' labels that say something about it, not where it is."""
    return ",".join(f'{k}="{v}"' for k, v in labels.items() if k not in PLACE_LABELS)


def orphan_story(body, dead, child):
    """What one body says about the dead owner, its live child and orphaned memory."""
    found = samples(body)

    def about(pid):
        return [(name, labels, value, line) for name, labels, value, line in found
                if labels.get("pid") == str(pid)]

    def words(series):
        if not series:
            gone = [f"{name}{{{own_labels(labels)}}} {number(value)}" for name, labels, value, _ in found
                    if value > 0 and ("gone" in name or "gone" in labels.values())]
            return f"not by PID; counted in {'; '.join(gone[:2])}" if gone else "not listed"
        # The series that says how much memory the PID holds, else the first one.
        pick = next((one for one in series if "gpu_memory" in one[0] and "util" not in one[0]
                     or one[0].endswith("memory_used_bytes") or one[0] == "vram_holder_info"),
                    series[0])
        labels = {}  # what every series of the PID says about it, the first word kept
        for _, their, _, _ in [pick] + series:
            for k, v in their.items():
                if k not in PLACE_LABELS and k != "pid":
                    labels.setdefault(k, v)
        filled = [f'{k}="{v}"' for k, v in labels.items() if v][:5]
        empty = [k for k, v in labels.items() if not v]
        shown = ", ".join(filled + ([f"empty: {', '.join(empty[:4])}" + (", ..." if len(empty) > 4 else "")]
                                    if empty else []))
        return f"`{pick[0]} {number(pick[2])}`" + (f" ({shown})" if shown else "") + (
            f", in {len(series)} series" if len(series) > 1 else "")

    orphaned = [f"{name}{{{own_labels(labels)}}} {number(value)}" for name, labels, value, _ in found
                if "orphan" in name and value > 0]
    memory = [line for name, _, _, line in found
              if re.search(r"(gpu_memory_used|^vram_used_bytes$)", name)
              and "process" not in name][:2]
    excerpt = [line for name, labels, value, line in found
               if labels.get("pid") in (str(dead), str(child))
               or ("orphan" in name and value > 0) or name == "vram_holder_processes"
               or (value > 0 and ("gone" in name or "gone" in labels.values()))]
    return dict(
        dead_pid=words(about(dead)),
        child=words(about(child)),
        orphaned="; ".join(orphaned[:3]) or "not reported",
        excerpt=[line[:240] for line in (excerpt[:14] + memory)],
    )


def shows_orphan(body, dead):
    """Whether a body already reflects the orphan: vram-exporter's orphaned bytes, or any
    peer's series for the dead PID."""
    for name, labels, value, _ in samples(body):
        if labels.get("pid") == str(dead) or ("orphan" in name and value > 0):
            return True
    return False


def orphan_episode(s, peers, gib, binary, limit):
    s_owner = s.owner("fork", gib * suite.GiB)
    s_owner.proc.wait(timeout=60)
    dead, child = s_owner.proc.pid, s_owner.children[0]
    s.spawned.add_pid(child)
    suite.wait_for("NVML to list the dead owner", lambda: dead in s.charges(), limit=60)
    episode = dict(dead_pid=dead, child_pid=child, nvml_charge_bytes=s.charges()[dead],
                   nvml_used_bytes=s.used(), exporters={})
    # Each peer gets until `limit` to show it (a cache refreshes on its own interval);
    # one that never does is recorded as it then is.
    for peer in live(peers):
        started = time.monotonic()
        try:
            while True:
                body, _ = peer.scrape()
                if shows_orphan(body, dead) or time.monotonic() - started > limit:
                    break
                time.sleep(0.2)
        except PeerFailed as error:
            peer.fail(str(error))
            continue
        story = orphan_story(body, dead, child)
        story["seconds_until_shown"] = (round(time.monotonic() - started, 2)
                                        if shows_orphan(body, dead) else None)
        episode["exporters"][peer.name] = story
        suite.write_capped(os.path.join(s.out, f"orphan-{peer.name}.prom"), body)
        # The table is published as evidence: vram-exporter missing the orphan it exists to
        # report fails the run rather than sitting in a row.
        if peer.name == VRAM and story["seconds_until_shown"] is None:
            peer.fail(f"did not report the orphan of dead PID {dead} within {limit} s")
    check = subprocess.run([binary, "check", *s.gpu.exporter_args()], capture_output=True,
                           text=True, timeout=90, env=s.gpu.env())
    episode["check"] = dict(exit=check.returncode, stdout=check.stdout[-3000:])
    vram = next((peer for peer in peers if peer.name == VRAM), None)
    if vram and check.returncode != 1:
        vram.fail(f"check exited {check.returncode} during the orphan, not 1 (orphaned)")
    return episode


# --- the machine --------------------------------------------------------------------

def machine():
    facts = dict(kernel=os.uname().release, cpus=os.cpu_count(), python=sys.version.split()[0],
                 date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()))
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60).stdout.strip().splitlines()
        name, memory, driver = [part.strip() for part in out[0].split(",")]
        facts.update(gpu=name, gpu_memory=memory, driver=driver, gpus=len(out))
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        facts.update(gpu="unknown", gpu_memory="unknown", driver="unknown", gpus=None)
    return facts


def shown_path(path):
    """A path as peers.md shows it: relative to the checkout when inside it, DIR when it
    is some other absolute path of this host (peers.md is kept in benches/runs/)."""
    if not os.path.isabs(path):
        return path
    inside = os.path.relpath(path, ROOT)
    return "DIR" if inside.startswith("..") else inside


def shown_command(argv):
    """The command line as peers.md shows it."""
    return shlex.join(["python3", "tests/gpu/peers.py", *map(shown_path, argv)])


# --- peers.md -----------------------------------------------------------------------

def cell(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def render(result):
    m, run = result["machine"], result["run"]
    lines = [
        f"Measured on {m['date_utc']} UTC: {m['gpu']} ({m['gpu_memory']}), driver {m['driver']}, "
        f"kernel {m['kernel']}, {m['cpus']} CPUs; one live PyTorch owner holding "
        f"{run['owner_gib']} GiB (NVML charges it {result.get('owner_charge_bytes', 0):,} bytes). "
        f"The exporters ran side by side, each scraped once a second for {run['duration_s']} s at "
        f"the same time; then {run['scrapes']} scrapes of each, one exporter at a time, on one "
        "connection; then a fork orphan.",
        "",
        "```sh",
        result["command"],
        "```",
        "",
        "| exporter | collects | CPU ms per s at 1 Hz (utime+stime) | on-CPU ms per s (schedstat) "
        "| x vram-exporter | CPU ms per s, not scraped | scrape p50 / p90 / p99 ms | keep-alive "
        "| RSS (peak) MiB | series |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for name, peer in result["exporters"].items():
        version = peer.get("version") or name
        label = f"{version if version.startswith(name) else f'{name} ({version})'} {peer['label']}".strip()
        busy, idle, lat = peer.get("busy"), peer.get("idle"), peer.get("latency")
        cols = [
            lat["collects"] if lat else "-",
            cell(busy and busy["cpu_ms_per_s"]), cell(busy and busy["on_cpu_ms_per_s"], 3),
            "1" if name == VRAM and busy else (f"{peer['ratio']:.1f}" if peer.get("ratio") else "-"),
            cell(idle and idle["on_cpu_ms_per_s"], 3),
            f"{lat['p50_ms']:.2f} / {lat['p90_ms']:.2f} / {lat['p99_ms']:.2f}" if lat else "-",
            ("yes" if lat["kept_alive"] else "no: new connection per scrape") if lat else "-",
            f"{peer['rss_kib'] / 1024:.1f} ({peer['hwm_kib'] / 1024:.1f})" if peer.get("rss_kib") else "-",
            str(lat["series"]) if lat else "-",
        ]
        if peer.get("error"):
            cols[0] = f"**failed**: {peer['error'][:300]}" + ("; figures up to then" if busy else "")
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    smi = result.get("nvidia_smi_pair")
    if smi and not smi.get("error"):
        ratio = smi.get("ratio")
        lines.append(
            f"| `nvidia-smi` query pair (what nvidia_gpu_exporter runs per scrape) | on each scrape "
            f"| {smi['cpu_ms_per_scrape']:.2f} | - | {f'{ratio:.1f}' if ratio else '-'} | 0 "
            f"| {smi['p50_ms']:.1f} / {smi['p90_ms']:.1f} / {smi['p99_ms']:.1f} | - | - | - |")
    elif smi:
        lines.append(f"| `nvidia-smi` query pair | **failed**: {smi['error'][:300]} | | | | | | | | |")
    lines += [
        "",
        "\"Collects\": an exporter whose back-to-back scrapes got the same body more often than "
        "not serves a cache; \"not scraped\" is its CPU while nobody scraped it for "
        f"{run['idle_s']} s. utime+stime counts in {TICK_MS:.0f} ms ticks ({TICK_MS / run['duration_s']:.2f} ms "
        "per s over the run); schedstat counts nanoseconds of the live threads, and the ratio to "
        "vram-exporter uses it. The nvidia-smi row's CPU is its children's (`getrusage`) per pair, "
        f"so per second at 1 Hz; its latency is {smi['n'] if smi and not smi.get('error') else '-'} "
        "pairs. \"No\" under keep-alive: the exporter closed the connection after each answer, "
        "so every scrape opened a new one, as Prometheus then does.",
    ]
    episode = result.get("orphan")
    if episode:
        lines += [
            "",
            "### During a fork orphan",
            "",
            f"An owner allocated {run['owner_gib']} GiB, forked a child that never touches CUDA "
            f"and exited: NVML charges dead PID {episode['dead_pid']} "
            f"{episode['nvml_charge_bytes']:,} bytes, which its child {episode['child_pid']} keeps "
            "allocated. What each exporter said then:",
            "",
            f"| exporter | dead PID {episode['dead_pid']} | its live child {episode['child_pid']} "
            "| orphaned memory | shown after |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, story in episode["exporters"].items():
            after = story["seconds_until_shown"]
            lines.append(f"| {name} | {story['dead_pid']} | {story['child']} | {story['orphaned']} "
                         f"| {'never, within the wait' if after is None else f'{after:.1f} s'} |")
        for name, story in episode["exporters"].items():
            lines += ["", f"{name}:", "", "```text", *story["excerpt"], "```"]
        check = episode.get("check")
        if check:
            verdict = [line for line in check["stdout"].splitlines() if line.strip()][:12]
            lines += ["", f"`vram-exporter check` (exit {check['exit']}):", "", "```text",
                      *verdict, "```"]
    failed = [name for name, peer in result["exporters"].items() if peer.get("error")]
    if failed:
        lines += ["", f"**Failed in this run:** {', '.join(failed)} (see the table)."]
    return "\n".join(lines) + "\n"


# --- the run ------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/vram-exporter",
                        help="vram-exporter's release binary")
    parser.add_argument("--out", help="folder for peers.json, peers.md and the logs")
    parser.add_argument("--peers", default=os.path.join(ROOT, ".peers"),
                        help="folder holding whl/ (nvitop-exporter's wheels), bin/all-smi and lib/")
    parser.add_argument("--duration", type=int, default=60,
                        help="seconds of 1 Hz scraping over which CPU is measured (10-300)")
    parser.add_argument("--idle", type=int, default=10,
                        help="seconds without scrapes, to tell who collects in the background (3-60)")
    parser.add_argument("--warmup", type=int, default=5, help="seconds of 1 Hz scraping first (0-60)")
    parser.add_argument("--scrapes", type=int, default=200,
                        help="scrapes per exporter for latency (20-2000)")
    parser.add_argument("--smi-runs", type=int, default=20, help="runs of the nvidia-smi pair (1-200)")
    parser.add_argument("--owner-gib", type=int, default=8, help="GiB each owner allocates (1-64)")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out DIR is needed")
    for flag, low, high in (("duration", 10, 300), ("idle", 3, 60), ("warmup", 0, 60),
                            ("scrapes", 20, 2000), ("smi_runs", 1, 200), ("owner_gib", 1, 64)):
        if not low <= getattr(args, flag) <= high:
            parser.error(f"--{flag.replace('_', '-')} must be between {low} and {high}")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"--binary {args.binary}: no executable there (cargo build --release)")
    args.binary = os.path.abspath(args.binary)
    return args


def main(argv=None, gpu=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    gpu = gpu or suite.Gpu()
    s = suite.Suite(args.binary, out, gpu)
    s.scenario = "peers"
    s.spawned = suite.Spawned()
    signal.signal(signal.SIGTERM, suite.interrupt)
    wheel_dir = tempfile.mkdtemp(prefix="vram-peers-")
    started = time.monotonic()
    result = dict(command=shown_command(argv), argv=argv, machine=machine(),
                  run=dict(duration_s=args.duration, idle_s=args.idle, warmup_s=args.warmup,
                           scrapes=args.scrapes, smi_runs=args.smi_runs, owner_gib=args.owner_gib),
                  exporters={})
    peers = []
    problem = None
    try:
        suite.wait_for("an idle GPU", s.idle, limit=60)
        owner = s.owner("hold", args.owner_gib * suite.GiB)
        suite.wait_for("NVML to list the owner", lambda: owner.pid in s.charges(), limit=60)
        result["owner_pid"], result["owner_charge_bytes"] = owner.pid, s.charges()[owner.pid]

        peers = make_peers(args, gpu, out, wheel_dir)
        for peer in live(peers):
            peer.start(s.spawned)
        for peer in live(peers):
            try:
                peer.figures["ready_s"] = round(peer.wait_ready(limit=90), 2)
            except PeerFailed as error:
                peer.fail(str(error))
        for peer in live(peers):
            peer.figures["version"] = version_of(peer.version_argv, peer.env)
        print(f"peers: measuring {', '.join(p.name for p in live(peers)) or 'nothing'}", flush=True)

        at_one_hz(peers, args.warmup)
        idle = measure_cpu(peers, args.idle, scraped=False)
        busy = measure_cpu(peers, args.duration, scraped=True)
        for peer in live(peers):
            pid = peer.proc.pid
            peer.figures.update(idle=idle.get(peer.name), busy=busy.get(peer.name),
                                rss_kib=status_kib(pid, "VmRSS"), hwm_kib=status_kib(pid, "VmHWM"))
        for peer in live(peers):
            try:
                peer.figures["latency"] = latency(peer, args.scrapes)
            except PeerFailed as error:
                peer.fail(str(error))
        try:
            result["nvidia_smi_pair"] = smi_pair(gpu, args.smi_runs)
        except (OSError, subprocess.CalledProcessError) as error:
            result["nvidia_smi_pair"] = dict(error=f"{type(error).__name__}: {error}")
            print(f"peers: the nvidia-smi pair failed: {error}", file=sys.stderr, flush=True)
        print("peers: the fork orphan", flush=True)
        result["orphan"] = orphan_episode(s, peers, args.owner_gib, args.binary, limit=10)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - written down below
        traceback.print_exc()
        problem = f"{type(error).__name__}: {error}"
    finally:
        for peer in peers:
            peer.stop()
        s.spawned.kill_all()
        gpu.close()
        shutil.rmtree(wheel_dir, ignore_errors=True)
        for peer in peers:
            result["exporters"][peer.name] = dict(peer.figures, label=peer.label, error=peer.error)
        ratios(result)
        result["total_s"] = round(time.monotonic() - started, 1)
        if problem:
            result["stopped_by"] = problem
        suite.write_capped(os.path.join(out, "peers.json"), json.dumps(result, indent=2, default=str))
        suite.write_capped(os.path.join(out, "peers.md"), render(result)
                           + (f"\n**The run stopped early:** {problem}\n" if problem else ""))
        print(f"peers: wrote peers.json and peers.md in {result['total_s']} s", flush=True)
    if problem:
        print(f"peers: stopped early: {problem}", file=sys.stderr)
        return 2
    failed = [peer.name for peer in peers if peer.error]
    if "error" in (result.get("nvidia_smi_pair") or {}):
        failed.append(SMI_PAIR)
    if failed:
        print(f"peers: failed: {', '.join(failed)} (the others were measured)", file=sys.stderr)
    return 1 if failed else 0


def ratios(result):
    """Each peer's CPU per second over vram-exporter's, in the same run (schedstat when it
    counted anything, else utime+stime)."""
    vram = (result["exporters"].get(VRAM) or {}).get("busy")
    if not vram:
        return
    key = "on_cpu_ms_per_s" if vram["on_cpu_ms_per_s"] > 0 else "cpu_ms_per_s"
    if vram[key] <= 0:
        return
    for name, peer in result["exporters"].items():
        if name != VRAM and peer.get("busy"):
            peer["ratio"] = round(peer["busy"][key] / vram[key], 1)
            if vram["cpu_ms_per_s"] > 0:
                peer["ratio_utime_stime"] = round(peer["busy"]["cpu_ms_per_s"] / vram["cpu_ms_per_s"], 1)
    smi = result.get("nvidia_smi_pair")
    if smi and "cpu_ms_per_scrape" in smi:
        smi["ratio"] = round(smi["cpu_ms_per_scrape"] / vram[key], 1)


if __name__ == "__main__":
    sys.exit(main())
