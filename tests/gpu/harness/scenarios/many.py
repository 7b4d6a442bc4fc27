"""9 many live owners: the scrape latency with each one's real descriptor table."""

import os
import statistics
import subprocess
import sys

from harness.outputs import orphaned, owners, value
from harness.suite import read_line, scenario
from harness.timing import timed_scrapes


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
