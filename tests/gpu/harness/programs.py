"""What the suite runs beside the exporter: the programs of a GPU owner, a server, a
launcher and an NVML-only client, the NVML query, and the real GPU they run on
(dry_run.py swaps in stand-ins)."""

import json
import os
import shutil
import subprocess
import sys

from harness.procfs import mps_daemons, wait_for


GiB = 1 << 30
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

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
