#!/usr/bin/env python3
"""Which NVML call makes NVML's resident memory: RSS after each call a scrape makes, in order.

usage: python3 tests/gpu/nvml_resident.py [--library libnvidia-ml.so.1] [--out DIR]

A fresh Python process loads libnvidia-ml.so.1 through ctypes and makes, one after
another, the calls the exporter makes (init, the library-level calls, one GPU's calls of
a scrape, the process lists, the Xid event registration and a wait), reading its own
VmRSS, RssAnon and RssFile after each, and which NVIDIA libraries are mapped by then. The
interpreter's own memory is there from the start, so the figures to read are the steps'
differences. Then it makes the scrape's calls 1,000 times more, to show whether anything
grows. Writes nvml-resident.json into DIR.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

NVML_SUCCESS = 0
XID_CRITICAL_ERROR = 0x8


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


where = load("where_it_goes", "where_it_goes.py")


class Probe:
    def __init__(self, library):
        self.steps = []
        self.record("start (Python, nothing of NVIDIA's loaded)")
        self.nvml = ctypes.CDLL(library)
        self.record(f"dlopen {library}")

    def record(self, step, answer=None):
        now = where.resident(os.getpid())
        previous = self.steps[-1] if self.steps else None
        largest = now["largest_anonymous_kib"]
        self.steps.append(dict(
            step=step, answer=answer, vm_rss_kib=now["vm_rss_kib"],
            rss_anon_kib=now["rss_anon_kib"], rss_file_kib=now["rss_file_kib"],
            vm_rss_delta_kib=now["vm_rss_kib"] - (previous or now)["vm_rss_kib"],
            largest_anonymous_kib=largest[0]["resident"] if largest else 0,
            nvidia_mapped_kib={name.removeprefix("NVIDIA: "): kib
                               for name, kib in now["by_mapping_kib"].items()
                               if name.startswith("NVIDIA: ")}))

    def call(self, step, function, *args, record=True):
        answer = getattr(self.nvml, function)(*args)
        if record:
            self.record(step or function, answer)
        return answer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", default="libnvidia-ml.so.1")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--init-flags", type=lambda text: int(text, 0), default=None,
                        help="init with nvmlInitWithFlags(FLAGS) instead of nvmlInit_v2 "
                             "(NVML_INIT_FLAG_NO_GPUS 1, NVML_INIT_FLAG_NO_ATTACH 2)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    probe = Probe(args.library)
    init = (probe.call(None, "nvmlInit_v2") if args.init_flags is None else
            probe.call(f"nvmlInitWithFlags({args.init_flags:#x})", "nvmlInitWithFlags",
                       ctypes.c_uint(args.init_flags)))
    if init != NVML_SUCCESS:
        print("nvmlInit_v2 failed: no NVML to measure", file=sys.stderr)
        return 1
    count = ctypes.c_uint(0)
    probe.call(None, "nvmlDeviceGetCount_v2", ctypes.byref(count))
    version = ctypes.create_string_buffer(96)
    probe.call(None, "nvmlSystemGetDriverVersion", version, 96)
    handle = ctypes.c_void_p()
    if probe.call(None, "nvmlDeviceGetHandleByIndex_v2", 0, ctypes.byref(handle)) != NVML_SUCCESS:
        print("no GPU 0", file=sys.stderr)
        return 1
    buffer = ctypes.create_string_buffer(4096)

    def scrape(record):
        probe.call(None, "nvmlDeviceGetUUID", handle, buffer, 96, record=record)
        probe.call(None, "nvmlDeviceGetName", handle, buffer, 96, record=record)
        probe.call(None, "nvmlDeviceGetPciInfo_v3", handle, buffer, record=record)
        probe.call(None, "nvmlDeviceGetMinorNumber", handle, buffer, record=record)
        # nvmlMemory_v2_t: its version word first (struct size 40 | 2 << 24).
        ctypes.memmove(buffer, ctypes.byref(ctypes.c_uint(40 | (2 << 24))), 4)
        probe.call(None, "nvmlDeviceGetMemoryInfo_v2", handle, buffer, record=record)
        probe.call(None, "nvmlDeviceGetMigMode", handle, buffer,
                   ctypes.byref(ctypes.c_uint()), record=record)
        probe.call(None, "nvmlDeviceGetRemappedRows", handle, buffer,
                   ctypes.byref(ctypes.c_uint()), ctypes.byref(ctypes.c_uint()),
                   ctypes.byref(ctypes.c_uint()), record=record)
        for kind in ("Compute", "Graphics", "MPSCompute"):
            entries = ctypes.c_uint(64)
            probe.call(None, f"nvmlDeviceGet{kind}RunningProcesses_v3", handle,
                       ctypes.byref(entries), buffer, record=record)

    scrape(True)
    event_set = ctypes.c_void_p()
    probe.call(None, "nvmlEventSetCreate", ctypes.byref(event_set))
    probe.call("nvmlDeviceRegisterEvents (critical Xid)", "nvmlDeviceRegisterEvents", handle,
               ctypes.c_ulonglong(XID_CRITICAL_ERROR), event_set)
    probe.call("nvmlEventSetWait_v2 (0 ms)", "nvmlEventSetWait_v2", event_set, buffer, 0)
    for _ in range(args.repeat):
        scrape(False)
    probe.record(f"the scrape's calls {args.repeat} times more")
    found = dict(library=args.library, init_flags=args.init_flags, driver_version=version.value.decode(), gpus=count.value,
                 steps=probe.steps)
    for step in probe.steps:
        print(f"{step['vm_rss_kib']:>8} KiB  {step['vm_rss_delta_kib']:>+7}  anon {step['rss_anon_kib']:>7}"
              f"  largest anon {step['largest_anonymous_kib']:>6}  {step['step']}"
              f"  [{', '.join(sorted(step['nvidia_mapped_kib']))}]")
    with open(os.path.join(args.out, "nvml-resident.json"), "w") as out:
        json.dump(found, out, indent=1)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
