#!/usr/bin/env python3
"""The real-GPU suite: run the release binary against a real NVIDIA GPU and real
PyTorch owners, scenario by scenario, and compare what it reports with what NVML says.

Run by hand on a GPU host (never by CI): it needs root (for unshare), PyTorch with
CUDA, and the release binary built elsewhere:

    python3 tests/gpu/run.py --binary target/release/vram-exporter [--out DIR]

It prints one table row per check (scenario, expected, got, pass), writes
results.json (and the exporter's logs) to --out, and exits 1 if any check failed.
It never resets the GPU or changes its settings.
"""

import argparse
import ctypes
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

GiB = 1 << 30
# Every process the suite starts, killed (with its session) however the suite ends.
SPAWNED = []
CHILDREN = []
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

OWNER = r"""
import os, sys, threading, time, ctypes, torch
mode = sys.argv[1]
x = torch.empty(int(sys.argv[2]), dtype=torch.uint8, device='cuda')
x.fill_(1)  # unwritten memory may not be resident
torch.cuda.synchronize()
if mode == 'fork':
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print('CHILD', child, flush=True)
    os._exit(0)
print('READY', os.getpid(), flush=True)
if mode == 'zombie-main':
    threading.Thread(target=time.sleep, args=(600,)).start()
    ctypes.CDLL(None).pthread_exit(None)
time.sleep(600)
"""


NVML_QUERY = r"""
import ctypes, json
class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]
class Mem2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
mem = Mem2()
mem.version = ctypes.sizeof(Mem2) | (2 << 24)
assert lib.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(mem)) == 0
count = ctypes.c_uint(64)
procs = (Proc * 64)()
assert lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), procs) == 0
print(json.dumps(dict(used=mem.used, charges={str(p.pid): p.used for p in procs[: count.value]})))
"""


class Nvml:
    """What the driver charges whom, asked from a short-lived process: a process that
    opened NVML holds the same device files as a CUDA owner, so the harness must not."""

    def query(self):
        out = subprocess.run([sys.executable, "-c", NVML_QUERY], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return json.loads(out)

    def used(self):
        return self.query()["used"]

    def charges(self):
        return {int(pid): (None if used == NOT_AVAILABLE else used)
                for pid, used in self.query()["charges"].items()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text):
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        labels = {}
        name = head
        if "{" in head:
            name, body = head.split("{", 1)
            for part in body.rstrip("}").split('",'):
                if part:
                    key, val = part.split('="', 1)
                    labels[key] = val.rstrip('"')
        samples.append((name, labels, float(value)))
    return samples


class Exporter:
    def __init__(self, binary, out, name, prefix=()):
        self.port = free_port()
        self.log_path = os.path.join(out, f"exporter-{name}.log")
        self.log = open(self.log_path, "w")
        # Its own session, so a stop reaches it through unshare, which ignores SIGTERM.
        self.proc = subprocess.Popen(
            list(prefix) + [binary, "--web.listen-address", f"127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        SPAWNED.append(self.proc)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, f"exporter {name} did not start; see {self.log_path}"
                time.sleep(0.05)

    def scrape(self, save_as=None):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read()
        if save_as:
            with open(save_as, "wb") as f:
                f.write(body)
        return parse(body.decode())

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.log.close()


def value(samples, name, **labels):
    found = [v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def owners(samples, state):
    return value(samples, "vram_owner_processes", gpu=0, state=state)


def orphaned(samples):
    return (value(samples, "vram_orphaned_bytes", gpu=0, reason="owner_gone")
            + value(samples, "vram_orphaned_bytes", gpu=0, reason="unattributed"))


class Suite:
    def __init__(self, binary, out):
        self.binary = binary
        self.out = out
        self.rows = []
        self.facts = {}

    def expect(self, scenario, what, expected, got, ok=None):
        passed = (expected == got) if ok is None else ok
        self.rows.append(dict(scenario=scenario, check=what, expected=expected, got=got, passed=passed))
        mark = "pass" if passed else "FAIL"
        print(f"{scenario:<28} {what:<44} {str(expected):>22} {str(got):>22}  {mark}", flush=True)
        return passed

    def owner(self, mode, nbytes, prefix=()):
        # Each owner leads its own session, as a job from a shell or a service does.
        proc = subprocess.Popen(list(prefix) + [sys.executable, "-c", OWNER, mode, str(nbytes)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        SPAWNED.append(proc)
        line = proc.stdout.readline().split()
        assert line, f"owner ({mode}) printed nothing"
        return proc, int(line[1])


def wait_for(what, predicate, limit=30.0):
    started = time.monotonic()
    while True:
        result = predicate()
        if result:
            return time.monotonic() - started
        assert time.monotonic() - started < limit, f"timed out waiting for {what}"
        time.sleep(0.02)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/vram-exporter")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--owners", type=int, default=64,
                        help="live CUDA owners for the many-owner latency figure (0: skip)")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    os.makedirs(args.out, exist_ok=True)
    nvml = Nvml()
    suite = Suite(binary, args.out)
    print(f"{'scenario':<28} {'check':<44} {'expected':>22} {'got':>22}  result")

    wait_for("an idle GPU", lambda: nvml.used() == 0 and not nvml.charges(), limit=60)
    exporter = Exporter(binary, args.out, "host")

    # 1. idle
    s = exporter.scrape()
    suite.expect("1 idle", "used bytes", 0, value(s, "vram_used_bytes", gpu=0))
    suite.expect("1 idle", "owners (all states)", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "uninterruptible", "zombie", "gone", "unknown")))
    suite.expect("1 idle", "orphaned bytes", 0, orphaned(s))
    suite.expect("1 idle", "host PID namespace", 1, value(s, "vram_host_pid_namespace"))

    # 1b. what the driver says the GPU needs; MIG mode is read as it is, never changed
    health(suite, exporter)

    # 2. live owner; also the scrape latency against nvidia-smi with that owner alive
    proc, pid = suite.owner("hold", 8 * GiB)
    s = exporter.scrape(save_as=os.path.join(args.out, "metrics-live-owner.txt"))
    charge = nvml.charges().get(pid)
    suite.expect("2 live owner", "running owners", 1, owners(s, "running"))
    suite.expect("2 live owner", "owned bytes (running) = NVML charge", charge,
                 value(s, "vram_owned_bytes", gpu=0, state="running"))
    suite.expect("2 live owner", "orphaned bytes", 0, orphaned(s))
    suite.facts["live_owner"] = dict(pid=pid, nvml_charge=charge, v2_used=nvml.used())
    latency(suite, exporter)

    # 3. stopped owner
    os.kill(pid, signal.SIGSTOP)
    wait_for("state T", lambda: proc_state(pid) == "T")
    s = exporter.scrape()
    suite.expect("3 stopped owner", "stopped owners", 1, owners(s, "stopped"))
    suite.expect("3 stopped owner", "running owners", 0, owners(s, "running"))
    suite.expect("3 stopped owner", "orphaned bytes", 0, orphaned(s))
    os.kill(pid, signal.SIGCONT)

    # 4. owner killed: scrape through the teardown
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    proc.wait()
    seen = []
    while True:
        s = exporter.scrape()
        seen.append((round(time.monotonic() - killed_at, 3), owners(s, "gone"), orphaned(s),
                     value(s, "vram_used_bytes", gpu=0)))
        if value(s, "vram_used_bytes", gpu=0) == 0:
            break
        assert time.monotonic() - killed_at < 30, "memory not freed after SIGKILL"
    suite.facts["teardown_scrapes"] = seen
    suite.expect("4 owner killed", "used bytes after teardown", 0, seen[-1][3])
    suite.expect("4 owner killed", "owners after teardown", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("4 owner killed", "orphaned after teardown", 0, orphaned(s))
    suite.expect("4 owner killed", "seconds until freed (< 2)", True, seen[-1][0] < 2.0)

    # 5. fork-inherited orphan: the owner exits, its child keeps the device open
    proc, child = suite.owner("fork", 8 * GiB)
    proc.wait()
    dead = proc.pid
    CHILDREN.append(child)
    wait_for("the dead owner to be listed", lambda: dead in nvml.charges())
    charge = nvml.charges()[dead]
    s = exporter.scrape(save_as=os.path.join(args.out, "metrics-fork-orphan.txt"))
    suite.expect("5 fork orphan", "gone owners", 1, owners(s, "gone"))
    suite.expect("5 fork orphan", "orphaned owner_gone = dead PID's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("5 fork orphan", "unlisted holders", 1, value(s, "vram_unlisted_holders", gpu=0))
    holder_pids = [int(l["pid"]) for n, l, v in s if n == "vram_holder_info"]
    suite.expect("5 fork orphan", "holder named", [child], holder_pids)
    with open(os.path.join(args.out, "device-files-fork-orphan.json"), "w") as f:
        json.dump(dict(dead_owner=dead, child=child, harness=os.getpid(), exporter=exporter.proc.pid,
                       holders=device_holders()), f, indent=2)
    check = subprocess.run([binary, "check"], capture_output=True, text=True, timeout=60)
    # The parent is whoever adopted the child (init, or a subreaper): not asserted.
    verdict = re.search(rf"still held open by PID {child} \(python3, sleeping, user \w+, parent \d+, "
                        rf"in the process group of exited PID {dead}\) - killing {child} should free it\.",
                        check.stdout)
    suite.expect("5 fork orphan", "check's verdict names only the child", True,
                 verdict is not None, ok=verdict is not None)
    with open(os.path.join(args.out, "check-fork-orphan.txt"), "w") as f:
        f.write(check.stdout + check.stderr)
    suite.expect("5 fork orphan", "check exit status", 1, check.returncode)
    suite.expect("5 fork orphan", "check names the child to kill", True,
                 f"killing {child} should free it" in check.stdout, ok=f"killing {child} should free it" in check.stdout)
    waiter = subprocess.Popen([binary, "check", "--wait", "60s"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    progress = waiter.stderr.readline()  # the first "waiting: ..." line: it is polling
    suite.expect("5 fork orphan", "check --wait is polling", True,
                 progress.startswith("waiting:"), ok=progress.startswith("waiting:"))
    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    out, err = waiter.communicate(timeout=90)
    waited = time.monotonic() - killed_at
    with open(os.path.join(args.out, "check-wait.txt"), "w") as f:
        f.write(out + "\n--- stderr ---\n" + err)
    suite.expect("5 fork orphan", "check --wait exit after kill", 0, waiter.returncode)
    suite.expect("5 fork orphan", "check --wait returned within 5 s", True, waited < 5, ok=waited < 5)
    suite.facts["check_wait_seconds_after_kill"] = round(waited, 3)
    s = exporter.scrape()
    suite.expect("5 fork orphan", "orphaned after killing child", 0, orphaned(s))
    suite.expect("5 fork orphan", "gone owners after killing child", 0, owners(s, "gone"))

    # 8 (from gpu-facts): main thread exited, other threads hold the context
    proc, pid = suite.owner("zombie-main", 4 * GiB)
    wait_for("main thread zombie", lambda: proc_state(pid) == "Z")
    s = exporter.scrape()
    suite.expect("8 zombie main thread", "zombie owners", 1, owners(s, "zombie"))
    suite.expect("8 zombie main thread", "gone owners", 0, owners(s, "gone"))
    suite.expect("8 zombie main thread", "orphaned bytes", 0, orphaned(s))
    os.kill(pid, signal.SIGKILL)
    proc.wait()
    wait_for("memory freed", lambda: nvml.used() == 0)

    # 7. owner inside a PID namespace, exporter on the host
    proc, inner_pid = suite.owner("hold", 2 * GiB,
                                  prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))
    wait_for("the namespaced owner to be listed", lambda: len(nvml.charges()) == 1)
    host_pid = next(iter(nvml.charges()))
    s = exporter.scrape()
    suite.expect("7 owner in PID namespace", "running owners", 1, owners(s, "running"))
    suite.expect("7 owner in PID namespace", "gone owners", 0, owners(s, "gone"))
    suite.expect("7 owner in PID namespace", "listed under its host PID", True,
                 host_pid != inner_pid and os.path.exists(f"/proc/{host_pid}"))
    suite.expect("7 owner in PID namespace", "orphaned bytes", 0, orphaned(s))
    os.kill(host_pid, signal.SIGKILL)
    proc.wait()
    wait_for("memory freed", lambda: nvml.used() == 0)

    # 6. exporter in a fresh PID namespace while an owner lives outside it
    proc, pid = suite.owner("hold", 4 * GiB)
    blind = Exporter(binary, args.out, "pidns",
                     prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))
    s = blind.scrape()
    suite.expect("6 exporter in PID namespace", "host PID namespace", 0, value(s, "vram_host_pid_namespace"))
    suite.expect("6 exporter in PID namespace", "owners seen", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("6 exporter in PID namespace", "unattributed bytes > 0", True,
                 value(s, "vram_unattributed_bytes", gpu=0) > 0)
    suite.expect("6 exporter in PID namespace", "orphaned bytes", 0, orphaned(s))
    blind.stop()
    with open(blind.log_path) as f:
        warned = "PID namespace" in f.read()
    suite.expect("6 exporter in PID namespace", "warned at start", True, warned)
    os.kill(pid, signal.SIGKILL)
    proc.wait()

    many_owners_latency(suite, exporter, args.owners)

    exporter.stop()
    failed = [row for row in suite.rows if not row["passed"]]
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(rows=suite.rows, facts=suite.facts, failed=len(failed)), f, indent=2, default=str)
    print(f"\n{len(suite.rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def samples_of(samples, name, **labels):
    return [v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]


def health(suite, exporter):
    """The GPU-health and MIG series read real values on a healthy GPU 0."""
    name = "1b GPU health"
    # The event thread registers GPUs once the first scrape has loaded NVML.
    wait_for("GPU 0 watched for Xid events",
             lambda: samples_of(exporter.scrape(), "vram_xid_watched", gpu=0) == [1.0], limit=15)
    s = exporter.scrape(save_as=os.path.join(suite.out, "metrics-health.txt"))
    one = lambda metric, **labels: samples_of(s, metric, gpu=0, **labels)
    suite.expect(name, "recovery action none (driver >= 565)", [1.0], one("vram_gpu_recovery_action", action="none"))
    suite.expect(name, "recovery action series (one per action)", 9, len(one("vram_gpu_recovery_action")))
    suite.expect(name, "row remap pending", [0.0], one("vram_gpu_row_remap_pending"))
    suite.expect(name, "row remap failure", [0.0], one("vram_gpu_row_remap_failure"))
    rows = one("vram_gpu_remapped_rows")
    suite.expect(name, "remapped rows: 2 causes, read", 2, len(rows))
    suite.facts["remapped_rows"] = {l["cause"]: v for n, l, v in s
                                    if n == "vram_gpu_remapped_rows" and l.get("gpu") == "0"}
    pending_pages = one("vram_gpu_retired_pages_pending")
    suite.expect(name, "retired pages: absent or none pending", "[] or [0.0]", str(pending_pages),
                 ok=pending_pages in ([], [0.0]))
    mig = one("vram_gpu_mig_mode")
    suite.facts["mig_mode"] = mig
    suite.expect(name, "MIG mode read (left as it is)", 1, len(mig))
    suite.expect(name, "process lists not refused", [0.0], one("vram_gpu_process_list_denied"))
    suite.expect(name, "memory not OS-managed (x86 H200)", [0.0], one("vram_gpu_memory_os_managed"))
    suite.expect(name, "no Xid since the exporter started", [], one("vram_xid_errors_total"))
    suite.expect(name, "no GPU error", [0.0], one("vram_gpu_error", error="no_permission"))


def device_holders():
    """Every process's open /dev/nvidia* files, like fuser -v /dev/nvidia*."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/nvidia"):
                    found.setdefault(entry, set()).add(target)
        except OSError:
            continue
    result = {}
    for pid, targets in found.items():
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            comm = "?"
        result[pid] = dict(comm=comm, files=sorted(targets))
    return result


def proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def many_owners_latency(suite, exporter, count):
    """Scrape latency with `count` live CUDA owners, each with its real descriptor table."""
    if count <= 0:
        return
    procs = [subprocess.Popen([sys.executable, "-c", OWNER, "hold", str(64 << 20)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True) for _ in range(count)]
    SPAWNED.extend(procs)
    for proc in procs:
        assert proc.stdout.readline().startswith("READY"), "an owner did not start"
    s = exporter.scrape()
    suite.expect("9 many owners", "running owners", count, owners(s, "running"))
    suite.expect("9 many owners", "orphaned bytes", 0, orphaned(s))
    fds = sorted(len(os.listdir(f"/proc/{proc.pid}/fd")) for proc in procs)
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    times = []
    for _ in range(500):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=30).read()
        times.append(time.perf_counter() - started)
    times.sort()
    suite.facts["many_owners"] = dict(
        owners=count,
        owner_descriptors_median=fds[len(fds) // 2],
        median_ms=round(statistics.median(times) * 1e3, 3),
        p99_ms=round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
        in_exporter_ms=round(value(exporter.scrape(), "vram_scrape_duration_seconds") * 1e3, 3),
    )
    print(f"many owners: {suite.facts['many_owners']}", flush=True)
    for proc in procs:
        proc.kill()
        proc.wait()


def latency(suite, exporter, scrapes=500, runs=20):
    """Scrape latency of the exporter next to what an nvidia-smi-based exporter runs."""
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=30).read()
        times.append(time.perf_counter() - started)
    smi = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv"],
                       capture_output=True, check=True)
        subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                       capture_output=True, check=True)
        smi.append(time.perf_counter() - started)
    times.sort()
    figures = dict(
        scrapes=scrapes,
        exporter_median_ms=round(statistics.median(times) * 1e3, 3),
        exporter_p99_ms=round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
        nvidia_smi_pair_median_ms=round(statistics.median(smi) * 1e3, 3),
    )
    figures["ratio"] = round(figures["nvidia_smi_pair_median_ms"] / figures["exporter_median_ms"], 1)
    suite.facts["latency"] = figures
    suite.expect("2 live owner", "scrape median faster than nvidia-smi", True,
                 figures["ratio"] > 1, ok=figures["ratio"] > 1)
    print(f"latency: {figures}", flush=True)


def cleanup():
    for pid in CHILDREN:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in SPAWNED:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


if __name__ == "__main__":
    try:
        status = main()
    finally:
        cleanup()
    sys.exit(status)
