#!/usr/bin/env python3
"""What /proc and NVML show of each process on a GPU shared through MPS: the facts the
culprit rule under MPS rests on (docs/gpu-validation.md, "MPS").

Run by hand on a GPU host with MPS available (never by CI), as root:

    python3 tests/gpu/mps_facts.py --out DIR

It starts the MPS control daemon with its own pipe and log directories, a live client
(3 GiB), and a client that allocates 4 GiB, forks a child that never touches CUDA, and
exits (the fork orphan under MPS). For the control daemon, the MPS server, the live
client and the dead client's child it records what tells them apart: identity (PID,
start time, parent, process group, session, user, executable), every descriptor to a
device file or a socket, every shared mapping of a device file (file, permissions,
offset), the unix sockets each end is bound or connected to, and what NVML lists on
each of its three lists. Then it kills the child alone and times how long the driver
takes to free the memory, and ends MPS with `quit`. It writes mps_facts.json to --out
and prints a summary. It never resets the GPU or changes its settings.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30

CLIENT = r"""
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda')
x.fill_(1)
torch.cuda.synchronize()
if sys.argv[2] == 'fork':
    kid = os.fork()
    if kid == 0:
        time.sleep(600)
        os._exit(0)
    print('CHILD', kid, os.getpid(), flush=True)
    sys.stdin.readline()
    os._exit(0)
print('READY', os.getpid(), flush=True)
time.sleep(600)
"""


def nvml_lists():
    """used memory and each of NVML's three lists, pid -> bytes, in a fresh process so
    that this one holds no NVML descriptors while the others are described."""
    code = r"""
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
mem = Mem2(); mem.version = ctypes.sizeof(Mem2) | (2 << 24)
assert lib.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(mem)) == 0
out = dict(used=mem.used)
for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
             "nvmlDeviceGetMPSComputeRunningProcesses_v3"):
    count = ctypes.c_uint(64); procs = (Proc * 64)()
    rc = getattr(lib, name)(dev, ctypes.byref(count), procs)
    out[name] = {str(p.pid): p.used for p in procs[: count.value]} if rc == 0 else f"error {rc}"
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"NVML could not be asked for its process lists: {done.stderr[-500:]}")
    return json.loads(done.stdout)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as error:
        return f"<{error.strerror}>"


def stat_fields(pid):
    text = read(f"/proc/{pid}/stat")
    if text.startswith("<"):
        return None
    rest = text.rsplit(")", 1)[1].split()
    return dict(state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]),
                start_ticks=int(rest[19]), threads=int(rest[17]))


def unix_sockets():
    """inode -> bound path of every unix socket (peers of a connection show no path)."""
    found = {}
    for line in read("/proc/net/unix").splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 7:
            found[parts[6]] = parts[7] if len(parts) > 7 else ""
    return found


def describe(pid, sockets):
    facts = dict(pid=pid, comm=read(f"/proc/{pid}/comm").strip())
    facts.update(stat_fields(pid) or {"gone": True})
    try:
        facts["exe"] = os.readlink(f"/proc/{pid}/exe")
    except OSError as error:
        facts["exe"] = f"<{error.strerror}>"
    facts["cmdline"] = read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
    status = read(f"/proc/{pid}/status")
    facts["uid"] = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), None)
    environ = read(f"/proc/{pid}/environ").split("\0")
    facts["mps_environment"] = sorted(v for v in environ if v.startswith("CUDA_MPS"))
    descriptors = {}
    try:
        for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = target[len("socket:["):-1]
                target = f"socket {sockets.get(inode, '?') or '(unnamed peer)'}"
            elif not (target.startswith("/dev/nvidia") or "mps" in target or target.startswith("/dev/shm")):
                continue
            descriptors[target] = descriptors.get(target, 0) + 1
    except OSError as error:
        descriptors = {"error": error.strerror}
    facts["descriptors"] = descriptors
    mappings = {}
    for line in read(f"/proc/{pid}/maps").splitlines():
        parts = line.split()
        if len(parts) >= 6 and (parts[5].startswith("/dev/nvidia") or parts[5].startswith("/dev/shm")):
            key = f"{parts[5]} {parts[1]}"
            mappings.setdefault(key, []).append(parts[2])
    facts["mappings"] = {key: dict(lines=len(offsets), offsets=offsets[:6]) for key, offsets in sorted(mappings.items())}
    facts["device_mapping_lines"] = sum(
        len(offsets) for key, offsets in mappings.items() if key.startswith("/dev/nvidia") and key.split()[1][3] == "s")
    return facts


def pids_of(executable_name):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.path.basename(os.readlink(f"/proc/{entry}/exe")) == executable_name:
                    found.append(int(entry))
            except OSError:
                continue
    return sorted(found)


def wait_for(what, predicate, limit=60.0):
    started = time.monotonic()
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() - started > limit:
            raise TimeoutError(what)
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    control = shutil.which("nvidia-cuda-mps-control") or "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
    work = tempfile.mkdtemp(prefix="mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{work}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{work}/log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"]), os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    # The daemon and server are found by name: another MPS on this host would be described
    # in their place.
    if pids_of("nvidia-cuda-mps-control") or pids_of("nvidia-cuda-mps-server"):
        raise SystemExit("an MPS control daemon or server already runs here: stop it first")
    facts = dict(before=nvml_lists())
    started = []
    try:
        subprocess.run([control, "-d"], env=env, check=True, timeout=30)
        daemon = wait_for("the control daemon", lambda: pids_of("nvidia-cuda-mps-control"))[0]
        live = subprocess.Popen([sys.executable, "-c", CLIENT, str(3 * GiB), "live"], env=env,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        started.append(live)
        live_pid = int(live.stdout.readline().split()[1])
        server = wait_for("the MPS server", lambda: pids_of("nvidia-cuda-mps-server"))[0]
        forker = subprocess.Popen([sys.executable, "-c", CLIENT, str(4 * GiB), "fork"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        started.append(forker)
        _, child, dead_client = forker.stdout.readline().split()
        child, dead_client = int(child), int(dead_client)
        facts["dead_client_while_alive"] = describe(dead_client, unix_sockets())
        forker.stdin.write("exit\n")
        forker.stdin.flush()
        forker.wait(timeout=60)
        wait_for("the dead client to be gone", lambda: not os.path.exists(f"/proc/{dead_client}"))
        wait_for("NVML to list the dead client",
                 lambda: str(dead_client) in json.dumps(nvml_lists()), limit=20)
        facts["with_orphan"] = nvml_lists()
        sockets = unix_sockets()
        facts["processes"] = dict(
            control_daemon=describe(daemon, sockets), server=describe(server, sockets),
            live_client=describe(live_pid, sockets), dead_client_child=describe(child, sockets))
        facts["dead_client"] = dead_client
        facts["dead_client_pid_exists"] = os.path.exists(f"/proc/{dead_client}")
        facts["pipe_directory"] = sorted(os.listdir(env["CUDA_MPS_PIPE_DIRECTORY"]))
        killed_at = time.monotonic()
        os.kill(child, signal.SIGKILL)
        try:
            wait_for("the orphan to be freed",
                     lambda: str(dead_client) not in json.dumps(nvml_lists()), limit=20)
            facts["child_kill_frees_seconds"] = round(time.monotonic() - killed_at, 3)
        except TimeoutError:
            facts["child_kill_frees_seconds"] = None
        facts["after_child_kill"] = nvml_lists()
    finally:
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        subprocess.run([control], input="quit\n", env=env, text=True, timeout=30)
        wait_for("MPS to end", lambda: not pids_of("nvidia-cuda-mps-control") and not pids_of("nvidia-cuda-mps-server"), 30)
        facts["after_quit"] = nvml_lists()
        with open(os.path.join(args.out, "mps_facts.json"), "w") as f:
            json.dump(facts, f, indent=1)
    for role, process in facts.get("processes", {}).items():
        print(f"{role:18} pid {process['pid']:>6} comm {process['comm']:16} ppid {process.get('ppid')} "
              f"pgid {process.get('pgid')} sid {process.get('sid')} start {process.get('start_ticks')} "
              f"device mapping lines {process['device_mapping_lines']}")
        print(f"{'':18} exe {process['exe']}")
        for key, value in process["mappings"].items():
            print(f"{'':18}   maps {key}: {value['lines']} at {value['offsets']}")
        for key, value in process["descriptors"].items():
            print(f"{'':18}   holds {key} x{value}")
    print("NVML with the orphan:", json.dumps(facts.get("with_orphan")))
    print("killing the child alone freed it after", facts.get("child_kill_frees_seconds"), "s")


if __name__ == "__main__":
    main()
