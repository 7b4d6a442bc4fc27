#!/usr/bin/env python3
"""The real-GPU suite: run the release binary against a real NVIDIA GPU and real
PyTorch owners, scenario by scenario, and compare what it reports with what NVML says.

Run by hand on a GPU host (never by CI): it needs root (for unshare, nsenter and
/proc/sys/kernel/ns_last_pid), PyTorch with CUDA, and the release binary built elsewhere:

    python3 tests/gpu/run.py --binary target/release/vram-exporter --out DIR [--only NAME[,NAME]]

It prints one table row per check (scenario, expected, got, pass), and writes to --out
five files: results.json (every row, the figures, each scenario's duration),
processes.json (what each process of a scenario holds and maps of /dev/nvidia*),
outputs.txt (what `check` and /metrics printed at the moments that matter) and the
exporters' logs. It exits 1 if any check failed. Every scenario kills what it started,
also when it fails, and the next one starts only on an idle GPU. It never resets the GPU
or changes its settings.

The scenarios and what they share are the package harness/ beside this file
(harness/scenarios/ in the order they run); this file runs them.
"""

import argparse
import json
import os
import signal
import sys
import time
import traceback

# Beside this file, whether it runs or another script loads it by its path.
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# What the scenarios need, and what dry_run.py, peers.py, ab.py and where_it_goes.py take
# from this module.
from harness import scenarios  # noqa: E402,F401 - registers every scenario, in run order
from harness.procfs import comm_of, cpu_ticks, host_pids, pid_namespace, wait_for  # noqa: E402,F401
from harness.programs import GiB, OWNER_LIFE, Gpu  # noqa: E402,F401
from harness.suite import SCENARIOS, Exporter, Spawned, Suite, free_port  # noqa: E402,F401

# Every process the suite starts, killed however the suite ends.
EVERYTHING = None  # a Spawned, set in main()
# Each file under --out stays below this (the caller fetches at most 2 MiB a file).
MAX_FILE_BYTES = 1800 * 1024


def selected(only):
    """The scenarios --only names (by name, alias or number), in run order."""
    if not only:
        return list(SCENARIOS)
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    known = {}
    for entry in SCENARIOS:
        for name in (entry["name"], str(entry["number"]), *entry["aliases"]):
            known[name] = entry["name"]
    unknown = sorted(wanted - set(known))
    if unknown:
        names = ", ".join(f"{e['number']} {e['name']}" for e in SCENARIOS)
        raise SystemExit(f"unknown scenario {', '.join(unknown)}; known: {names}")
    names = {known[name] for name in wanted}
    return [entry for entry in SCENARIOS if entry["name"] in names]


def write_capped(path, text):
    data = text.encode()
    if len(data) > MAX_FILE_BYTES:
        data = data[:MAX_FILE_BYTES] + b"\n[cut: the rest would exceed the size limit]\n"
    with open(path, "wb") as f:
        f.write(data)


def main(argv=None, gpu=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/vram-exporter")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--only", metavar="NAME[,NAME]",
                        help="run only these scenarios (names or numbers: "
                             + ", ".join(f"{e['number']} {e['name']}" for e in SCENARIOS) + ")")
    here = os.path.dirname(os.path.abspath(__file__))
    built = [os.path.join(here, "..", "..", "target", kind, "examples", "scrape_latency")
             for kind in ("release", "debug")]
    parser.add_argument("--latency-client", default=next((b for b in built if os.path.exists(b)), None),
                        help="examples/scrape_latency built (default: target/release or "
                             "target/debug's, when there)")
    parser.add_argument("--soak-scrapes", type=int, default=100_000,
                        help="scrapes between the two readings of the exporter's resident memory")
    parser.add_argument("--owners", type=int, default=64,
                        help="live CUDA owners of the many-owner latency figure")
    args = parser.parse_args(argv)
    if args.owners < 1:
        parser.error("--owners must be at least 1 (leave scenario 9 out with --only)")
    chosen = selected(args.only)
    binary = os.path.abspath(args.binary)
    os.makedirs(args.out, exist_ok=True)
    for log in ("exporter-host.log", "exporter-pidns.log", "exporter-mps.log", "exporter-fresh.log"):
        if os.path.exists(os.path.join(args.out, log)):
            os.unlink(os.path.join(args.out, log))
    suite = Suite(binary, args.out, gpu or Gpu())
    suite.many_owners = args.owners
    suite.soak_scrapes = args.soak_scrapes
    suite.latency_client = args.latency_client and os.path.abspath(args.latency_client)
    global EVERYTHING
    EVERYTHING = Spawned()
    # A SIGTERM ends the run like Ctrl-C: every process is killed, the results written.
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    print(f"{'scenario':<28} {'check':<52} {'expected':>22} {'got':>22}  result")
    try:
        suite.scenario = "setup"
        wait_for("an idle GPU", suite.idle, limit=60)
        suite.exporter = Exporter.start(suite, EVERYTHING, "on the host", "exporter-host.log")
        for entry in chosen:
            run_scenario(suite, entry)
        suite.exporter.stop()
    finally:
        EVERYTHING.kill_all()
        suite.gpu.close()
        suite.facts["total_seconds"] = round(time.monotonic() - started, 1)
        failed = [row for row in suite.rows if not row["passed"]]
        write_capped(os.path.join(args.out, "results.json"), json.dumps(
            dict(rows=suite.rows, facts=suite.facts, failed=len(failed),
                 scenarios=[f"{e['number']} {e['name']}" for e in chosen]), indent=2, default=str))
        write_capped(os.path.join(args.out, "processes.json"),
                     json.dumps(suite.processes, indent=2, default=str))
        write_capped(os.path.join(args.out, "outputs.txt"), "\n".join(suite.outputs))
        print(f"\n{len(suite.rows) - len(failed)} passed, {len(failed)} failed "
              f"in {suite.facts['total_seconds']} s")
    return 1 if failed or not suite.rows else 0


def interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_scenario(suite, entry):
    """Run one scenario on an idle GPU; whatever it raises is a failed row, and whatever
    it started is killed before the next one."""
    suite.scenario = f"{entry['number']} {entry['title']}"
    suite.spawned = Spawned()
    started = time.monotonic()
    try:
        wait_for("an idle GPU before the scenario", suite.idle, limit=60)
        entry["run"](suite)
    except Exception as error:  # noqa: BLE001 - the row says what went wrong
        traceback.print_exc()
        suite.expect("ran to the end", "no error", f"{type(error).__name__}: {error}"[:300], ok=False)
    finally:
        suite.spawned.kill_all()
        suite.facts["durations_s"][entry["name"]] = round(time.monotonic() - started, 1)


if __name__ == "__main__":
    sys.exit(main())
