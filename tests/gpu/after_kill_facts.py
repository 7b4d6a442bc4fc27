#!/usr/bin/env python3
"""What NVML and /proc show after a kill, on a real GPU: the facts the four branches of
the story rest on (docs/how-it-decides.md, "After a kill").

Run by hand on a GPU host, as root, with PyTorch (never by CI):

    python3 tests/gpu/after_kill_facts.py --out DIR [--sizes 2,20,70] [--rounds 3]

1. Being freed: an owner holding N GiB (written, so resident) is SIGKILLed; its
   /proc/PID/stat (state, and the PF_EXITING flag of a task in its exit path) and NVML
   (v2 used, the compute list) are polled until the memory is back, and the moments each
   changed are recorded.
2. Left behind: a server in its own session starts two torch.multiprocessing spawn
   workers (2 GiB each) and is SIGKILLed; each worker's parent, process group, session,
   controlling terminal and command line are recorded before and after, with who adopted
   it and whether the group's and the session's leaders live.
3. Meant to run alone: a launcher starts an owner in a session of its own and exits
   (a service's shape); the same facts.

It writes facts.json to --out and prints one line per figure. Every process it starts is
killed however it ends; it never resets the GPU or changes its settings.
"""

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

GiB = 1 << 30
PF_EXITING = 0x4

NVML = ctypes.CDLL("libnvidia-ml.so.1")


class Memory2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Process(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def nvml_ok(code, what):
    if code != 0:
        raise RuntimeError(f"{what}: NVML error {code}")


nvml_ok(NVML.nvmlInit_v2(), "nvmlInit_v2")
DEVICE = ctypes.c_void_p()
nvml_ok(NVML.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(DEVICE)), "handle of GPU 0")


def used():
    memory = Memory2()
    memory.version = ctypes.sizeof(Memory2) | (2 << 24)
    nvml_ok(NVML.nvmlDeviceGetMemoryInfo_v2(DEVICE, ctypes.byref(memory)), "memory")
    return memory.used


def listed():
    count = ctypes.c_uint(64)
    processes = (Process * 64)()
    nvml_ok(
        NVML.nvmlDeviceGetComputeRunningProcesses_v3(DEVICE, ctypes.byref(count), processes),
        "compute processes",
    )
    return {p.pid: p.usedGpuMemory for p in processes[: count.value]}


def stat(pid):
    """state, ppid, pgrp, session, tty_nr, flags, start of /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            line = file.read()
    except OSError:
        return None
    fields = line.rsplit(")", 1)[1].split()
    return {
        "comm": line[line.index("(") + 1 : line.rindex(")")],
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgrp": int(fields[2]),
        "session": int(fields[3]),
        "tty_nr": int(fields[4]),
        "flags": int(fields[6]),
        "start": int(fields[19]),
    }


def threads(pid):
    """`live/exiting` threads of a process (PF_EXITING in each task's stat)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return "-"
    flags = [stat(f"{pid}/task/{tid}") for tid in tids]
    flags = [f["flags"] for f in flags if f]
    return f"{sum(1 for f in flags if not f & PF_EXITING)}/{sum(1 for f in flags if f & PF_EXITING)}"


def status_lines(pid, names=("SigPnd", "ShdPnd", "Threads")):
    try:
        with open(f"/proc/{pid}/status") as file:
            return {
                line.split(":")[0]: line.split(":", 1)[1].strip()
                for line in file
                if line.split(":")[0] in names
            }
    except OSError:
        return None


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def lineage(pid):
    """What /proc says of a process's place: itself, its parent, its group's and its
    session's leaders (alive, and started before it or not)."""
    own = stat(pid)
    if own is None:
        return None

    def leader(leader_pid):
        facts = stat(leader_pid)
        if facts is None:
            return {"pid": leader_pid, "alive": False}
        return {
            "pid": leader_pid,
            "alive": True,
            "comm": facts["comm"],
            "started_before": facts["start"] <= own["start"],
        }

    return {
        "pid": pid,
        "stat": own,
        "cmdline": cmdline(pid),
        "parent": leader(own["ppid"]),
        "group_leader": leader(own["pgrp"]),
        "session_leader": leader(own["session"]),
        "status": status_lines(pid),
    }


OWNER = r"""
import os, sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda')
x.fill_(1)
torch.cuda.synchronize()
print('READY', os.getpid(), flush=True)
time.sleep(600)
"""

# A server with two spawn workers, as vLLM's engine and SGLang's schedulers are started.
# A spawn child of a `python3 -c` program cannot import a function of its __main__, so
# each worker runs its code through the builtin exec.
WORKER = """
import os, time, torch
x = torch.empty(size, dtype=torch.uint8, device='cuda')
x.fill_(1)
torch.cuda.synchronize()
ready.put(os.getpid())
time.sleep(600)
"""
SERVER = r"""
import sys, time
import torch.multiprocessing as mp
if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    ready = ctx.Queue()
    workers = [ctx.Process(target=exec, args=(sys.argv[2], {'size': int(sys.argv[1]), 'ready': ready}))
               for _ in range(2)]
    for w in workers:
        w.start()
    pids = [ready.get(timeout=120) for _ in workers]
    print('WORKERS', *pids, flush=True)
    time.sleep(600)
"""

# A launcher that starts an owner in a session of its own and exits: a service's shape.
LAUNCHER = r"""
import subprocess, sys
owner = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],
                         start_new_session=True, stdout=subprocess.PIPE, text=True)
print(owner.stdout.readline().strip(), flush=True)
"""

STARTED = []


def start(code, *args, **kwargs):
    process = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    STARTED.append(process.pid)
    return process


def kill_everything(extra=()):
    for pid in list(STARTED) + list(extra):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_idle(baseline, limit=60):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if used() <= baseline + 64 * (1 << 20) and not listed():
            return True
        time.sleep(0.05)
    return False


def freeing(size_gib):
    """SIGKILL an owner of size_gib and record when /proc and NVML changed."""
    baseline = used()
    owner = start(OWNER, size_gib * GiB)
    line = owner.stdout.readline().split()
    pid = int(line[1])
    before = {"used": used(), "listed": listed().get(pid), "stat": stat(pid)}
    events = []
    last = None
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    reaped_at = None
    while time.monotonic() - killed < 120:
        now = time.monotonic() - killed
        facts = stat(pid)
        proc_view = (
            "gone"
            if facts is None
            else f"{facts['state']}{'+exiting' if facts['flags'] & PF_EXITING else ''}"
            f" threads {threads(pid)}"
        )
        in_use = used()
        nvml_view = (pid in listed(), in_use > baseline + 64 * (1 << 20))
        if (proc_view, nvml_view) != last:
            events.append(
                {
                    "seconds": round(now, 4),
                    "proc": proc_view,
                    "nvml_lists_pid": nvml_view[0],
                    "used_above_idle": nvml_view[1],
                    "used": in_use,
                    "wchan": open(f"/proc/{pid}/wchan").read() if facts else None,
                }
            )
            last = (proc_view, nvml_view)
        if facts is None and not nvml_view[1] and not nvml_view[0]:
            break
        if facts is not None and facts["state"] == "Z" and reaped_at is None:
            owner.wait()
            reaped_at = now
        time.sleep(0.001)
    owner.wait()
    freed_at = next(
        (e["seconds"] for e in events if not e["used_above_idle"] and not e["nvml_lists_pid"]),
        None,
    )
    return {"gib": size_gib, "before": before, "events": events, "freed_seconds": freed_at}


def left_behind():
    baseline = used()
    server = start(SERVER, 2 * GiB, WORKER, start_new_session=True)
    line = server.stdout.readline().split()
    workers = [int(pid) for pid in line[1:]]
    STARTED.extend(workers)
    before = {"server": lineage(server.pid), "workers": [lineage(w) for w in workers]}
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    # The workers are adopted at the server's exit: wait for their parent to change.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        (stat(w) or {}).get("ppid") == server.pid for w in workers
    ):
        time.sleep(0.01)
    after = {"workers": [lineage(w) for w in workers]}
    listed_after = listed()
    killed = time.monotonic()
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
    idle = wait_idle(baseline)
    return {
        "before": before,
        "after_server_killed": after,
        "nvml_after": {str(pid): size for pid, size in listed_after.items()},
        "pid1": {"comm": (stat(1) or {}).get("comm"), "cmdline": cmdline(1)},
        "freed_by_killing_workers_seconds": round(time.monotonic() - killed, 3) if idle else None,
    }


def alone():
    baseline = used()
    launcher = start(LAUNCHER, OWNER, 2 * GiB)
    line = launcher.stdout.readline().split()
    launcher.wait()
    pid = int(line[1])
    STARTED.append(pid)
    facts = lineage(pid)
    os.kill(pid, signal.SIGKILL)
    wait_idle(baseline)
    return {"owner": facts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="2,20,70")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    facts = {"freeing": [], "left_behind": None, "alone": None}
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            for _ in range(args.rounds):
                round_ = freeing(size)
                facts["freeing"].append(round_)
                print(
                    f"freeing {size} GiB: back at idle after {round_['freed_seconds']} s;",
                    " -> ".join(
                        f"{e['seconds']}s {e['proc']} listed={e['nvml_lists_pid']} "
                        f"used={e['used_above_idle']}"
                        for e in round_["events"]
                    ),
                    flush=True,
                )
        facts["left_behind"] = left_behind()
        print("left behind:", json.dumps(facts["left_behind"]), flush=True)
        facts["alone"] = alone()
        print("alone:", json.dumps(facts["alone"]), flush=True)
    finally:
        kill_everything()
        with open(os.path.join(args.out, "facts.json"), "w") as file:
            json.dump(facts, file, indent=1)


if __name__ == "__main__":
    main()
