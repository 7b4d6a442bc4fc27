#!/usr/bin/env python3
"""What each NVML call of a scrape costs on a real GPU, with no owner and with N owners.

Run by hand on a GPU host (never by CI), with PyTorch for the owners:

    python3 tests/gpu/nvml_call_cost.py [--owners 64] [--calls 500]

For GPU 0 it times every call the exporter makes per GPU and scrape (the list a scrape
of the fake NVML logs with FAKE_NVML_CALL_LOG), each --calls times after 20 warm-up
calls, and prints the median and p99 in microseconds, then the sum of the medians: the
NVML part of one GPU's scrape. It then starts --owners PyTorch processes holding 64 MiB
each on GPU 0 and times the calls again, and kills them. It only reads.
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
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


def time_calls(nvml, device, count):
    rows = {}
    for name, call in calls(nvml, device).items():
        status = call()
        for _ in range(20):
            call()
        samples = []
        for _ in range(count):
            started = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - started) / 1000)
        samples.sort()
        rows[name] = {"status": status, "median_us": round(statistics.median(samples), 1),
                      "p99_us": round(samples[int(len(samples) * 0.99) - 1], 1)}
    return rows


def report(title, rows):
    print(f"\n## {title}")
    print("| call | NVML status | median us | p99 us |")
    print("| --- | --- | --- | --- |")
    for name, row in rows.items():
        print(f"| {name} | {row['status']} | {row['median_us']} | {row['p99_us']} |")
    total = sum(row["median_us"] for row in rows.values())
    print(f"sum of the medians: {total:.1f} us")
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=64)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    device = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
    figures = {"no owner": report("GPU 0, no owner", time_calls(nvml, device, args.calls))}
    owners = []
    try:
        for _ in range(args.owners):
            owners.append(subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE,
                                           text=True))
        for owner in owners:
            assert owner.stdout.readline().strip() == "READY", "an owner did not start"
        title = f"GPU 0, {args.owners} owners"
        figures[title] = report(title, time_calls(nvml, device, args.calls))
    finally:
        for owner in owners:
            owner.kill()
            owner.wait()
    print("\n" + json.dumps(figures))


if __name__ == "__main__":
    main()
