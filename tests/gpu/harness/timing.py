"""Scrape latency and CPU time beside nvidia-smi's, from Python and from the compiled
client, and the exporter's resident memory over a soak."""

import http.client
import json
import os
import statistics
import subprocess
import time

from harness.procfs import cpu_ticks
from harness.outputs import value


def timed_scrapes(exporter, scrapes):
    """Wall time of each scrape, sorted, and the exporter's CPU time per scrape in ms.
    Scrapes go over one kept-alive connection, as Prometheus scrapes: a new connection and
    urllib's machinery per request would time the client more than the exporter."""
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
    cpu_before = cpu_ticks(exporter.proc.pid)
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        times.append(time.perf_counter() - started)
    cpu = cpu_ticks(exporter.proc.pid) - cpu_before
    connection.close()
    times.sort()
    return times, round(cpu * 1e3 / os.sysconf("SC_CLK_TCK") / scrapes, 4)


def latency(suite, exporter, scrapes=1000, runs=20):
    """Scrape latency and CPU time of the exporter with one live owner, next to what an
    nvidia-smi-based exporter runs per scrape (the H200 row of docs/benchmarks.md's targets)."""
    times, cpu_ms = timed_scrapes(exporter, scrapes)
    smi = []
    for _ in range(runs):
        started = time.perf_counter()
        suite.gpu.nvidia_smi_pair()
        smi.append(time.perf_counter() - started)
    figures = dict(
        scrapes=scrapes,
        exporter_p50_ms=round(statistics.median(times) * 1e3, 3),
        exporter_p99_ms=round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
        exporter_cpu_ms_per_scrape=cpu_ms,
        in_exporter_ms=round(value(exporter.scrape(), "vram_scrape_duration_seconds") * 1e3, 3),
        nvidia_smi_runs=runs,
        nvidia_smi_pair_p50_ms=round(statistics.median(smi) * 1e3, 3),
    )
    figures["ratio"] = round(figures["nvidia_smi_pair_p50_ms"] / figures["exporter_p50_ms"], 1)
    compiled_client_latency(suite, exporter, figures)
    suite.facts["latency"] = figures
    suite.expect("scrape p50 faster than nvidia-smi", "> 1x",
                 f"{figures['ratio']}x: {figures['exporter_p50_ms']} vs "
                 f"{figures['nvidia_smi_pair_p50_ms']} ms, CPU {cpu_ms} ms",
                 ok=figures["ratio"] > 1)
    print(f"latency: {figures}", flush=True)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def compiled_client_latency(suite, exporter, figures):
    """The same scrapes timed by a compiled client (examples/scrape_latency.rs), whose own
    cost per request is a few microseconds where Python's is about 0.1 ms; then --soak-scrapes
    scrapes more, with the exporter's resident memory before and after them."""
    client = suite.latency_client
    suite.expect("compiled latency client given (--latency-client)", True, bool(client),
                 ok=bool(client))
    if not client:
        print("latency: no compiled client, so no soak either: build it with "
              "`cargo build --release --example scrape_latency`", flush=True)
        return
    address = f"127.0.0.1:{exporter.port}"

    def run(count, warm_up):
        done = subprocess.run([client, address, str(count), str(warm_up)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{client}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    measured = run(1000, 100)
    figures["compiled_client_p50_ms"] = round(measured["p50_us"] / 1e3, 3)
    figures["compiled_client_p99_ms"] = round(measured["p99_us"] / 1e3, 3)
    soak = suite.soak_scrapes
    rss_before = rss_kib(exporter.proc.pid)
    started = time.monotonic()
    run(soak, 0)
    figures["soak_scrapes"] = soak
    figures["soak_seconds"] = round(time.monotonic() - started, 1)
    figures["rss_kib_before_soak"] = rss_before
    figures["rss_kib_after_soak"] = rss_kib(exporter.proc.pid)
    grew = figures["rss_kib_after_soak"] - rss_before
    suite.expect(f"resident memory flat over {soak:,} scrapes", "< 1024 KiB more",
                 f"{grew:+} KiB ({rss_before} -> {figures['rss_kib_after_soak']})",
                 ok=grew < 1024)
