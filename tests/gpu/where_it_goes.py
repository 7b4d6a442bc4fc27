#!/usr/bin/env python3
"""Where the exporter's CPU time and resident memory go on a real GPU, with one live owner.

usage: python3 tests/gpu/where_it_goes.py --binary target/release/vram-exporter [--out DIR]

CPU: each of the exporter's threads' on-CPU nanoseconds (/proc/PID/task/TID/schedstat),
per scrape, while scraped once a second (as Prometheus would, at its shortest interval),
then back to back, then the landing page `/` once a second (HTTP and a cold wake alone,
no collection); the process's utime+stime beside them, which also counts threads that
ended. Memory: VmRSS split by what is mapped (/proc/PID/smaps): NVML's library and
the driver's mappings, the exporter's binary, the heap and anonymous mappings (which
include every thread's stack; the largest three are listed), other libraries.
"""

import argparse
import collections
import http.client
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gpu_suite", os.path.join(HERE, "run.py"))
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid):
    """{tid: (name, on-CPU ns)} of the live threads."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
                on_cpu = int(schedstat.read().split()[0])
        except OSError:
            continue
        found[int(tid)] = (name, on_cpu)
    return found


def process_cpu_ms(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def by_thread(before, after, scrapes):
    """Microseconds per scrape by thread name (threads of one name summed)."""
    spent = collections.Counter()
    for tid, (name, on_cpu) in after.items():
        spent[re.sub(r"\d+$", "N", name)] += on_cpu - before.get(tid, (name, 0))[1]
    ended = sorted(set(before) - set(after))
    return ({name: round(ns / 1e3 / scrapes, 1) for name, ns in spent.most_common()},
            len(ended), len(set(after) - set(before)))


def measure(pid, port, scrapes, interval, path="/metrics"):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    before, cpu_before = threads(pid), process_cpu_ms(pid)
    started = time.monotonic()
    for index in range(scrapes):
        if interval:
            time.sleep(max(0.0, started + index * interval - time.monotonic()))
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    after, cpu_after = threads(pid), process_cpu_ms(pid)
    connection.close()
    per_thread, ended, new = by_thread(before, after, scrapes)
    return dict(scrapes=scrapes, interval_s=interval,
                on_cpu_us_per_scrape=round(sum(per_thread.values()), 1),
                utime_stime_us_per_scrape=round((cpu_after - cpu_before) * 1e3 / scrapes, 1),
                by_thread_us_per_scrape=per_thread, threads_ended=ended, threads_new=new)


def resident(pid):
    """KiB of VmRSS by what is mapped."""
    groups = collections.Counter()
    anonymous = []  # (resident KiB, size KiB) of each anonymous mapping
    name = None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                start, end = (int(part, 16) for part in head[0].split("-"))
                size_kib = (end - start) // 1024
                path = head[5] if len(head) > 5 else ""
                base = os.path.basename(path)
                if "nvidia" in base or base.startswith("libcuda") or path.startswith("/dev/nvidia"):
                    name = f"NVIDIA: {base}"
                elif path.endswith("vram-exporter"):
                    name = "the exporter's binary"
                elif path == "[heap]":
                    name = "heap ([heap])"
                elif path == "":
                    name = "anonymous"
                elif path.startswith("["):
                    name = path
                else:
                    name = f"other: {base}"
            elif head and head[0] == "Rss:":
                groups[name] += int(head[1])
                if name == "anonymous":
                    anonymous.append((int(head[1]), size_kib))
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return dict(vm_rss_kib=int(fields["VmRSS"].split()[0]),
                rss_anon_kib=int(fields["RssAnon"].split()[0]),
                rss_file_kib=int(fields["RssFile"].split()[0]),
                threads=int(fields["Threads"]),
                by_mapping_kib={k: v for k, v in groups.most_common() if v},
                largest_anonymous_kib=[dict(resident=r, size=z) for r, z in sorted(anonymous)[-3:][::-1]])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/vram-exporter")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--slow-scrapes", type=int, default=30,
                        help="scrapes at one a second")
    parser.add_argument("--fast-scrapes", type=int, default=2000,
                        help="scrapes back to back")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    s = suite.Suite(os.path.abspath(args.binary), args.out, suite.Gpu())
    s.scenario = "where it goes"
    s.spawned = suite.Spawned()
    found = {}
    try:
        suite.wait_for("an idle GPU", s.idle, limit=60)
        owner = s.owner("hold", 2 * suite.GiB)
        suite.wait_for("NVML to list the owner", lambda: owner.pid in s.charges(), limit=60)
        port = suite.free_port()
        log = open(os.path.join(args.out, "where-it-goes-exporter.log"), "w")
        exporter = subprocess.Popen([os.path.abspath(args.binary),
                                     f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=log, stderr=log)
        try:
            suite.wait_for("the exporter", lambda: _serves(port), limit=30)
            found["resident_at_start"] = resident(exporter.pid)
            found["at_one_hz"] = measure(exporter.pid, port, args.slow_scrapes, 1.0)
            found["back_to_back"] = measure(exporter.pid, port, args.fast_scrapes, 0)
            # The same exchange for the landing page, which collects nothing: what HTTP and
            # a cold wake cost alone, below which no collection can go.
            found["landing_page_at_one_hz"] = measure(exporter.pid, port, args.slow_scrapes,
                                                      1.0, path="/")
            found["resident_after"] = resident(exporter.pid)
        finally:
            exporter.terminate()
            exporter.wait(timeout=20)
    finally:
        s.spawned.kill_all()
    text = json.dumps(found, indent=1)
    print(text)
    with open(os.path.join(args.out, "where-it-goes.json"), "w") as out:
        out.write(text + "\n")


def _serves(port):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/metrics")
        ok = connection.getresponse().status == 200
        connection.close()
        return ok
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
