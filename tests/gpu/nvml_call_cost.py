#!/usr/bin/env python3
"""What each NVML call of a scrape costs on a real GPU, and where the exporter's scrape
time goes, with 0, 1 and N owners.

Run by hand on a GPU host (never by CI), with PyTorch for the owners:

    python3 tests/gpu/nvml_call_cost.py [--owners 0,1,64] [--calls 500] [--interval S]
        [--exporter BINARY]

For each owner count it starts that many PyTorch processes holding 64 MiB each on GPU 0,
times every call the exporter makes per GPU and scrape (the list a scrape of the fake
NVML logs with FAKE_NVML_CALL_LOG) in --calls rounds of one call each, after 20 warm-up
rounds, and prints the median and p99 in microseconds and the sum of the medians; then
the same while another thread waits in nvmlEventSetWait_v2, as the exporter's Xid
watcher does. With --exporter it then runs that exporter at debug level, scrapes it 300
times on one kept-alive connection, and prints the medians of the time it spent in NVML
and in the rest of its observation (its `observed` log lines) and of the whole scrape as
the client saw it. It only reads.
"""

import argparse
import ctypes
import http.client
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

OWNER = """
import sys, time, torch
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("READY", flush=True)
time.sleep(600)
"""
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def calls(nvml, device):
    """Each call of a scrape, by name, as a function that makes it once."""
    u = ctypes.c_uint
    out = [u() for _ in range(4)]
    text = ctypes.create_string_buffer(256)
    pci = ctypes.create_string_buffer(256)
    memory = MemoryV2(version=ctypes.sizeof(MemoryV2) | (2 << 24))
    processes = (ProcessInfo * 1024)()
    field = FieldValue(fieldId=NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
    pending = ctypes.c_int()

    def process_list(name):
        function = getattr(nvml, name)

        def call():
            count = u(len(processes))
            return function(device, ctypes.byref(count), processes)
        return call

    return {
        "nvmlSystemGetDriverVersion": lambda: nvml.nvmlSystemGetDriverVersion(text, 80),
        "nvmlDeviceGetCount_v2": lambda: nvml.nvmlDeviceGetCount_v2(ctypes.byref(out[0])),
        "nvmlDeviceGetHandleByIndex_v2": lambda: nvml.nvmlDeviceGetHandleByIndex_v2(
            0, ctypes.byref(ctypes.c_void_p())),
        "nvmlDeviceGetUUID": lambda: nvml.nvmlDeviceGetUUID(device, text, 96),
        "nvmlDeviceGetName": lambda: nvml.nvmlDeviceGetName(device, text, 96),
        "nvmlDeviceGetPciInfo_v3": lambda: nvml.nvmlDeviceGetPciInfo_v3(device, pci),
        "nvmlDeviceGetMinorNumber": lambda: nvml.nvmlDeviceGetMinorNumber(device, ctypes.byref(out[0])),
        "nvmlDeviceGetMemoryInfo_v2": lambda: nvml.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(memory)),
        "nvmlDeviceGetComputeRunningProcesses_v3": process_list("nvmlDeviceGetComputeRunningProcesses_v3"),
        "nvmlDeviceGetGraphicsRunningProcesses_v3": process_list("nvmlDeviceGetGraphicsRunningProcesses_v3"),
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": process_list("nvmlDeviceGetMPSComputeRunningProcesses_v3"),
        "nvmlDeviceGetMigMode": lambda: nvml.nvmlDeviceGetMigMode(
            device, ctypes.byref(out[0]), ctypes.byref(out[1])),
        "nvmlDeviceGetFieldValues": lambda: nvml.nvmlDeviceGetFieldValues(device, 1, ctypes.byref(field)),
        "nvmlDeviceGetRemappedRows": lambda: nvml.nvmlDeviceGetRemappedRows(
            device, *(ctypes.byref(value) for value in out)),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(
            device, ctypes.byref(pending)),
        "nvmlDeviceGetNumaNodeId": lambda: nvml.nvmlDeviceGetNumaNodeId(device, ctypes.byref(out[0])),
    }


def time_calls(nvml, device, count, interval=0.0):
    """Each call's median and p99 over `count` rounds, a round making every call once in
    the order a scrape makes them (a call repeated back to back can be answered from
    the driver's cache and look cheaper than in a scrape), and the median CPU time of
    the calling thread. With `interval`, each round starts that many seconds after the
    last, as cold as a scrape at that rate finds the driver and the CPU."""
    made = calls(nvml, device)
    statuses = {name: call() for name, call in made.items()}
    samples = {name: [] for name in made}
    cpu = {name: [] for name in made}
    for turn in range(count + 20):
        if interval and turn >= 20:
            time.sleep(interval)
        for name, call in made.items():
            started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
            call()
            if turn >= 20:
                cpu[name].append((time.thread_time_ns() - started_cpu) / 1000)
                samples[name].append((time.perf_counter_ns() - started) / 1000)
    rows = {}
    for name, taken in samples.items():
        taken.sort()
        rows[name] = {"status": statuses[name], "median_us": round(statistics.median(taken), 1),
                      "p99_us": round(taken[int(len(taken) * 0.99) - 1], 1),
                      "cpu_median_us": round(statistics.median(cpu[name]), 1)}
    return rows


def report(title, rows):
    print(f"\n## {title}")
    print("| call | NVML status | median us | p99 us | CPU median us |")
    print("| --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        print(f"| {name} | {row['status']} | {row['median_us']} | {row['p99_us']} "
              f"| {row['cpu_median_us']} |")
    total = sum(row["median_us"] for row in rows.values())
    print(f"sum of the medians: {total:.1f} us")
    return total


class XidWaiter:
    """A thread waiting in nvmlEventSetWait_v2 for GPU 0's critical Xid events, as the
    exporter's Xid watcher does (one second at a time)."""

    def __init__(self, nvml, device):
        self.nvml, self.stop = nvml, threading.Event()
        self.events = ctypes.c_void_p()
        assert nvml.nvmlEventSetCreate(ctypes.byref(self.events)) == 0
        critical_xid = 0x8
        assert nvml.nvmlDeviceRegisterEvents(device, ctypes.c_ulonglong(critical_xid), self.events) == 0
        self.thread = threading.Thread(target=self.wait)
        self.thread.start()

    def wait(self):
        data = ctypes.create_string_buffer(64)
        while not self.stop.is_set():
            self.nvml.nvmlEventSetWait_v2(self.events, data, 1000)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.nvml.nvmlEventSetFree(self.events)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exporter_split(binary, scrapes=300):
    """Medians of the exporter's NVML time, the rest of its observation, and the scrape."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    exporter = subprocess.Popen([binary, "--web.listen-address", f"127.0.0.1:{port}",
                                 "--log.level", "debug"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                connection.request("GET", "/metrics")
                connection.getresponse().read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the exporter did not answer"
                time.sleep(0.1)
        whole = []
        for _ in range(scrapes):
            started = time.perf_counter_ns()
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            response.read()
            whole.append((time.perf_counter_ns() - started) / 1000)
            assert response.status == 200
    finally:
        exporter.terminate()
        exporter.wait()
    log.seek(0)
    lines = [line for line in log if "msg=observed" in line][-scrapes:]
    field = lambda name: statistics.median(
        float(re.search(name + r"=([0-9.e-]+)", line).group(1)) * 1e6 for line in lines)
    return {"scrapes": len(lines), "nvml_us": round(field("nvml_seconds"), 1),
            "rest_of_observation_us": round(field("rest_seconds"), 1),
            "scrape_us": round(statistics.median(whole), 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", default="0,1,64")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--exporter")
    parser.add_argument("--interval", type=float, default=0.0,
                        help="seconds between rounds (0: back to back)")
    args = parser.parse_args()
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    device = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
    figures = {}
    owners = []
    try:
        for count in (int(word) for word in args.owners.split(",")):
            started = [subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE,
                                        text=True) for _ in range(count - len(owners))]
            owners += started
            for owner in started:
                assert owner.stdout.readline().strip() == "READY", "an owner did not start"
            title = f"GPU 0, {count} owners"
            figures[title] = {"nvml_calls_us": report(
                title, time_calls(nvml, device, args.calls, args.interval))}
            waiter = XidWaiter(nvml, device)
            try:
                waiting = title + ", another thread waiting for Xid events"
                figures[title]["while_waiting_for_xid_us"] = report(
                    waiting, time_calls(nvml, device, args.calls, args.interval))
            finally:
                waiter.close()
            if args.exporter:
                split = exporter_split(args.exporter)
                print(f"exporter: {split}")
                figures[title]["exporter"] = split
    finally:
        for owner in owners:
            owner.kill()
            owner.wait()
    print("\n" + json.dumps(figures))


if __name__ == "__main__":
    main()
