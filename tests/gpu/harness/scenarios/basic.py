"""1 idle, 1b GPU health, and 2 to 4 one owner: live (with the latency figures), stopped,
then killed."""

import os
import signal
import time

from harness.programs import GiB
from harness.procfs import proc_state, wait_for
from harness.outputs import gpu0, holders, orphaned, owners, value
from harness.suite import Exporter, scenario
from harness.timing import latency


@scenario(1, "idle", "idle")
def idle(suite):
    s = suite.exporter.scrape()
    suite.expect("used bytes", 0, value(s, "vram_used_bytes", gpu=0))
    suite.expect("owners (all states)", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "uninterruptible", "zombie", "killed",
                                          "exiting", "gone", "unknown")))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("host PID namespace", 1, value(s, "vram_host_pid_namespace"))
    suite.expect("procfs shows its own PID namespace", 1, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json status", "clear", doc["status"])


@scenario("1b", "health", "GPU health", "mig")
def health(suite):
    """What the driver says the GPU needs, read on a healthy GPU 0; MIG mode is read as it
    is, never changed."""
    exporter = suite.exporter
    values = lambda samples, metric, **labels: [
        v for n, l, v in samples
        if n == metric and all(l.get(k) == str(x) for k, x in dict(gpu=0, **labels).items())]
    # The event thread registers GPUs once the first scrape has loaded NVML.
    wait_for("GPU 0 watched for Xid events",
             lambda: values(exporter.scrape(), "vram_xid_watched") == [1.0], limit=15)
    s = exporter.scrape(record="GPU health")
    one = lambda metric, **labels: values(s, metric, **labels)
    suite.expect("recovery action none (driver >= 565)", [1.0], one("vram_gpu_recovery_action", action="none"))
    suite.expect("recovery action: one series, the action asked", 1, len(one("vram_gpu_recovery_action")))
    suite.expect("row remap pending", [0.0], one("vram_gpu_row_remap_pending"))
    suite.expect("row remap failure", [0.0], one("vram_gpu_row_remap_failure"))
    suite.expect("remapped rows: 2 causes, read", 2, len(one("vram_gpu_remapped_rows")))
    suite.facts["remapped_rows"] = {l["cause"]: v for n, l, v in s
                                    if n == "vram_gpu_remapped_rows" and l.get("gpu") == "0"}
    pending_pages = one("vram_gpu_retired_pages_pending")
    suite.expect("retired pages: absent or none pending", "[] or [0.0]", str(pending_pages),
                 ok=pending_pages in ([], [0.0]))
    mig = one("vram_gpu_mig_mode")
    suite.facts["mig_mode"] = mig
    suite.expect("MIG mode read (left as it is)", 1, len(mig))
    suite.expect("process lists not refused", [0.0], one("vram_gpu_process_list_denied"))
    suite.expect("memory not OS-managed (x86 H200)", [0.0], one("vram_gpu_memory_os_managed"))
    suite.expect("no Xid since the exporter started", [], one("vram_xid_errors_total"))
    suite.expect("no permission error (no vram_gpu_error)", [], one("vram_gpu_error", error="no_permission"))
    # Every NVML call runs on a reader thread (one for the library, one per GPU, beside
    # the event thread): on a healthy GPU each answers within the scrape.
    suite.expect("answers in time (no timeout)", [], one("vram_gpu_error", error="timeout"))
    suite.expect("no NVML call stuck", [], one("vram_gpu_stuck_seconds"))
    suite.expect("NVML answers (no vram_nvml_error)", [],
                 [v for n, l, v in s if n == "vram_nvml_error"])
    # A fresh exporter's first scrape: loading NVML waits (2 s at most) for the GPU's
    # registration for Xid events, so it already says watched; and a server serves its
    # own process_* series.
    fresh = Exporter.start(suite, suite.spawned, "fresh", "exporter-fresh.log")
    first = fresh.scrape(record="a fresh exporter's first scrape")
    fresh.stop()
    suite.expect("fresh exporter: Xid watched on its first scrape", [1.0],
                 values(first, "vram_xid_watched"))
    own = sorted(n for n, l, v in first if n.startswith("process_"))
    suite.expect("fresh exporter: its own process_* series", 6, len(own))


@scenario(2, "lifecycle", "live owner", "live", "stopped", "killed", "latency", "3", "4")
def lifecycle(suite):
    """2 live owner (with the scrape latency beside nvidia-smi), 3 stopped, 4 killed."""
    exporter = suite.exporter
    suite.scenario = "2 live owner"
    owner = suite.owner("hold", 8 * GiB)
    pid = owner.pid
    s = exporter.scrape(record="live owner")
    charge = suite.charges().get(pid)
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("owned bytes (running) = NVML charge", charge,
                 value(s, "vram_owned_bytes", gpu=0, state="running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("culprits", 0, holders(s, "culprit"))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json: the owner, running", [(pid, "running")],
                 [(o["pid"], o["state"]) for o in gpu0(doc)["owners"]])
    suite.describe("live CUDA owner", pid)
    suite.facts["live_owner"] = dict(pid=pid, nvml_charge=charge, v2_used=suite.used())
    latency(suite, exporter)

    suite.scenario = "3 stopped owner"
    os.kill(pid, signal.SIGSTOP)
    wait_for("state T", lambda: proc_state(pid) == "T")
    s = exporter.scrape()
    suite.expect("stopped owners", 1, owners(s, "stopped"))
    suite.expect("running owners", 0, owners(s, "running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    os.kill(pid, signal.SIGCONT)

    suite.scenario = "4 owner killed"
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    owner.proc.wait()
    seen = []
    while True:
        s = exporter.scrape()
        seen.append((round(time.monotonic() - killed_at, 3), owners(s, "gone"), orphaned(s),
                     value(s, "vram_used_bytes", gpu=0)))
        if value(s, "vram_used_bytes", gpu=0) == 0:
            break
        assert time.monotonic() - killed_at < 30, "memory not freed after SIGKILL"
    suite.facts["teardown_scrapes"] = seen
    suite.expect("used bytes after teardown", 0, seen[-1][3])
    suite.expect("owners after teardown", 0,
                 sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("orphaned after teardown", 0, orphaned(s))
    suite.expect("seconds until freed (< 2)", True, seen[-1][0] < 2.0)
