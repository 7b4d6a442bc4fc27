#!/usr/bin/env python3
"""Two builds of the exporter on one GPU host, measured alternately beside one live owner.

usage: python3 tests/gpu/ab.py --before OLD_BINARY --after NEW_BINARY
           [--client target/release/examples/scrape_latency] [--rounds 3] [--out DIR]

Both exporters run at once on their own ports while one owner holds 2 GiB. Each round
measures the one, then the other (so what else loads the machine falls on both): the
compiled client's keep-alive latency over 3,000 scrapes, then 30 scrapes at one a second
while the exporter's threads' on-CPU time (schedstat) is counted. Prints a table of the
rounds and writes ab.json into DIR.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite = load("gpu_suite", "run.py")
where = load("where_it_goes", "where_it_goes.py")


def latency(client, port, scrapes):
    out = subprocess.run([client, f"127.0.0.1:{port}", str(scrapes), "300"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def at_one_hz(pid, port, scrapes):
    measured = where.measure(pid, port, scrapes, 1.0)
    return round(measured["on_cpu_us_per_scrape"], 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--client", default="target/release/examples/scrape_latency")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=3000)
    parser.add_argument("--slow-scrapes", type=int, default=30)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    builds = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    s = suite.Suite(builds["after"], args.out, suite.Gpu())
    s.scenario = "a/b"
    s.spawned = suite.Spawned()
    exporters, rows = {}, []
    try:
        suite.wait_for("an idle GPU", s.idle, limit=60)
        owner = s.owner("hold", 2 * suite.GiB)
        suite.wait_for("NVML to list the owner", lambda: owner.pid in s.charges(), limit=60)
        for name, binary in builds.items():
            port = suite.free_port()
            log = open(os.path.join(args.out, f"ab-{name}.log"), "w")
            exporters[name] = (subprocess.Popen(
                [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log), port)
            suite.wait_for(f"the {name} exporter", lambda: where._serves(port), limit=30)
        for round_ in range(1, args.rounds + 1):
            for name, (process, port) in exporters.items():
                fast = latency(args.client, port, args.scrapes)
                slow = at_one_hz(process.pid, port, args.slow_scrapes)
                rows.append(dict(round=round_, build=name, p50_us=fast["p50_us"],
                                 p99_us=fast["p99_us"], on_cpu_us_per_scrape_at_1hz=slow))
                print(f"round {round_} {name:6} p50 {fast['p50_us']:7.1f} us  p99 {fast['p99_us']:7.1f} us"
                      f"  CPU at 1 Hz {slow:7.1f} us a scrape", flush=True)
    finally:
        for process, _ in exporters.values():
            process.terminate()
            process.wait(timeout=20)
        s.spawned.kill_all()
    with open(os.path.join(args.out, "ab.json"), "w") as out:
        json.dump(dict(builds=builds, rows=rows), out, indent=1)
        out.write("\n")
    if len(rows) != 2 * args.rounds:
        print("not every round was measured", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
