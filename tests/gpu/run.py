#!/usr/bin/env python3
"""The real-GPU suite: run the release binary against a real NVIDIA GPU and real
PyTorch owners, scenario by scenario, and compare what it reports with what NVML says.

Run by hand on a GPU host (never by CI): it needs root (for unshare, nsenter and
/proc/sys/kernel/ns_last_pid), PyTorch with CUDA, and the release binary built elsewhere:

    python3 tests/gpu/run.py --binary target/release/vram-exporter --out DIR [--only NAME[,NAME]]

It prints one table row per check (scenario, expected, got, pass), and writes to --out
five files: results.json (every row, the figures, each scenario's duration),
processes.json (what each process of a scenario holds and maps of /dev/nvidia*),
outputs.txt (what `check` and /metrics printed at the moments that matter) and the
exporters' logs. It exits 1 if any check failed. Every scenario kills what it started,
also when it fails, and the next one starts only on an idle GPU. It never resets the GPU
or changes its settings.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

GiB = 1 << 30
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
# Every process the suite starts, killed however the suite ends.
EVERYTHING = None  # a Spawned, set in main()
# Each file under --out stays below this (the caller fetches at most 2 MiB a file).
MAX_FILE_BYTES = 1800 * 1024

# How a GPU owner lives once it holds memory; the program that allocates comes first
# (PyTorch here, a stand-in in dry_run.py). argv: MODE BYTES CHILDREN CHILD_KIND.
# fork: fork CHILDREN children that never touch CUDA, print "CHILD pid...", exit.
# hold-then-fork: print "READY pid", fork as above once a line arrives on stdin.
# hold-and-fork: fork CHILDREN children that keep its files, print "CHILD pid...", then
#   "READY pid", and hold its memory beside them.
# zombie-main: print "READY pid", then the main thread exits while another lives.
# CHILD_KIND zombie-leader: each child's main thread exits while another thread lives.
# With VRAM_WORKER_TITLE in its environment, it retitles itself with setproctitle before
# READY, as SGLang's schedulers (sglang::scheduler_TP0) and vLLM's engine do.
OWNER_LIFE = r"""
import threading
children, child_kind = int(sys.argv[3]), sys.argv[4]
if os.environ.get('VRAM_WORKER_TITLE'):
    import setproctitle
    setproctitle.setproctitle(os.environ['VRAM_WORKER_TITLE'])
def child_life():
    if child_kind == 'zombie-leader':
        threading.Thread(target=time.sleep, args=(600,)).start()
        ctypes.CDLL(None).pthread_exit(None)
    time.sleep(600)
def fork_children():
    kids = []
    for _ in range(children):
        kid = os.fork()
        if kid == 0:
            child_life()
            os._exit(0)
        kids.append(kid)
    print('CHILD', *kids, flush=True)
def fork_and_exit():
    fork_children()
    os._exit(0)
if mode == 'fork':
    fork_and_exit()
if mode == 'hold-and-fork':
    fork_children()
print('READY', os.getpid(), flush=True)
if mode == 'hold-then-fork':
    sys.stdin.readline()
    fork_and_exit()
if mode == 'zombie-main':
    threading.Thread(target=time.sleep, args=(600,)).start()
    ctypes.CDLL(None).pthread_exit(None)
time.sleep(600)
"""

OWNER = r"""
import ctypes, os, sys, time, torch
mode = sys.argv[1]
x = torch.empty(int(sys.argv[2]), dtype=torch.uint8, device='cuda')
x.fill_(1)  # unwritten memory may not be resident
torch.cuda.synchronize()
""" + OWNER_LIFE

# An inference server as vLLM and SGLang start theirs: it holds nothing itself and starts
# WORKERS workers through torch.multiprocessing (spawn), each running the owner program
# (argv: PROGRAM BYTES WORKERS) in mode "hold", which prints READY on the stdout they share.
SERVER = r"""
import sys, time
try:
    import torch.multiprocessing as mp
except ImportError:  # the dry run's stand-ins need no PyTorch
    import multiprocessing as mp
program, nbytes, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
worker = "import sys\nsys.argv = ['-c', 'hold', %r, '0', 'sleep']\n" % nbytes + program
if __name__ == '__main__':
    context = mp.get_context('spawn')
    for _ in range(workers):
        context.Process(target=exec, args=(worker, {'__name__': '__worker__'})).start()
    time.sleep(600)
"""

# A launcher that starts the owner program (argv: PROGRAM BYTES) in a session of its own,
# as a service manager does, says `CHILD pid` once it holds its memory, and exits when a
# line arrives on its stdin.
LAUNCHER = r"""
import subprocess, sys
owner = subprocess.Popen([sys.executable, '-c', sys.argv[1], 'hold', sys.argv[2], '0', 'sleep'],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
print('CHILD', owner.stdout.readline().split()[1], flush=True)
sys.stdin.readline()
"""

# A monitoring agent under a name no list knows: it opens NVML and takes a device
# handle, which opens the same device files as a CUDA process, and maps none of them.
AGENT = r"""
import ctypes, time
lib = ctypes.CDLL('libnvidia-ml.so.1')
assert lib.nvmlInit_v2() == 0
handle = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
print('UP', flush=True)
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
def listed(call):
    count = ctypes.c_uint(128)
    procs = (Proc * 128)()
    assert getattr(lib, call)(dev, ctypes.byref(count), procs) == 0
    return {str(p.pid): p.used for p in procs[: count.value]}
print(json.dumps(dict(used=mem.used, charges=listed("nvmlDeviceGetComputeRunningProcesses_v3"),
                      mps_charges=listed("nvmlDeviceGetMPSComputeRunningProcesses_v3"))))
"""

# The MPS control daemon's program, where the H200 had it.
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_CONTROL_FALLBACK = "/usr/local/nvidia/bin/nvidia-cuda-mps-control"


class Gpu:
    """The real GPU: PyTorch owners, NVML asked from a short-lived process (a process that
    opened NVML holds the same device files as a CUDA owner, so the harness must not),
    and nvidia-smi. dry_run.py swaps in stand-ins to try the suite without a GPU."""

    owner_program = OWNER
    agent_program = AGENT
    device_prefix = "/dev/nvidia"

    def exporter_args(self):
        """Flags the exporter and `check` need besides the scenario's own."""
        return []

    def env(self, view=None):
        """Environment of the exporter or `check`; `view` names where it runs from."""
        return dict(os.environ)

    def query(self):
        out = subprocess.run([sys.executable, "-c", NVML_QUERY], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return json.loads(out)

    def mps_control(self):
        """The command line of MPS's control program, `nvidia-cuda-mps-control`."""
        return [shutil.which(MPS_CONTROL) or MPS_CONTROL_FALLBACK]

    def mps_start(self, env):
        """Start the MPS control daemon (`nvidia-cuda-mps-control -d`) with the pipe and
        log directories `env` names, and return its PID once it runs."""
        subprocess.run(self.mps_control() + ["-d"], env=env, check=True, timeout=30)
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        found = []
        wait_for("the MPS control daemon", lambda: found.extend(mps_daemons(pipe)) or found)
        return found[0]

    def mps_quit(self, env):
        """End MPS as an operator does: `echo quit | nvidia-cuda-mps-control` (the daemon
        waits for its clients to finish first)."""
        subprocess.run(self.mps_control(), input="quit\n", env=env, text=True, timeout=30)

    def nvidia_smi_pair(self):
        """What an nvidia-smi-based exporter runs per scrape."""
        subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv"],
                       capture_output=True, check=True)
        subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                       capture_output=True, check=True)

    def close(self):
        pass


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


# Families that write only their non-zero members (docs/reference.md): counts by kind and
# the one active kind of a state set. A missing member is 0.
SPARSE_FAMILIES = {
    "vram_nvml_error", "vram_gpu_error", "vram_gpu_recovery_action", "vram_owner_processes",
    "vram_owned_bytes", "vram_gone_owner_processes", "vram_owner_processes_usage_unavailable",
    "vram_exited_container_processes", "vram_holder_processes", "vram_mig_owner_processes",
    "vram_mig_holder_processes", "vram_kubelet_error", "vram_container_engine_error",
}


def value(samples, name, **labels):
    found = [v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    if name in SPARSE_FAMILIES:
        assert len(found) <= 1 and 0.0 not in found, f"{name}{labels}: {found}"
        return found[0] if found else 0.0
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def series(samples, name, **labels):
    """The label sets of every sample of `name` matching `labels`."""
    return [l for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]


def owners(samples, state):
    return value(samples, "vram_owner_processes", gpu=0, state=state)


def orphaned(samples):
    return (value(samples, "vram_orphaned_bytes", gpu=0, reason="owner_gone")
            + value(samples, "vram_orphaned_bytes", gpu=0, reason="unattributed"))


def holder_pids(samples):
    """PIDs `vram_holder_info` names on GPU 0 (culprits only)."""
    return sorted(int(l["pid"]) for l in series(samples, "vram_holder_info", gpu=0))


def holders(samples, role):
    return value(samples, "vram_holder_processes", gpu=0, role=role)


def excerpt(text):
    """The series a reader of a scenario looks at, without HELP and TYPE lines."""
    keep = ("vram_owner", "vram_owned", "vram_gone", "vram_orphaned", "vram_unattributed",
            "vram_holder", "vram_used", "vram_host_pid", "vram_procfs")
    return "\n".join(line for line in text.splitlines() if line.startswith(keep))


# --- what `check` prints ----------------------------------------------------------

STARTED = r"(?:started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|started \d+ s after boot)"


def culprit_words(pid, comm, state, evidence):
    """How the verdict sentence names a culprit: `PID 524 (python3, sleeping, started ...,
    user root, parent 1, <evidence>)`; a container or more evidence may follow."""
    return (rf"PID {pid} \({re.escape(comm)}, {state}, {STARTED}(?:, user [^,()]+)?, parent \d+"
            rf"[^()]*?, {evidence}[^()]*\)")


def names_only_the_child(text, dead, child):
    """Whether `check`'s verdict on GPU 0 names the dead owner's forked child, and it alone,
    as the holder of the dead owner's memory. The child's parent is whoever adopted it
    (init, or a subreaper): not asserted."""
    return re.search(
        rf"GPU 0: .* held for exited PID {dead}; still held by "
        + culprit_words(child, comm_of(child), "sleeping",
                        "holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, "
                        rf"in the process group and session of exited PID {dead}")
        + rf" - killing {child} should free it\.", text) is not None


def kill_line(text):
    """The PIDs of the `suggested: kill ...` line, or None when there is none."""
    found = re.search(r"^  suggested: kill ([0-9 ]+?)   # ", text, re.M)
    return [int(pid) for pid in found.group(1).split()] if found else None


def exit_line(text):
    found = re.search(r"^exit status (\d+): (.*)$", text, re.M)
    return found.group(0) if found else None


def gpu0(doc):
    return next(gpu for gpu in doc["gpus"] if gpu["index"] == 0)


def pids(items):
    return sorted(item["pid"] for item in items)


def kill_targets(gpu):
    remedy = gpu.get("remedy") or {}
    return sorted(target["pid"] for target in remedy.get("targets", []))


def kinds(suspect):
    return [evidence["kind"] for evidence in suspect["evidence"]]


def find(items, pid):
    return next((item for item in items if item["pid"] == pid), None)


# --- /proc ------------------------------------------------------------------------

def proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def stat_fields(pid):
    """Fields of /proc/PID/stat after the command name: [0] is field 3 (state)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def start_ticks(pid):
    """Field 22 of /proc/PID/stat: with the PID, a process's identity."""
    try:
        return int(stat_fields(pid)[19])
    except OSError:
        return None


def cpu_ticks(pid):
    """utime + stime of every thread of `pid`, in clock ticks."""
    fields = stat_fields(pid)
    return int(fields[11]) + int(fields[12])


def comm_of(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        pass
    # A kernel without CONFIG_PROC_CHILDREN: look for the parent in every stat.
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(stat_fields(entry)[1]) == pid:
                found.append(int(entry))
        except OSError:
            continue
    return sorted(found)


def pid_namespace(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def host_pids(inner, namespace):
    """Host PIDs of the processes that are `inner` in PID namespace `namespace`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or pid_namespace(entry) != namespace:
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid and nspid[-1] == str(inner):
            found.append(int(entry))
    return found


def describe(pid, prefix):
    """What a process holds and maps of the device files, as holder_probe.py shows it: fd
    targets under the prefix (from task/TID/fd when the leader's list is empty, as a
    zombie leader's is) and counts of shared mappings by file and permissions (from a
    live thread's maps when the leader's are empty)."""
    facts = dict(pid=pid, comm=comm_of(pid), state=proc_state(pid))
    if facts["state"] is None:
        facts["gone"] = True
        return facts
    try:
        tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    facts["threads"] = len(tids)
    live_tids = [tid for tid in tids if tid != pid]

    def fds(base):
        found = {}
        try:
            for fd in os.listdir(base):
                try:
                    target = os.readlink(f"{base}/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    found[target] = found.get(target, 0) + 1
        except OSError as error:
            return {"error": str(error)}
        return dict(sorted(found.items()))

    def maps(path):
        found = {}
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and parts[5].startswith(prefix) and parts[1][3] == "s":
                        key = f"{parts[5]} {parts[1]}"
                        found[key] = found.get(key, 0) + 1
        except OSError as error:
            return {"error": str(error)}
        return dict(sorted(found.items()))

    facts["fds_from"] = f"/proc/{pid}/fd"
    facts["fds"] = fds(f"/proc/{pid}/fd")
    if not facts["fds"] and live_tids:
        facts["fds_from"] = f"/proc/{pid}/task/{live_tids[0]}/fd"
        facts["fds"] = fds(facts["fds_from"])
    facts["maps_from"] = f"/proc/{pid}/maps"
    facts["shared_maps"] = maps(f"/proc/{pid}/maps")
    if not facts["shared_maps"] and live_tids:
        facts["maps_from"] = f"/proc/{pid}/task/{live_tids[0]}/maps"
        facts["shared_maps"] = maps(facts["maps_from"])
    facts["shared_maps_total"] = sum(v for v in facts["shared_maps"].values() if isinstance(v, int))
    return facts


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def mps_daemons(pipe):
    """The MPS control daemons whose pipe directory is `pipe`: processes named
    nvidia-cuda-mps that lead their own session, with CUDA_MPS_PIPE_DIRECTORY=pipe."""
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if (entry.isdigit() and comm_of(entry) == "nvidia-cuda-mps"
                    and int(stat_fields(entry)[3]) == int(entry) and wanted in environ_of(entry)):
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(found)


def device_holders(prefix):
    """Every process's open device files, like fuser -v /dev/nvidia*."""
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
                if target.startswith(prefix):
                    found.setdefault(entry, set()).add(target)
        except OSError:
            continue
    return {pid: dict(comm=comm_of(pid), files=sorted(targets)) for pid, targets in found.items()}


def wait_for(what, predicate, limit=30.0):
    started = time.monotonic()
    while True:
        result = predicate()
        if result:
            return time.monotonic() - started
        assert time.monotonic() - started < limit, f"timed out waiting for {what}"
        time.sleep(0.02)


# --- processes --------------------------------------------------------------------

class Spawned:
    """Processes started for one scenario (or the whole run), killed however it ends:
    session leaders with their process group, other processes alone, and single PIDs
    (forked children) only while their start time still names the process we saw."""

    def __init__(self):
        self.procs = []  # (Popen, leads its own process group)
        self.pids = []  # (pid, start time in ticks)

    def add(self, proc, group):
        self.procs.append((proc, group))
        return proc

    def add_pid(self, pid):
        self.pids.append((pid, start_ticks(pid)))

    def kill_all(self):
        for pid, started in reversed(self.pids):
            if started is not None and start_ticks(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc, group in reversed(self.procs):
            try:
                if group:
                    os.killpg(proc.pid, signal.SIGKILL)
                elif proc.poll() is None:
                    proc.kill()
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                print(f"process {proc.pid} did not end after SIGKILL", file=sys.stderr)
        self.procs.clear()
        self.pids.clear()


def read_line(proc, limit=180.0):
    """The next line `proc` prints, or '' once `limit` seconds pass (it is killed then,
    with its process group): a hung CUDA init must not hang the suite."""
    def kill():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    timer = threading.Timer(limit, kill)
    timer.start()
    try:
        return proc.stdout.readline()
    finally:
        timer.cancel()


class Owner:
    """A GPU owner the suite started (see OWNER_LIFE)."""

    def __init__(self, proc, stderr):
        self.proc = proc
        self.stderr = stderr
        self.pid = None
        self.children = []

    def line(self, word):
        text = read_line(self.proc)
        parts = text.split()
        if not parts or parts[0] != word:
            self.stderr.seek(0)
            raise AssertionError(f"the owner printed {text!r}, not {word}; its stderr ends: "
                                 f"{self.stderr.read()[-800:]!r}")
        return [int(part) for part in parts[1:]]

    def fork_now(self):
        """hold-then-fork: fork the children and exit; returns the children."""
        self.proc.stdin.write("fork\n")
        self.proc.stdin.flush()
        self.children = self.line("CHILD")
        self.proc.wait(timeout=60)
        return self.children


class Exporter:
    def __init__(self, suite, name, proc, port, log_path, log_offset):
        self.suite = suite
        self.name = name
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.log_offset = log_offset
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"exporter {name} exited; see {log_path}"
                assert time.monotonic() < deadline, f"exporter {name} did not start; see {log_path}"
                time.sleep(0.05)

    @classmethod
    def start(cls, suite, spawned, name, log_name, prefix=(), view=None):
        port = free_port()
        log_path = os.path.join(suite.out, log_name)
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        log = open(log_path, "a")
        # Its own session, so a stop reaches it through unshare, which ignores SIGTERM.
        proc = spawned.add(subprocess.Popen(
            list(prefix) + suite.argv("--web.listen-address", f"127.0.0.1:{port}"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=suite.gpu.env(view)), group=True)
        log.close()
        return cls(suite, name, proc, port, log_path, offset)

    def scrape(self, record=None):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()
        if record:
            self.suite.record(f"/metrics ({self.name}): {record}", excerpt(body))
        return parse(body)

    def log(self):
        with open(self.log_path) as f:
            f.seek(self.log_offset)
            return f.read()

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=20)


# --- the suite --------------------------------------------------------------------

class Suite:
    def __init__(self, binary, out, gpu):
        self.binary = binary
        self.out = out
        self.gpu = gpu
        self.rows = []
        self.facts = {"durations_s": {}}
        self.processes = {}
        self.outputs = []
        self.scenario = None
        self.state = tempfile.mkdtemp(prefix="vram-witness-")  # the witness state's folder
        self.spawned = None  # the current scenario's processes
        self.exporter = None  # the exporter on the host, shared by the scenarios

    # Results.
    def expect(self, what, expected, got, ok=None):
        passed = (expected == got) if ok is None else bool(ok)
        self.rows.append(dict(scenario=self.scenario, check=what, expected=expected, got=got, passed=passed))
        mark = "pass" if passed else "FAIL"
        print(f"{self.scenario:<28} {what:<52} {str(expected):>22} {str(got):>22}  {mark}", flush=True)
        return passed

    def record(self, title, text):
        self.outputs.append(f"===== {self.scenario}: {title}\n{text.rstrip()}\n")

    def describe(self, label, pid):
        facts = describe(pid, self.gpu.device_prefix)
        self.processes.setdefault(self.scenario, {})[label] = facts
        return facts

    # NVML as the harness sees it.
    def used(self):
        return self.gpu.query()["used"]

    def charges(self):
        return {int(pid): (None if used == NOT_AVAILABLE else used)
                for pid, used in self.gpu.query()["charges"].items()}

    def idle(self):
        reading = self.gpu.query()
        return reading["used"] == 0 and not reading["charges"]

    def wait_freed(self, limit=10.0):
        return wait_for("the GPU's memory to be freed", self.idle, limit=limit)

    # The binary.
    def argv(self, *args):
        # Every exporter and check of the run share one witness state, as on a host they
        # share /run/vram-exporter, unless a call names another.
        state = [] if "--path.state" in args else ["--path.state", self.state]
        return [self.binary, *args, *state, *self.gpu.exporter_args()]

    def check(self, *args, prefix=(), view=None, record=None):
        result = subprocess.run(list(prefix) + self.argv("check", *args), capture_output=True,
                                text=True, timeout=90, env=self.gpu.env(view))
        if record:
            self.record(f"{record}: {' '.join(['check', *args])} (exit {result.returncode})",
                        result.stdout + ("\n--- stderr ---\n" + result.stderr if result.stderr else ""))
        return result

    def check_json(self, *args, prefix=(), view=None, record=None):
        result = self.check("--json", *args, prefix=prefix, view=view, record=record)
        try:
            return result.returncode, json.loads(result.stdout)
        except ValueError:
            raise AssertionError(f"check --json printed no JSON (exit {result.returncode}): "
                                 f"{result.stderr[-500:]!r}")

    # Processes.
    def owner(self, mode, nbytes, children=1, child_kind="sleep", prefix=(), own_session=True,
              env=None):
        """Start a GPU owner; by default it leads its own session, as a job from a shell or
        a service does; `env` adds to its environment (MPS's directories make it an MPS
        client). Returns once it holds its memory (READY) or has forked (CHILD)."""
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(
            list(prefix) + [sys.executable, "-c", self.gpu.owner_program, mode, str(nbytes),
                            str(children), child_kind],
            stdin=subprocess.PIPE if mode == "hold-then-fork" else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=own_session,
            env=dict(self.gpu.env(), **(env or {})))
        self.spawned.add(proc, group=own_session)
        owner = Owner(proc, stderr)
        if mode == "fork":
            owner.children = owner.line("CHILD")
        else:
            if mode == "hold-and-fork":
                owner.children = owner.line("CHILD")
            owner.pid = owner.line("READY")[0]
        return owner

    def server(self, nbytes, workers, title=None):
        """Start a server in its own session with `workers` spawn workers holding `nbytes`
        each (see SERVER), retitled `title` with setproctitle when given; returns it and the
        workers' PIDs once every one holds them."""
        stderr = tempfile.TemporaryFile(mode="w+")
        env = self.gpu.env()
        if title:
            env["VRAM_WORKER_TITLE"] = title
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", SERVER, self.gpu.owner_program, str(nbytes), str(workers)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True, env=env), group=True)
        owner = Owner(proc, stderr)
        pids = sorted(owner.line("READY")[0] for _ in range(workers))
        return proc, pids

    def launched_service(self, nbytes):
        """Start an owner through a launcher that gives it its own session (see LAUNCHER);
        returns the launcher, still alive, and the owner's PID."""
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, self.gpu.owner_program, str(nbytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True, env=self.gpu.env()), group=True)
        pid = Owner(proc, stderr).line("CHILD")[0]
        self.spawned.add_pid(pid)
        return proc, pid

    def agent(self):
        """Start an NVML-only client and return it once it holds a device handle."""
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", self.gpu.agent_program], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=self.gpu.env()),
            group=True)
        assert read_line(proc).strip() == "UP", "the NVML-only client did not start"
        return proc

    def agent_at(self, pid, attempts=300):
        """Start an NVML-only client at exactly `pid` (free, as a reaped process's PID is)
        through /proc/sys/kernel/ns_last_pid, as a busy node hands a dead owner's PID out
        again; other processes (threads too) may take the number first, so it retries.
        Returns the client and the attempts it took, or (None, attempts)."""
        for attempt in range(1, attempts + 1):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            proc = subprocess.Popen([sys.executable, "-c", self.gpu.agent_program],
                                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                    start_new_session=True, env=self.gpu.env())
            if proc.pid == pid:
                self.spawned.add(proc, group=True)
                assert read_line(proc).strip() == "UP", "the NVML-only client did not start"
                return proc, attempt
            proc.kill()
            proc.wait()
        return None, attempts


SCENARIOS = []


def scenario(number, name, title, *aliases):
    """Register a scenario: --only knows it by `name`, its number or an alias, its rows
    say `number title`; they run in the order registered."""
    def register(function):
        SCENARIOS.append(dict(number=number, name=name, title=title, aliases=aliases, run=function))
        return function
    return register


@scenario(1, "idle", "idle")
def idle(suite):
    s = suite.exporter.scrape()
    suite.expect("used bytes", 0, value(s, "vram_used_bytes", gpu=0))
    suite.expect("owners (all states)", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "uninterruptible", "zombie", "killed",
                                          "exiting", "gone", "unknown")))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("host PID namespace", 1, value(s, "vram_host_pid_namespace"))
    suite.expect("procfs shows its own PID namespace", 1, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json status", "clear", doc["status"])


@scenario("1b", "health", "GPU health", "mig")
def health(suite):
    """What the driver says the GPU needs, read on a healthy GPU 0; MIG mode is read as it
    is, never changed."""
    exporter = suite.exporter
    values = lambda samples, metric, **labels: [
        v for n, l, v in samples
        if n == metric and all(l.get(k) == str(x) for k, x in dict(gpu=0, **labels).items())]
    # The event thread registers GPUs once the first scrape has loaded NVML.
    wait_for("GPU 0 watched for Xid events",
             lambda: values(exporter.scrape(), "vram_xid_watched") == [1.0], limit=15)
    s = exporter.scrape(record="GPU health")
    one = lambda metric, **labels: values(s, metric, **labels)
    suite.expect("recovery action none (driver >= 565)", [1.0], one("vram_gpu_recovery_action", action="none"))
    suite.expect("recovery action: one series, the action asked", 1, len(one("vram_gpu_recovery_action")))
    suite.expect("row remap pending", [0.0], one("vram_gpu_row_remap_pending"))
    suite.expect("row remap failure", [0.0], one("vram_gpu_row_remap_failure"))
    suite.expect("remapped rows: 2 causes, read", 2, len(one("vram_gpu_remapped_rows")))
    suite.facts["remapped_rows"] = {l["cause"]: v for n, l, v in s
                                    if n == "vram_gpu_remapped_rows" and l.get("gpu") == "0"}
    pending_pages = one("vram_gpu_retired_pages_pending")
    suite.expect("retired pages: absent or none pending", "[] or [0.0]", str(pending_pages),
                 ok=pending_pages in ([], [0.0]))
    mig = one("vram_gpu_mig_mode")
    suite.facts["mig_mode"] = mig
    suite.expect("MIG mode read (left as it is)", 1, len(mig))
    suite.expect("process lists not refused", [0.0], one("vram_gpu_process_list_denied"))
    suite.expect("memory not OS-managed (x86 H200)", [0.0], one("vram_gpu_memory_os_managed"))
    suite.expect("no Xid since the exporter started", [], one("vram_xid_errors_total"))
    suite.expect("no permission error (no vram_gpu_error)", [], one("vram_gpu_error", error="no_permission"))
    # Every NVML call runs on a reader thread (one for the library, one per GPU, beside
    # the event thread): on a healthy GPU each answers within the scrape.
    suite.expect("answers in time (no timeout)", [], one("vram_gpu_error", error="timeout"))
    suite.expect("no NVML call stuck", [], one("vram_gpu_stuck_seconds"))
    suite.expect("NVML answers (no vram_nvml_error)", [],
                 [v for n, l, v in s if n == "vram_nvml_error"])
    # A fresh exporter's first scrape: loading NVML waits (2 s at most) for the GPU's
    # registration for Xid events, so it already says watched; and a server serves its
    # own process_* series.
    fresh = Exporter.start(suite, suite.spawned, "fresh", "exporter-fresh.log")
    first = fresh.scrape(record="a fresh exporter's first scrape")
    fresh.stop()
    suite.expect("fresh exporter: Xid watched on its first scrape", [1.0],
                 values(first, "vram_xid_watched"))
    own = sorted(n for n, l, v in first if n.startswith("process_"))
    suite.expect("fresh exporter: its own process_* series", 6, len(own))


@scenario(2, "lifecycle", "live owner", "live", "stopped", "killed", "latency", "3", "4")
def lifecycle(suite):
    """2 live owner (with the scrape latency beside nvidia-smi), 3 stopped, 4 killed."""
    exporter = suite.exporter
    suite.scenario = "2 live owner"
    owner = suite.owner("hold", 8 * GiB)
    pid = owner.pid
    s = exporter.scrape(record="live owner")
    charge = suite.charges().get(pid)
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("owned bytes (running) = NVML charge", charge,
                 value(s, "vram_owned_bytes", gpu=0, state="running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("culprits", 0, holders(s, "culprit"))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json: the owner, running", [(pid, "running")],
                 [(o["pid"], o["state"]) for o in gpu0(doc)["owners"]])
    suite.describe("live CUDA owner", pid)
    suite.facts["live_owner"] = dict(pid=pid, nvml_charge=charge, v2_used=suite.used())
    latency(suite, exporter)

    suite.scenario = "3 stopped owner"
    os.kill(pid, signal.SIGSTOP)
    wait_for("state T", lambda: proc_state(pid) == "T")
    s = exporter.scrape()
    suite.expect("stopped owners", 1, owners(s, "stopped"))
    suite.expect("running owners", 0, owners(s, "running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    os.kill(pid, signal.SIGCONT)

    suite.scenario = "4 owner killed"
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    owner.proc.wait()
    seen = []
    while True:
        s = exporter.scrape()
        seen.append((round(time.monotonic() - killed_at, 3), owners(s, "gone"), orphaned(s),
                     value(s, "vram_used_bytes", gpu=0)))
        if value(s, "vram_used_bytes", gpu=0) == 0:
            break
        assert time.monotonic() - killed_at < 30, "memory not freed after SIGKILL"
    suite.facts["teardown_scrapes"] = seen
    suite.expect("used bytes after teardown", 0, seen[-1][3])
    suite.expect("owners after teardown", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("orphaned after teardown", 0, orphaned(s))
    suite.expect("seconds until freed (< 2)", True, seen[-1][0] < 2.0)


@scenario(5, "fork", "fork orphan")
def fork_orphan(suite):
    """The owner exits, its child (never touched CUDA) keeps its context."""
    exporter = suite.exporter
    owner = suite.owner("fork", 8 * GiB)
    owner.proc.wait()
    dead, [child] = owner.proc.pid, owner.children
    suite.spawned.add_pid(child)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    charge = suite.charges()[dead]
    s = exporter.scrape(record="fork orphan")
    suite.expect("gone owners", 1, owners(s, "gone"))
    suite.expect("gone owners that exited", 1, value(s, "vram_gone_owner_processes", gpu=0, reason="exited"))
    suite.expect("orphaned owner_gone = dead PID's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("culprits", 1, holders(s, "culprit"))
    suite.expect("holder named", [child], holder_pids(s))
    suite.describe("fork-inherited culprit", child)
    suite.facts["fork_orphan_device_files"] = dict(
        dead_owner=dead, child=child, harness=os.getpid(), exporter=exporter.proc.pid,
        holders=device_holders(suite.gpu.device_prefix))

    check = suite.check(record="fork orphan")
    suite.expect("check's verdict names only the child", True,
                 names_only_the_child(check.stdout, dead, child))
    suite.expect("check exit status", 1, check.returncode)
    suite.expect("check's last line", "exit status 1: orphaned memory found", exit_line(check.stdout))
    suite.expect("suggested kill line", [child], kill_line(check.stdout))
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check --json status", "orphaned", doc["status"])
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("check --json remedy", ("kill", [(child, start_ticks(child))]),
                 (gpu["remedy"]["action"],
                  [(t["pid"], t["start_time_ticks"]) for t in gpu["remedy"].get("targets", [])]))
    suite.expect("check --json owner gone, exited", [(dead, "gone", "exited")],
                 [(o["pid"], o["state"], (o.get("detail") or {}).get("reason")) for o in gpu["owners"]])

    waiter = subprocess.Popen(suite.argv("check", "--wait", "60s"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=suite.gpu.env())
    suite.spawned.add(waiter, group=False)
    progress = waiter.stderr.readline()  # the first "waiting: ..." line: it is polling
    suite.expect("check --wait is polling", True, progress.startswith("waiting:"))
    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    out, err = waiter.communicate(timeout=90)
    waited = time.monotonic() - killed_at
    suite.record(f"check --wait 60s (exit {waiter.returncode})", out + "\n--- stderr ---\n" + err)
    suite.expect("check --wait exit after kill", 0, waiter.returncode)
    suite.expect("check --wait returned within 5 s", True, waited < 5)
    suite.facts["check_wait_seconds_after_kill"] = round(waited, 3)
    s = exporter.scrape()
    suite.expect("orphaned after killing child", 0, orphaned(s))
    suite.expect("gone owners after killing child", 0, owners(s, "gone"))


@scenario("5b", "left-behind", "server killed, workers left behind")
def left_behind(suite):
    """Branch 1 of the story: a server's torch.multiprocessing workers outlive its SIGKILL."""
    exporter = suite.exporter
    server, workers = suite.server(2 * GiB, workers=2)
    for worker in workers:
        suite.spawned.add_pid(worker)
    wait_for("both workers to be listed", lambda: set(workers) <= set(suite.charges()))
    s = exporter.scrape()
    suite.expect("left behind while the server lives", 0, value(s, "vram_left_behind_bytes", gpu=0))
    suite.describe("worker before the kill", workers[0])
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    charges = suite.charges()
    held = sum(charges[worker] for worker in workers)
    found = []
    wait_for("the exporter to count the workers left behind", lambda: found.append(
        exporter.scrape(record="server killed")) or value(found[-1], "vram_left_behind_bytes", gpu=0) == held)
    s = found[-1]
    suite.expect("left-behind bytes = the workers' charges", held, value(s, "vram_left_behind_bytes", gpu=0))
    named = series(s, "vram_left_behind_since_timestamp_seconds", gpu=0)
    suite.expect("left-behind workers named", workers, sorted(int(l["pid"]) for l in named))
    suite.expect("with the server as their parent", [str(server.pid)] * 2,
                 [l["parent_pid"] for l in named])
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.describe("worker after the kill", workers[0])
    check = suite.check(record="server killed")
    suite.expect("check exit status", 4, check.returncode)
    # check beside the exporter goes by what it saw (the witness state): the same verdict.
    suite.expect("check names both workers, left behind as the exporter saw", True,
                 re.search(r"GPU 0: .* held by 2 processes left behind by a server that exited:", check.stdout)
                 is not None and all(f"PID {w} (" in check.stdout for w in workers))
    suite.expect("check names the server that exited", True,
                 f"a worker of PID {server.pid} (" in check.stdout)
    alone = suite.check("--path.state", tempfile.mkdtemp(prefix="vram-no-witness-"),
                        record="server killed, check with no witness state")
    suite.expect("check with no state: possibly left behind, the server's group named", True,
                 "held by 2 processes possibly left behind by a server that exited:" in alone.stdout
                 and f"PID {server.pid} (the process that started it), has exited" in alone.stdout)
    line = kill_line(check.stdout)
    suite.expect("suggested kill line", workers, line)
    killed_at = time.monotonic()
    subprocess.run(["kill"] + [str(pid) for pid in line or []], check=True)
    # wait_freed raises when the memory is still held after its limit.
    freed_after = suite.wait_freed()
    suite.expect("the suggested kill frees the memory within 10 s", True, freed_after < 10)
    suite.facts["left_behind_freed_seconds_after_kill"] = round(time.monotonic() - killed_at, 3)
    s = exporter.scrape()
    suite.expect("left-behind bytes after the kill", 0, value(s, "vram_left_behind_bytes", gpu=0))


@scenario("5f", "unreaped", "owner killed, left unreaped, its child holds")
def unreaped(suite):
    """The fork orphan with a parent that does not reap: the owner forked a child that
    keeps its files and is SIGKILLed, and its parent (this harness) leaves it a zombie.
    NVML goes on charging it; past the bound a free can take (2 s) it is gone, and the
    child is named."""
    exporter = suite.exporter
    owner = suite.owner("hold-and-fork", 2 * GiB)
    [child] = owner.children
    suite.spawned.add_pid(child)
    s = exporter.scrape()
    suite.expect("running owners before the kill", 1, owners(s, "running"))
    killed_at = time.monotonic()
    os.kill(owner.pid, signal.SIGKILL)  # never waited for: a zombie
    wait_for("the owner to be a zombie", lambda: proc_state(owner.pid) == "Z")
    charge = suite.charges().get(owner.pid)
    suite.expect("NVML still charges the zombie", True, bool(charge))
    first = exporter.scrape(record="owner killed, unreaped")
    # Scraped within the bound (else this says nothing), and not orphaned.
    suite.expect("within the bound, not orphaned", (True, 0),
                 (time.monotonic() - killed_at < 2.0, orphaned(first)))
    found = []
    wait_for("the exporter to call the memory orphaned", lambda: found.append(
        exporter.scrape()) or orphaned(found[-1]) == charge, limit=20)
    waited = time.monotonic() - killed_at
    s = exporter.scrape(record="owner unreaped past the bound")
    suite.expect("orphaned owner_gone = the zombie's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("orphaned after the bound (2 s), not before", True, 2.0 <= waited < 10.0)
    suite.facts["unreaped_orphaned_after_s"] = round(waited, 3)
    suite.expect("the child named", [child], holder_pids(s))
    check = suite.check(record="owner killed, unreaped")
    suite.expect("check exit status", 1, check.returncode)
    suite.expect("check's kill line: the child", [child], kill_line(check.stdout))
    suite.expect("check says the owner exited", True,
                 f"held for exited PID {owner.pid}; still held by PID {child} (" in check.stdout)
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()
    owner.proc.wait()
    s = exporter.scrape()
    suite.expect("orphaned once the child is killed", 0, orphaned(s))


@scenario("5g", "titled-workers", "server killed, its retitled workers left behind")
def titled_workers(suite):
    """A server's torch.multiprocessing workers retitle themselves with setproctitle, as
    SGLang's schedulers do, and the server is SIGKILLed: left behind, and the served
    exporter and check beside it agree; a check with no witness state finds them by their
    pipes to the dead server."""
    exporter = suite.exporter
    title = "sglang::scheduler_TP0"
    server, workers = suite.server(2 * GiB, workers=2, title=title)
    for worker in workers:
        suite.spawned.add_pid(worker)
    wait_for("both workers to be listed", lambda: set(workers) <= set(suite.charges()))
    suite.expect("the workers' command name is the title", [title[:15]] * 2,
                 [comm_of(worker) for worker in workers])
    exporter.scrape()
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    held = sum(suite.charges()[worker] for worker in workers)
    found = []
    wait_for("the exporter to count the workers left behind", lambda: found.append(
        exporter.scrape(record="retitled workers' server killed"))
        or value(found[-1], "vram_left_behind_bytes", gpu=0) == held)
    s = found[-1]
    served = sorted(int(l["pid"]) for l in series(s, "vram_left_behind_since_timestamp_seconds", gpu=0))
    suite.expect("served: the workers left behind", workers, served)
    rc, doc = suite.check_json(record="retitled workers' server killed")
    gpu = gpu0(doc)
    suite.expect("check beside it: exit status", 4, rc)
    suite.expect("check beside it: left behind, witnessed", ("left_behind", held),
                 (gpu["finding"], gpu["left_behind_bytes"]))
    suite.expect("check beside it: the same workers in the kill line", workers, kill_targets(gpu))
    suite.expect("check beside it: facts from the witness", [["parent", "parent_exit"]] * 2,
                 [w["process"].get("from_witness") for w in gpu["left_behind"]])
    rc, doc = suite.check_json("--path.state", tempfile.mkdtemp(prefix="vram-no-witness-"),
                               record="retitled workers, check with no witness state")
    gpu = gpu0(doc)
    suite.expect("no state: possibly left behind, by their pipes",
                 ["pipes_to_parent_closed"] * 2, [w["seen"].get("clue") for w in gpu["left_behind"]])
    subprocess.run(["kill"] + [str(pid) for pid in workers], check=True)
    suite.wait_freed()


@scenario("5c", "service-alone", "service whose launcher exits")
def service_alone(suite):
    """An owner in its own session whose launcher exits: a service, never left behind."""
    exporter = suite.exporter
    launcher, pid = suite.launched_service(2 * GiB)
    wait_for("the service to be listed", lambda: pid in suite.charges())
    exporter.scrape()  # it is seen with its launcher alive
    launcher.stdin.write("exit\n")
    launcher.stdin.flush()
    launcher.wait(timeout=30)
    wait_for("the service to be adopted", lambda: stat_fields(pid)[1] != str(launcher.pid))
    s = exporter.scrape(record="service's launcher exited")
    suite.expect("left-behind bytes", 0, value(s, "vram_left_behind_bytes", gpu=0))
    suite.expect("running owners", 1, owners(s, "running"))
    check = suite.check(record="service's launcher exited")
    suite.expect("check exit status", 0, check.returncode)
    suite.describe("service after its launcher exited", pid)
    os.kill(pid, signal.SIGKILL)
    suite.wait_freed()


@scenario(8, "zombie-owner", "zombie main thread")
def zombie_owner(suite):
    """The owner's main thread exited, other threads hold the context (state Z)."""
    owner = suite.owner("zombie-main", 4 * GiB)
    pid = owner.pid
    wait_for("main thread zombie", lambda: proc_state(pid) == "Z")
    s = suite.exporter.scrape()
    suite.expect("zombie owners", 1, owners(s, "zombie"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.describe("zombie-leader owner", pid)
    os.kill(pid, signal.SIGKILL)
    owner.proc.wait()
    suite.wait_freed()


@scenario(7, "owner-pidns", "owner in PID namespace")
def owner_in_pid_namespace(suite):
    """An owner inside a PID namespace, the exporter on the host."""
    owner = suite.owner("hold", 2 * GiB,
                        prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))
    wait_for("the namespaced owner to be listed", lambda: len(suite.charges()) == 1)
    host_pid = next(iter(suite.charges()))
    suite.describe("owner in a PID namespace (host PID)", host_pid)
    s = suite.exporter.scrape()
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("listed under its host PID", True,
                 host_pid != owner.pid and os.path.exists(f"/proc/{host_pid}"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    os.kill(host_pid, signal.SIGKILL)
    owner.proc.wait()
    suite.wait_freed()


@scenario(6, "exporter-pidns", "exporter in PID namespace")
def exporter_in_pid_namespace(suite):
    """The exporter in a fresh PID namespace with its own /proc, an owner outside it:
    NVML hides the owner, so the memory is unattributed and not called orphaned."""
    owner = suite.owner("hold", 4 * GiB)
    blind = Exporter.start(suite, suite.spawned, "in a PID namespace", "exporter-pidns.log",
                           prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"),
                           view="blind")
    s = blind.scrape()
    suite.expect("host PID namespace", 0, value(s, "vram_host_pid_namespace"))
    suite.expect("procfs shows its own PID namespace", 1, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("owners seen", 0, sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("unattributed bytes > 0", True, value(s, "vram_unattributed_bytes", gpu=0) > 0)
    suite.expect("orphaned bytes", 0, orphaned(s))
    blind.stop()
    suite.expect("warned at start", True, "PID namespace" in blind.log())
    os.kill(owner.pid, signal.SIGKILL)
    owner.proc.wait()


@scenario(10, "agent", "NVML client + fork orphan")
def agent_beside_orphan(suite):
    """An NVML-only client under a name no list knows (python3) beside a fork orphan:
    only the child is blamed; the client is a bystander and never in a kill line."""
    agent = suite.agent()
    owner = suite.owner("fork", 4 * GiB)
    owner.proc.wait()
    dead, [child] = owner.proc.pid, owner.children
    suite.spawned.add_pid(child)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    suite.describe("NVML-only client (python3)", agent.pid)
    suite.describe("fork-inherited culprit", child)
    suite.describe("the exporter (an NVML client too)", suite.exporter.proc.pid)
    rc, doc = suite.check_json(record="NVML-only client beside a fork orphan")
    gpu = gpu0(doc)
    bystander = find(gpu["bystanders"], agent.pid)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("the client is a bystander", True, bystander is not None)
    suite.expect("its evidence says no_context", True,
                 bystander is not None and "no_context" in kinds(bystander))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    suite.expect("the client is not a kill target", False, agent.pid in kill_targets(gpu))
    text = suite.check(record="NVML-only client beside a fork orphan")
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    suite.expect("the client is not in the kill line", False, agent.pid in (kill_line(text.stdout) or []))
    suite.expect("the client is named as not blamed", True,
                 re.search(rf"note: Not blamed, holding the device file without a context on GPU 0: .*"
                           rf"PID {agent.pid} \(", text.stdout) is not None)
    suite.expect("check's last line", "exit status 1: orphaned memory found", exit_line(text.stdout))
    s = suite.exporter.scrape(record="NVML-only client beside a fork orphan")
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    suite.expect("culprits", 1, holders(s, "culprit"))
    suite.expect("bystanders >= 1", True, holders(s, "bystander") >= 1)
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()
    rc, doc = suite.check_json()
    suite.expect("check exit after killing the child", 0, rc)


@scenario(11, "dataloader", "three children")
def dataloader_children(suite):
    """Three forked DataLoader-like children of one owner, which exits."""
    owner = suite.owner("fork", 6 * GiB, children=3)
    owner.proc.wait()
    dead, kids = owner.proc.pid, sorted(owner.children)
    for kid in kids:
        suite.spawned.add_pid(kid)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    for kid in kids:
        suite.describe(f"child {kid}", kid)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", kids, pids(gpu["culprits"]))
    suite.expect("check --json kill targets", kids, kill_targets(gpu))
    text = suite.check(record="three children")
    suite.expect("suggested kill line", kids, sorted(kill_line(text.stdout) or []))
    s = suite.exporter.scrape()
    suite.expect("holders named (vram_holder_info)", kids, holder_pids(s))
    for kid in kids[:2]:
        os.kill(kid, signal.SIGKILL)
    wait_for("two children to end", lambda: all(proc_state(kid) in (None, "Z") for kid in kids[:2]))
    rc, doc = suite.check_json()
    suite.expect("after killing two: check exit", 1, rc)
    suite.expect("after killing two: culprits", kids[2:], pids(gpu0(doc)["culprits"]))
    text = suite.check(record="three children, two killed")
    suite.expect("after killing two: kill line", kids[2:], kill_line(text.stdout))
    os.kill(kids[2], signal.SIGKILL)
    freed = suite.wait_freed()
    suite.expect("freed after killing the last (s < 2)", True, freed < 2)
    rc, doc = suite.check_json()
    suite.expect("check exit after killing all three", 0, rc)


@scenario(12, "orphan-pidns", "orphan in PID namespace")
def orphan_in_pid_namespace(suite):
    """A fork orphan inside a PID namespace (a shell is its PID 1), the exporter on the
    host: the culprit is named by its host PID."""
    owner = suite.owner("fork", 4 * GiB, prefix=(
        "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
        "sh", "-c", '"$@"; exec sleep 600', "sh"))
    [inner] = owner.children
    [init] = children_of(owner.proc.pid)
    namespace = pid_namespace(init)
    # The shell execs sleep once the owner has exited.
    wait_for("the owner to exit", lambda: comm_of(init) == "sleep")
    [host_child] = host_pids(inner, namespace)
    suite.spawned.add_pid(host_child)
    wait_for("the dead owner to be listed", lambda: suite.charges())
    suite.describe("culprit in a PID namespace (host PID)", host_child)
    suite.expect("child's host PID differs from its namespace PID", True, host_child != inner)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits (host PID)", [host_child], pids(gpu["culprits"]))
    suite.expect("check --json kill targets", [host_child], kill_targets(gpu))
    text = suite.check(record="fork orphan in a PID namespace")
    suite.expect("suggested kill line", [host_child], kill_line(text.stdout))
    s = suite.exporter.scrape()
    suite.expect("holder named (vram_holder_info)", [host_child], holder_pids(s))
    suite.expect("gone owners", 1, owners(s, "gone"))
    os.kill(host_child, signal.SIGKILL)
    suite.wait_freed()


@scenario(13, "zombie-culprit", "zombie-leader culprit")
def zombie_leader_culprit(suite):
    """The forked child's main thread calls pthread_exit while another thread lives: its
    /proc/PID/fd and maps are empty, its task's are not."""
    owner = suite.owner("fork", 4 * GiB, child_kind="zombie-leader")
    owner.proc.wait()
    [child] = owner.children
    suite.spawned.add_pid(child)
    wait_for("the child's main thread to be a zombie", lambda: proc_state(child) == "Z")
    suite.describe("zombie-leader culprit", child)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("culprit state", "zombie", (find(gpu["culprits"], child) or {}).get("state"))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    text = suite.check(record="zombie-leader culprit")
    suite.expect("sentence names it as a zombie", True,
                 re.search(rf"still held by PID {child} \([^,]+, zombie, ", text.stdout) is not None)
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    s = suite.exporter.scrape()
    suite.expect("vram_holder_info (pid, state)", [(str(child), "zombie")],
                 [(l["pid"], l["state"]) for l in series(s, "vram_holder_info", gpu=0)])
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()


@scenario(14, "reuse", "PID reuse")
def pid_reuse(suite):
    """The dead owner's PID is handed to an NVML-only client. The owner runs in the
    suite's session: the kernel keeps a PID from reuse while it names a live process
    group or session, and the child keeps those alive."""
    exporter = suite.exporter
    owner = suite.owner("hold-then-fork", 4 * GiB, own_session=False)
    dead = owner.pid
    s = exporter.scrape()
    suite.expect("served exporter saw the owner live", 1, owners(s, "running"))
    [child] = owner.fork_now()
    suite.spawned.add_pid(child)
    charge = suite.charges().get(dead)
    reuser, attempts = suite.agent_at(dead)
    suite.facts["pid_reuse_attempts"] = attempts
    assert suite.expect("an NVML-only client got the dead owner's PID", True, reuser is not None), \
        f"no process could be started at PID {dead} in {attempts} attempts"
    suite.describe("NVML-only client at the dead owner's PID", dead)
    suite.describe("fork-inherited culprit", child)
    rc, doc = suite.check_json(record="PID reused by an NVML-only client")
    gpu = gpu0(doc)
    owner_doc = find(gpu["owners"], dead) or {}
    detail = owner_doc.get("detail") or {}
    suite.expect("check exit status", 1, rc)
    suite.expect("owner gone, reason reused", ("gone", "reused"), (owner_doc.get("state"), detail.get("reason")))
    suite.expect("reused by the client (its start time)", start_ticks(dead),
                 (detail.get("by") or {}).get("start_time_ticks"))
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    bystander = find(gpu["bystanders"], dead)
    suite.expect("the client is a bystander with no_context", True,
                 bystander is not None and "no_context" in kinds(bystander))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    suite.expect("the client is not a kill target", False, dead in kill_targets(gpu))
    text = suite.check(record="PID reused by an NVML-only client")
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    suite.expect("the client is not in the kill line", False, dead in (kill_line(text.stdout) or []))
    suite.expect("check says the PID names another process", True,
                 re.search(rf"PID {dead}(?: \([^)]*\))? is gone: the PID now names PID {dead} ", text.stdout)
                 is not None)
    s = exporter.scrape(record="PID reused by an NVML-only client")
    suite.expect("vram_gone_owner_processes{reason=reused}", 1,
                 value(s, "vram_gone_owner_processes", gpu=0, reason="reused"))
    suite.expect("gone owners", 1, owners(s, "gone"))
    suite.expect("orphaned owner_gone = dead PID's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()


@scenario(15, "exporter-hostproc", "exporter ns, host /proc")
def exporter_in_pid_namespace_with_host_proc(suite):
    """The exporter in its own PID namespace reading the host's /proc (a container without
    hostPID that mounts the host's /proc at another path and passes --path.procfs), a live
    owner beside it in the namespace: NVML names the owner by its namespace PID (2), which
    is the host's kthreadd in the host's /proc. The namespace has its own /proc too, as a
    container has: CUDA reads /proc/<its own PID> and fails to start (error 304) where
    /proc is another namespace's."""
    host_proc = tempfile.mkdtemp(prefix="host-proc-")
    subprocess.run(["mount", "--bind", "/proc", host_proc], check=True)
    try:
        run_exporter_in_pid_namespace_with_host_proc(suite, host_proc)
    finally:
        subprocess.run(["umount", "--lazy", host_proc], check=False)
        os.rmdir(host_proc)


def run_exporter_in_pid_namespace_with_host_proc(suite, host_proc):
    port = free_port()
    log_path = os.path.join(suite.out, "exporter-pidns.log")
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    stderr = tempfile.TemporaryFile(mode="w+")
    script = ('python=$1 program=$2 bytes=$3 log=$4; shift 4; '
              '"$python" -c "$program" hold "$bytes" 0 sleep & exec "$@" >>"$log" 2>&1')
    proc = suite.spawned.add(subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh",
         sys.executable, suite.gpu.owner_program, str(2 * GiB), log_path]
        + suite.argv("--web.listen-address", f"127.0.0.1:{port}", "--path.procfs", host_proc),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True, env=suite.gpu.env("hostproc")), group=True)
    owner = Owner(proc, stderr)
    inner = owner.line("READY")[0]
    exporter = Exporter(suite, "in a PID namespace, host /proc", proc, port, log_path, offset)
    [init] = children_of(proc.pid)
    owner_host = [pid for pid in host_pids(inner, pid_namespace(init)) if comm_of(pid) != "vram-exporter"]
    suite.expect("owner's PID in the namespace", 2, inner)
    wait_for("the owner to be listed", lambda: suite.charges())
    charge = suite.charges().get(owner_host[0]) if owner_host else None
    suite.describe("owner in the exporter's namespace (host PID)", owner_host[0])
    s = exporter.scrape(record="exporter in its own PID namespace, host /proc")
    suite.expect("procfs shows its own PID namespace", 0, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("host PID namespace", 0, value(s, "vram_host_pid_namespace"))
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("owned bytes (running) = NVML charge", charge,
                 value(s, "vram_owned_bytes", gpu=0, state="running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    rc, doc = suite.check_json(prefix=("nsenter", "--target", str(init), "--pid", "--"), view="hostproc",
                               record="check inside that namespace")
    owner_doc = find(gpu0(doc)["owners"], inner) or {}
    suite.expect("check inside: exit status", 0, rc)
    suite.expect("check inside: owner running, host PID in procfs_pid", ("running", owner_host[0]),
                 (owner_doc.get("state"), (owner_doc.get("process") or {}).get("procfs_pid")))
    exporter.stop()


@scenario(16, "mps", "MPS", "mps-live", "mps-killed", "mps-fork", "17", "18")
def mps(suite):
    """A GPU shared through MPS (the real control daemon, with pipe and log directories of
    its own): 16 a live client, 17 a client killed, 18 a client that forks a child (which
    never touches CUDA) and exits. The control daemon and its server hold the GPU's device
    file; neither may be blamed or put into a kill line; the child alone is the culprit,
    and killing it frees the memory. MPS is ended with `quit` however the scenario ends."""
    work = tempfile.mkdtemp(prefix="vram-mps-")
    directories = dict(CUDA_MPS_PIPE_DIRECTORY=os.path.join(work, "pipe"),
                       CUDA_MPS_LOG_DIRECTORY=os.path.join(work, "log"))
    for folder in directories.values():
        os.makedirs(folder)
    env = dict(suite.gpu.env(), **directories)
    daemon = None
    try:
        daemon = suite.gpu.mps_start(env)
        run_mps(suite, daemon, directories)
    finally:
        # `quit` waits for the clients to finish: end them first.
        suite.spawned.kill_all()
        suite.gpu.mps_quit(env)
        if daemon is not None:
            try:
                # Init reaps the daemon; a zombie has ended too.
                wait_for("MPS to end", lambda: proc_state(daemon) in (None, "Z") and not [
                    pid for pid in mps_daemons(directories["CUDA_MPS_PIPE_DIRECTORY"])
                    if proc_state(pid) != "Z"], limit=30)
            except AssertionError as error:
                suite.expect("MPS ended by quit", "ended", str(error), ok=False)
        shutil.rmtree(work, ignore_errors=True)


def mps_lists(suite):
    """NVML's compute and MPS lists of GPU 0: {pid: (compute bytes, MPS bytes)}."""
    reading = suite.gpu.query()
    both = {}
    for key, at in (("charges", 0), ("mps_charges", 1)):
        for pid, used in reading.get(key, {}).items():
            both.setdefault(int(pid), [None, None])[at] = used
    return {pid: tuple(used) for pid, used in both.items()}


def run_mps(suite, daemon, directories):
    exporter = suite.exporter
    facts = suite.facts.setdefault("mps", {})
    facts["daemon"] = dict(pid=daemon, start_ticks=start_ticks(daemon), comm=comm_of(daemon))

    suite.scenario = "16 MPS live client"
    live = suite.owner("hold", 3 * GiB, env=directories)
    # The daemon starts its server when the first client connects: its child.
    wait_for("the MPS server", lambda: children_of(daemon), limit=60)
    [server] = children_of(daemon)
    wait_for("the client and the server listed",
             lambda: {live.pid, server} <= set(mps_lists(suite)), limit=30)
    lists = mps_lists(suite)
    facts["live"] = dict(client=live.pid, server=server, lists={str(k): v for k, v in lists.items()})
    suite.expect("NVML: client on the compute and MPS lists", True,
                 all(used is not None for used in lists[live.pid]))
    suite.expect("NVML: server on the compute list only", True,
                 lists[server][0] is not None and lists[server][1] is None)
    suite.expect("NVML: daemon on no list", False, daemon in lists)
    suite.expect("server's parent is the daemon", daemon, int(stat_fields(server)[1]))
    for label, pid in (("MPS control daemon", daemon), ("MPS server", server), ("live MPS client", live.pid)):
        suite.describe(label, pid)
    s = exporter.scrape(record="MPS, a live client")
    suite.expect("running owners (client and server)", 2, owners(s, "running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json(record="MPS, a live client")
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json owners, running", sorted([(live.pid, "running"), (server, "running")]),
                 sorted((o["pid"], o["state"]) for o in gpu0(doc)["owners"]))

    suite.scenario = "17 MPS client killed"
    killed = suite.owner("hold", 2 * GiB, env=directories)
    wait_for("the client listed", lambda: killed.pid in mps_lists(suite))
    killed_at = time.monotonic()
    os.kill(killed.pid, signal.SIGKILL)
    killed.proc.wait()
    wait_for("the killed client's memory freed", lambda: killed.pid not in mps_lists(suite))
    freed = time.monotonic() - killed_at
    facts["killed_client_freed_seconds"] = round(freed, 3)
    suite.expect("freed by the server after SIGKILL (s < 2)", True, freed < 2)
    s = exporter.scrape(record="MPS, a client killed")
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json(record="MPS, a client killed")
    suite.expect("check exit status", 0, rc)

    suite.scenario = "18 MPS fork orphan"
    client = suite.owner("hold-then-fork", 4 * GiB, env=directories)
    dead = client.pid
    wait_for("the forking client listed", lambda: dead in mps_lists(suite))
    s = exporter.scrape()
    suite.expect("served exporter saw the client live", 3, owners(s, "running"))
    [child] = client.fork_now()
    suite.spawned.add_pid(child)
    wait_for("the dead client listed", lambda: dead in mps_lists(suite) and proc_state(dead) is None)
    lists = mps_lists(suite)
    charge = lists[dead][0]
    facts["fork"] = dict(dead_client=dead, child=child, server=server, daemon=daemon,
                         lists={str(k): v for k, v in lists.items()},
                         holders=device_holders(suite.gpu.device_prefix))
    suite.expect("NVML: dead client on the compute and MPS lists", True,
                 all(used is not None for used in lists[dead]))
    for label, pid in (("MPS control daemon", daemon), ("MPS server", server),
                       ("dead client's child", child)):
        suite.describe(label, pid)

    text = suite.check(record="MPS fork orphan")
    suite.expect("check's verdict names the child only", True,
                 names_only_the_child(text.stdout, dead, child))
    suite.expect("check exit status", 1, text.returncode)
    suite.expect("suggested kill line: the child only", [child], kill_line(text.stdout))
    note = re.search(r"^  note: Not blamed, the MPS control daemon and server, which serve every MPS "
                     r"client of GPU 0: (.*)$", text.stdout, re.M)
    note = note.group(1) if note else ""
    suite.expect("daemon listed as not blamed, with why", True, re.search(
        rf"PID {daemon} \(nvidia-cuda-mps, [^()]*the MPS control daemon: parent of MPS server PID "
        rf"{server}, listed by NVML on no GPU, leading its own session; killing it frees no "
        r"client's memory and ends MPS for every client, maps GPU 0's device file write-only: the "
        r"driver is initialised but it holds no context", note) is not None)
    suite.expect("server listed as not blamed, with why", True, re.search(
        rf"PID {server} \(nvidia-cuda-mps, [^()]*the MPS server: on GPU 0's compute list and not its "
        rf"MPS list, which names the clients, child of MPS control daemon PID {daemon}", note)
        is not None)
    rc, doc = suite.check_json(record="MPS fork orphan")
    gpu = gpu0(doc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("check --json remedy", ("kill", [child]),
                 (gpu["remedy"]["action"], kill_targets(gpu)))
    daemon_doc = find(gpu["bystanders"], daemon) or {}
    server_doc = find(gpu["bystanders"], server) or {}
    suite.expect("check --json daemon: evidence", ["mps_control_daemon", "maps_gpu_without_context",
                                                   "mps_command_name"],
                 kinds(daemon_doc) if daemon_doc else None)
    suite.expect("check --json daemon maps GPU 0 write-only", {"0": "write_only"},
                 (daemon_doc.get("mappings") or {}).get("gpus_without_read_write"))
    suite.expect("check --json server: evidence", ["mps_server", "mps_command_name"],
                 kinds(server_doc) if server_doc else None)
    s = exporter.scrape(record="MPS fork orphan (exporter started before)")
    suite.expect("orphaned owner_gone = dead client's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    suite.expect("bystanders >= 2 (daemon, server)", True, holders(s, "bystander") >= 2)
    late = Exporter.start(suite, suite.spawned, "started after the dead client", "exporter-mps.log")
    s = late.scrape(record="MPS fork orphan (exporter started after the dead client)")
    suite.expect("exporter started after: holder named", [child], holder_pids(s))
    suite.expect("exporter started after: culprits", 1, holders(s, "culprit"))
    late.stop()

    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    wait_for("the orphan freed", lambda: dead not in mps_lists(suite))
    freed = time.monotonic() - killed_at
    facts["child_kill_frees_seconds"] = round(freed, 3)
    suite.expect("killing the child frees it (s < 2)", True, freed < 2)
    rc, doc = suite.check_json(record="MPS fork orphan, child killed")
    suite.expect("check exit after killing the child", 0, rc)
    suite.expect("daemon and server still run", True,
                 proc_state(daemon) is not None and proc_state(server) is not None)


@scenario(9, "many", "many owners")
def many_owners(suite):
    """Scrape latency with many live CUDA owners, each with its real descriptor table."""
    count = suite.many_owners
    procs = [suite.spawned.add(subprocess.Popen(
        [sys.executable, "-c", suite.gpu.owner_program, "hold", str(64 << 20), "0", "sleep"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, env=suite.gpu.env()), group=True) for _ in range(count)]
    for proc in procs:
        assert read_line(proc).startswith("READY"), "an owner did not start"
    exporter = suite.exporter
    s = exporter.scrape()
    suite.expect("running owners", count, owners(s, "running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    fds = sorted(len(os.listdir(f"/proc/{proc.pid}/fd")) for proc in procs)
    times, cpu_ms = timed_scrapes(exporter, 500)
    suite.facts["many_owners"] = dict(
        owners=count,
        owner_descriptors_median=fds[len(fds) // 2],
        p50_ms=round(statistics.median(times) * 1e3, 3),
        p99_ms=round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
        cpu_ms_per_scrape=cpu_ms,
        in_exporter_ms=round(value(exporter.scrape(), "vram_scrape_duration_seconds") * 1e3, 3),
    )
    print(f"many owners: {suite.facts['many_owners']}", flush=True)


def timed_scrapes(exporter, scrapes):
    """Wall time of each scrape, sorted, and the exporter's CPU time per scrape in ms.
    Scrapes go over one kept-alive connection, as Prometheus scrapes: a new connection and
    urllib's machinery per request would time the client more than the exporter."""
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
    cpu_before = cpu_ticks(exporter.proc.pid)
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        times.append(time.perf_counter() - started)
    cpu = cpu_ticks(exporter.proc.pid) - cpu_before
    connection.close()
    times.sort()
    return times, round(cpu * 1e3 / os.sysconf("SC_CLK_TCK") / scrapes, 4)


def latency(suite, exporter, scrapes=1000, runs=20):
    """Scrape latency and CPU time of the exporter with one live owner, next to what an
    nvidia-smi-based exporter runs per scrape (the H200 row of docs/benchmarks.md's targets)."""
    times, cpu_ms = timed_scrapes(exporter, scrapes)
    smi = []
    for _ in range(runs):
        started = time.perf_counter()
        suite.gpu.nvidia_smi_pair()
        smi.append(time.perf_counter() - started)
    figures = dict(
        scrapes=scrapes,
        exporter_p50_ms=round(statistics.median(times) * 1e3, 3),
        exporter_p99_ms=round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
        exporter_cpu_ms_per_scrape=cpu_ms,
        in_exporter_ms=round(value(exporter.scrape(), "vram_scrape_duration_seconds") * 1e3, 3),
        nvidia_smi_runs=runs,
        nvidia_smi_pair_p50_ms=round(statistics.median(smi) * 1e3, 3),
    )
    figures["ratio"] = round(figures["nvidia_smi_pair_p50_ms"] / figures["exporter_p50_ms"], 1)
    compiled_client_latency(suite, exporter, figures)
    suite.facts["latency"] = figures
    suite.expect("scrape p50 faster than nvidia-smi", "> 1x",
                 f"{figures['ratio']}x: {figures['exporter_p50_ms']} vs "
                 f"{figures['nvidia_smi_pair_p50_ms']} ms, CPU {cpu_ms} ms",
                 ok=figures["ratio"] > 1)
    print(f"latency: {figures}", flush=True)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def compiled_client_latency(suite, exporter, figures):
    """The same scrapes timed by a compiled client (examples/scrape_latency.rs), whose own
    cost per request is a few microseconds where Python's is about 0.1 ms; then --soak-scrapes
    scrapes more, with the exporter's resident memory before and after them."""
    client = suite.latency_client
    suite.expect("compiled latency client given (--latency-client)", True, bool(client),
                 ok=bool(client))
    if not client:
        print("latency: no compiled client, so no soak either: build it with "
              "`cargo build --release --example scrape_latency`", flush=True)
        return
    address = f"127.0.0.1:{exporter.port}"

    def run(count, warm_up):
        done = subprocess.run([client, address, str(count), str(warm_up)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{client}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    measured = run(1000, 100)
    figures["compiled_client_p50_ms"] = round(measured["p50_us"] / 1e3, 3)
    figures["compiled_client_p99_ms"] = round(measured["p99_us"] / 1e3, 3)
    soak = suite.soak_scrapes
    rss_before = rss_kib(exporter.proc.pid)
    started = time.monotonic()
    run(soak, 0)
    figures["soak_scrapes"] = soak
    figures["soak_seconds"] = round(time.monotonic() - started, 1)
    figures["rss_kib_before_soak"] = rss_before
    figures["rss_kib_after_soak"] = rss_kib(exporter.proc.pid)
    grew = figures["rss_kib_after_soak"] - rss_before
    suite.expect(f"resident memory flat over {soak:,} scrapes", "< 1024 KiB more",
                 f"{grew:+} KiB ({rss_before} -> {figures['rss_kib_after_soak']})",
                 ok=grew < 1024)


def selected(only):
    """The scenarios --only names (by name, alias or number), in run order."""
    if not only:
        return list(SCENARIOS)
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    known = {}
    for entry in SCENARIOS:
        for name in (entry["name"], str(entry["number"]), *entry["aliases"]):
            known[name] = entry["name"]
    unknown = sorted(wanted - set(known))
    if unknown:
        names = ", ".join(f"{e['number']} {e['name']}" for e in SCENARIOS)
        raise SystemExit(f"unknown scenario {', '.join(unknown)}; known: {names}")
    names = {known[name] for name in wanted}
    return [entry for entry in SCENARIOS if entry["name"] in names]


def write_capped(path, text):
    data = text.encode()
    if len(data) > MAX_FILE_BYTES:
        data = data[:MAX_FILE_BYTES] + b"\n[cut: the rest would exceed the size limit]\n"
    with open(path, "wb") as f:
        f.write(data)


def main(argv=None, gpu=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/vram-exporter")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--only", metavar="NAME[,NAME]",
                        help="run only these scenarios (names or numbers: "
                             + ", ".join(f"{e['number']} {e['name']}" for e in SCENARIOS) + ")")
    here = os.path.dirname(os.path.abspath(__file__))
    built = [os.path.join(here, "..", "..", "target", kind, "examples", "scrape_latency")
             for kind in ("release", "debug")]
    parser.add_argument("--latency-client", default=next((b for b in built if os.path.exists(b)), None),
                        help="examples/scrape_latency built (default: target/release or "
                             "target/debug's, when there)")
    parser.add_argument("--soak-scrapes", type=int, default=100_000,
                        help="scrapes between the two readings of the exporter's resident memory")
    parser.add_argument("--owners", type=int, default=64,
                        help="live CUDA owners of the many-owner latency figure")
    args = parser.parse_args(argv)
    if args.owners < 1:
        parser.error("--owners must be at least 1 (leave scenario 9 out with --only)")
    chosen = selected(args.only)
    binary = os.path.abspath(args.binary)
    os.makedirs(args.out, exist_ok=True)
    for log in ("exporter-host.log", "exporter-pidns.log", "exporter-mps.log", "exporter-fresh.log"):
        if os.path.exists(os.path.join(args.out, log)):
            os.unlink(os.path.join(args.out, log))
    suite = Suite(binary, args.out, gpu or Gpu())
    suite.many_owners = args.owners
    suite.soak_scrapes = args.soak_scrapes
    suite.latency_client = args.latency_client and os.path.abspath(args.latency_client)
    global EVERYTHING
    EVERYTHING = Spawned()
    # A SIGTERM ends the run like Ctrl-C: every process is killed, the results written.
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    print(f"{'scenario':<28} {'check':<52} {'expected':>22} {'got':>22}  result")
    try:
        suite.scenario = "setup"
        wait_for("an idle GPU", suite.idle, limit=60)
        suite.exporter = Exporter.start(suite, EVERYTHING, "on the host", "exporter-host.log")
        for entry in chosen:
            run_scenario(suite, entry)
        suite.exporter.stop()
    finally:
        EVERYTHING.kill_all()
        suite.gpu.close()
        suite.facts["total_seconds"] = round(time.monotonic() - started, 1)
        failed = [row for row in suite.rows if not row["passed"]]
        write_capped(os.path.join(args.out, "results.json"), json.dumps(
            dict(rows=suite.rows, facts=suite.facts, failed=len(failed),
                 scenarios=[f"{e['number']} {e['name']}" for e in chosen]), indent=2, default=str))
        write_capped(os.path.join(args.out, "processes.json"),
                     json.dumps(suite.processes, indent=2, default=str))
        write_capped(os.path.join(args.out, "outputs.txt"), "\n".join(suite.outputs))
        print(f"\n{len(suite.rows) - len(failed)} passed, {len(failed)} failed "
              f"in {suite.facts['total_seconds']} s")
    return 1 if failed or not suite.rows else 0


def interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_scenario(suite, entry):
    """Run one scenario on an idle GPU; whatever it raises is a failed row, and whatever
    it started is killed before the next one."""
    suite.scenario = f"{entry['number']} {entry['title']}"
    suite.spawned = Spawned()
    started = time.monotonic()
    try:
        wait_for("an idle GPU before the scenario", suite.idle, limit=60)
        entry["run"](suite)
    except Exception as error:  # noqa: BLE001 - the row says what went wrong
        traceback.print_exc()
        suite.expect("ran to the end", "no error", f"{type(error).__name__}: {error}"[:300], ok=False)
    finally:
        suite.spawned.kill_all()
        suite.facts["durations_s"][entry["name"]] = round(time.monotonic() - started, 1)


if __name__ == "__main__":
    sys.exit(main())
