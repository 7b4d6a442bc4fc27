#!/usr/bin/env python3
"""Try the real-GPU suite (run.py) on a machine without a GPU, before spending GPU time.

    python3 tests/gpu/dry_run.py --binary target/release/vram-exporter \
        --library target/release/libfake_nvml.so --out DIR [--only NAME[,NAME]] [--owners 8]

It runs every scenario of run.py unchanged, with stand-ins for what needs the GPU: the
fake NVML (docs/fake-nvml.md) for the driver's answers, files standing in for
/dev/nvidia0, /dev/nvidiactl and /dev/nvidia-uvm, owners that open and map those files
instead of allocating with PyTorch, an NVML client that opens them without mapping, an
MPS control program that daemonises, maps the GPU's file write-only and nvidiactl's
read-only as the real daemon does, starts a server (an owner of its own, listed on the
compute list alone) and quits when told, MPS clients (owners run with MPS's pipe
directory, listed on the compute and MPS lists), and a pause as long as nvidia-smi takes. A small driver model keeps the fake NVML's answers true to the
processes: an owner registers a context (its PID, PID namespace and bytes) in a file it
holds locked; like the real driver, which frees a context when the last reference to its
device file closes, the model frees it when no process holds that file any more. Each
exporter sees the PIDs of its own PID namespace, as the real driver translates them.

It proves the suite's plumbing (process handling, cleanup, parsing of check, check --json
and /metrics, the --only choice), never the GPU: timings and latency ratios mean nothing
here. Needs root, like the suite.
"""

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gpu_suite", os.path.join(HERE, "run.py"))
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)

TOTAL = 150_754_820_096
RESERVED = 644_939_776
# Memory the driver uses per context without charging any process (measured on an H200).
CONTEXT_OVERHEAD = 9_240_576

# Stands in for PyTorch's allocation: open the device files as a CUDA process does, map
# the GPU's node and the control node, and register a context the driver model charges
# to this PID for as long as any process holds the context file (children inherit it).
OWNER = r"""
import ctypes, fcntl, json, mmap, os, sys, time, uuid
mode = sys.argv[1]
dry = os.environ['VRAM_DRY_RUN_DIR']
dev = os.path.join(dry, 'dev')
# The MPS server stand-in is an owner of its own; an owner run with MPS's pipe directory
# is an MPS client, listed on the MPS list too.
server = os.environ.get('VRAM_DRY_MPS_SERVER') == '1'
if server:
    ctypes.CDLL(None).prctl(15, b'nvidia-cuda-mps', 0, 0, 0)
mps = 'CUDA_MPS_PIPE_DIRECTORY' in os.environ and not server
kept = [os.open(os.path.join(dev, 'nvidia-uvm'), os.O_RDWR)]
for name in ('nvidia0', 'nvidiactl'):
    fd = os.open(os.path.join(dev, name), os.O_RDWR)
    kept += [fd, mmap.mmap(fd, 4096, mmap.MAP_SHARED)]
context = os.path.join(dry, 'contexts', uuid.uuid4().hex)
fd = os.open(context + '.tmp', os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.flock(fd, fcntl.LOCK_SH)
os.write(fd, json.dumps(dict(pid=os.getpid(), ns=os.readlink('/proc/self/ns/pid'),
                             bytes=int(sys.argv[2]), mps=mps)).encode())
os.rename(context + '.tmp', context + '.json')
kept.append(fd)
deadline = time.monotonic() + 10
while not os.path.exists(context + '.seen'):
    assert time.monotonic() < deadline, 'the driver model did not see the context'
    time.sleep(0.005)
""" + suite.OWNER_LIFE

# Stands in for nvidia-cuda-mps-control: with -d it daemonises (its own session, parent
# init) and returns; the daemon holds the GPU's file and nvidiactl, maps the first
# write-only (twice) and the second read-only, as the real one does, starts its server
# (the owner stand-in as a program of its own, as the real server is) and waits on
# <pipe>/control. Without -d it hands what it reads (quit) to the daemon, which then
# ends its server and itself.
MPS_CONTROL = r"""
import ctypes, mmap, os, subprocess, sys
pipe = os.environ['CUDA_MPS_PIPE_DIRECTORY']
fifo = os.path.join(pipe, 'control')
if sys.argv[1:] != ['-d']:
    command = sys.stdin.read()
    with open(fifo, 'w') as f:
        f.write(command)
    sys.exit(0)
os.mkfifo(fifo)
if os.fork():
    os._exit(0)
os.setsid()
quiet = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(quiet, fd)
ctypes.CDLL(None).prctl(15, b'nvidia-cuda-mps', 0, 0, 0)
dry = os.environ['VRAM_DRY_RUN_DIR']
kept = []
for name, prot in (('nvidia0', mmap.PROT_WRITE), ('nvidia0', mmap.PROT_WRITE),
                   ('nvidiactl', mmap.PROT_READ)):
    fd = os.open(os.path.join(dry, 'dev', name), os.O_RDWR)
    kept += [fd, mmap.mmap(fd, 4096, mmap.MAP_SHARED, prot)]
server = subprocess.Popen([sys.executable, os.path.join(dry, 'owner.py'), 'hold', '69206016', '0',
                           'sleep'], env=dict(os.environ, VRAM_DRY_MPS_SERVER='1'),
                          stdin=quiet, stdout=quiet, stderr=quiet)
while True:
    with open(fifo) as f:
        if 'quit' in f.read():
            break
server.kill()
server.wait()
"""

AGENT = r"""
import os, time
dev = os.path.join(os.environ['VRAM_DRY_RUN_DIR'], 'dev')
kept = [os.open(os.path.join(dev, name), os.O_RDWR) for name in ('nvidia0', 'nvidiactl', 'nvidia-uvm')]
print('UP', flush=True)
time.sleep(600)
"""


class DryGpu(suite.Gpu):
    """The stand-ins, and the driver model that writes the fake NVML's scenario files."""

    owner_program = OWNER
    agent_program = AGENT

    def __init__(self, library):
        self.dir = tempfile.mkdtemp(prefix="vram-dry-run-")
        self.dev = os.path.join(self.dir, "dev")
        os.makedirs(self.dev)
        os.makedirs(os.path.join(self.dir, "contexts"))
        for node in ("nvidia0", "nvidiactl", "nvidia-uvm"):
            with open(os.path.join(self.dev, node), "wb") as f:
                f.write(bytes(4096))
        self.device_prefix = os.path.join(self.dev, "nvidia")
        for name, program in (("owner.py", OWNER), ("mps-control.py", MPS_CONTROL)):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(program)
        self.library = os.path.join(self.dir, "libnvidia-ml.so.1")
        os.symlink(os.path.abspath(library), self.library)
        self.host_ns = os.readlink("/proc/self/ns/pid")
        self.contexts = {}  # name: dict(host_pid, ns, pid, bytes, fd)
        self.views = {"host": self.host_ns}  # view: the PID namespace it sees, once known
        self.written = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.write_views()
        self.thread = threading.Thread(target=self.drive, daemon=True)
        self.thread.start()

    def view_path(self, view):
        return os.path.join(self.dir, f"nvml-{view}.json")

    def exporter_args(self):
        return ["--nvml.library", self.library, "--test.device-prefix", self.device_prefix]

    def env(self, view=None):
        view = view or "host"
        with self.lock:
            self.views.setdefault(view, None)
        self.write_views()
        env = dict(os.environ)
        env["VRAM_DRY_RUN_DIR"] = self.dir
        env["FAKE_NVML_SCENARIO"] = self.view_path(view)
        return env

    def query(self):
        # What the harness is told, the exporter's files say too: written now, not at the
        # driver model's next turn, or a scrape right after this could read the turn before.
        self.write_views()
        with self.lock:
            processes, used = self.listing(self.host_ns)
        return dict(used=used, charges={str(p["pid"]): p["used_bytes"] for p in processes},
                    mps_charges={str(p["pid"]): p["used_bytes"] for p in processes if p["mps"]})

    def mps_control(self):
        return [sys.executable, os.path.join(self.dir, "mps-control.py")]

    def nvidia_smi_pair(self):
        # As long as the pair takes as processes on an H200 (26.5 + 28.3 ms measured), so
        # the latency row compares against a real figure, not against `true`.
        subprocess.run(["true"], check=True)
        time.sleep(0.0265 + 0.0283)

    def close(self):
        self.stopping.set()
        self.thread.join()
        shutil.rmtree(self.dir, ignore_errors=True)

    def listing(self, namespace):
        """What NVML answers a process of `namespace`: the processes it can see, by the PID
        they have there, and the device's used memory, which counts every context."""
        processes = []
        for context in self.contexts.values():
            if namespace == self.host_ns:
                processes.append(dict(pid=context["host_pid"], used_bytes=context["bytes"],
                                      mps=context["mps"]))
            elif namespace is not None and context["ns"] == namespace:
                processes.append(dict(pid=context["pid"], used_bytes=context["bytes"],
                                      mps=context["mps"]))
        used = sum(c["bytes"] + CONTEXT_OVERHEAD for c in self.contexts.values())
        return processes, used

    def write_views(self):
        with self.lock:
            for view, namespace in self.views.items():
                processes, used = self.listing(namespace)
                listed = [dict(pid=p["pid"], used_bytes=p["used_bytes"]) for p in processes]
                body = json.dumps(dict(driver_version="580.159.04", gpus=[dict(
                    uuid="GPU-d2a00000-0000-0000-0000-000000000000", name="NVIDIA H200 (dry run)",
                    pci_bus_id="00000000:19:00.0", minor=0,
                    memory=dict(total=TOTAL, reserved=RESERVED, used=used),
                    # An MPS client is on both lists, as on the H200 (driver 580).
                    compute_processes=listed,
                    mps_processes=[entry for entry, p in zip(listed, processes) if p["mps"]],
                    # A healthy H200 as driver 580 reports it, MIG off.
                    recovery_action=0,
                    remapped_rows=dict(correctable=0, uncorrectable=0, pending=False, failure=False),
                    mig=dict(current=False, pending=False))]))
                if self.written.get(view) == body:
                    continue
                path = self.view_path(view)
                with open(path + ".tmp", "w") as f:
                    f.write(body)
                os.rename(path + ".tmp", path)
                self.written[view] = body

    def drive(self):
        while not self.stopping.is_set():
            self.register_contexts()
            self.free_contexts()
            self.locate_views()
            self.write_views()
            time.sleep(0.01)

    def register_contexts(self):
        folder = os.path.join(self.dir, "contexts")
        for entry in os.listdir(folder):
            name, _, extension = entry.rpartition(".")
            if extension != "json" or name in self.contexts:
                continue
            path = os.path.join(folder, entry)
            with open(path) as f:
                facts = json.load(f)
            found = suite.host_pids(facts["pid"], facts["ns"])
            if len(found) != 1:
                continue  # not visible yet; the owner waits for .seen
            fd = os.open(path, os.O_RDONLY)
            with self.lock:
                self.contexts[name] = dict(host_pid=found[0], ns=facts["ns"], pid=facts["pid"],
                                           bytes=facts["bytes"], mps=facts["mps"], fd=fd)
            open(os.path.join(folder, name + ".seen"), "w").close()

    def free_contexts(self):
        for name, context in list(self.contexts.items()):
            try:
                fcntl.flock(context["fd"], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a process still holds it
            with self.lock:
                del self.contexts[name]
            os.close(context["fd"])
            for extension in ("json", "seen"):
                os.unlink(os.path.join(self.dir, "contexts", f"{name}.{extension}"))

    def locate_views(self):
        """The PID namespace of each view's exporter or check, once one runs."""
        with self.lock:
            unknown = {self.view_path(view).encode(): view
                       for view, namespace in self.views.items() if namespace is None}
        if not unknown:
            return
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or suite.comm_of(entry) != "vram-exporter":
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            for variable in environ:
                view = unknown.get(variable.partition(b"=")[2]) if variable.startswith(b"FAKE_NVML_SCENARIO=") else None
                if view:
                    with self.lock:
                        self.views[view] = suite.pid_namespace(entry)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--library", default="target/release/libfake_nvml.so",
                        help="the fake NVML (cargo build --release -p fake-nvml)")
    args, rest = parser.parse_known_args()
    if not os.path.exists(args.library):
        raise SystemExit(f"no fake NVML at {args.library}: cargo build --release -p fake-nvml")
    if not any(arg.startswith("--owners") for arg in rest):
        rest += ["--owners", "8"]
    # The soak is for the real GPU's figure; here it only proves the plumbing.
    if not any(arg.startswith("--soak-scrapes") for arg in rest):
        rest += ["--soak-scrapes", "2000"]
    return suite.main(rest, gpu=DryGpu(args.library))


if __name__ == "__main__":
    sys.exit(main())
