"""What /proc says of a process (state, start time, CPU time, PID namespace, the device
files it holds and maps), and waiting for a condition."""

import os
import time


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
