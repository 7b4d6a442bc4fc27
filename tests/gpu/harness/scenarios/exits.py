"""Owners that exit or die: 5 a fork orphan, 5b workers left behind by a killed server,
5f an owner left unreaped, 5g retitled workers left behind, 5c a service whose launcher
exits, 8 an owner whose main thread exited."""

import os
import re
import signal
import subprocess
import tempfile
import time

from harness.programs import GiB
from harness.procfs import comm_of, device_holders, proc_state, start_ticks, stat_fields, wait_for
from harness.outputs import (
    exit_line, gpu0, holder_pids, holders, kill_line, kill_targets, names_only_the_child,
    orphaned, owners, pids, series, value,
)
from harness.suite import scenario


@scenario(5, "fork", "fork orphan")
def fork_orphan(suite):
    """The owner exits, its child (never touched CUDA) keeps its context."""
    exporter = suite.exporter
    owner = suite.owner("fork", 8 * GiB)
    owner.proc.wait()
    dead, [child] = owner.proc.pid, owner.children
    suite.spawned.add_pid(child)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    charge = suite.charges()[dead]
    s = exporter.scrape(record="fork orphan")
    suite.expect("gone owners", 1, owners(s, "gone"))
    suite.expect("gone owners that exited", 1, value(s, "vram_gone_owner_processes", gpu=0, reason="exited"))
    suite.expect("orphaned owner_gone = dead PID's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("culprits", 1, holders(s, "culprit"))
    suite.expect("holder named", [child], holder_pids(s))
    suite.describe("fork-inherited culprit", child)
    suite.facts["fork_orphan_device_files"] = dict(
        dead_owner=dead, child=child, harness=os.getpid(), exporter=exporter.proc.pid,
        holders=device_holders(suite.gpu.device_prefix))

    check = suite.check(record="fork orphan")
    suite.expect("check's verdict names only the child", True,
                 names_only_the_child(check.stdout, dead, child))
    suite.expect("check exit status", 1, check.returncode)
    suite.expect("check's last line", "exit status 1: orphaned memory found", exit_line(check.stdout))
    suite.expect("suggested kill line", [child], kill_line(check.stdout))
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check --json status", "orphaned", doc["status"])
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("check --json remedy", ("kill", [(child, start_ticks(child))]),
                 (gpu["remedy"]["action"],
                  [(t["pid"], t["start_time_ticks"]) for t in gpu["remedy"].get("targets", [])]))
    suite.expect("check --json owner gone, exited", [(dead, "gone", "exited")],
                 [(o["pid"], o["state"], (o.get("detail") or {}).get("reason")) for o in gpu["owners"]])

    waiter = subprocess.Popen(suite.argv("check", "--wait", "60s"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=suite.gpu.env())
    suite.spawned.add(waiter, group=False)
    progress = waiter.stderr.readline()  # the first "waiting: ..." line: it is polling
    suite.expect("check --wait is polling", True, progress.startswith("waiting:"))
    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    out, err = waiter.communicate(timeout=90)
    waited = time.monotonic() - killed_at
    suite.record(f"check --wait 60s (exit {waiter.returncode})", out + "\n--- stderr ---\n" + err)
    suite.expect("check --wait exit after kill", 0, waiter.returncode)
    suite.expect("check --wait returned within 5 s", True, waited < 5)
    suite.facts["check_wait_seconds_after_kill"] = round(waited, 3)
    s = exporter.scrape()
    suite.expect("orphaned after killing child", 0, orphaned(s))
    suite.expect("gone owners after killing child", 0, owners(s, "gone"))


@scenario("5b", "left-behind", "server killed, workers left behind")
def left_behind(suite):
    """Branch 1 of the story: a server's torch.multiprocessing workers outlive its SIGKILL."""
    exporter = suite.exporter
    server, workers = suite.server(2 * GiB, workers=2)
    for worker in workers:
        suite.spawned.add_pid(worker)
    wait_for("both workers to be listed", lambda: set(workers) <= set(suite.charges()))
    s = exporter.scrape()
    suite.expect("left behind while the server lives", 0, value(s, "vram_left_behind_bytes", gpu=0))
    suite.describe("worker before the kill", workers[0])
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    charges = suite.charges()
    held = sum(charges[worker] for worker in workers)
    found = []
    wait_for("the exporter to count the workers left behind", lambda: found.append(
        exporter.scrape(record="server killed")) or value(found[-1], "vram_left_behind_bytes", gpu=0) == held)
    s = found[-1]
    suite.expect("left-behind bytes = the workers' charges", held, value(s, "vram_left_behind_bytes", gpu=0))
    named = series(s, "vram_left_behind_since_timestamp_seconds", gpu=0)
    suite.expect("left-behind workers named", workers, sorted(int(l["pid"]) for l in named))
    suite.expect("with the server as their parent", [str(server.pid)] * 2,
                 [l["parent_pid"] for l in named])
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.describe("worker after the kill", workers[0])
    check = suite.check(record="server killed")
    suite.expect("check exit status", 4, check.returncode)
    # check beside the exporter goes by what it saw (the witness state): the same verdict.
    suite.expect("check names both workers, left behind as the exporter saw", True,
                 re.search(r"GPU 0: .* held by 2 processes left behind by a server that exited:", check.stdout)
                 is not None and all(f"PID {w} (" in check.stdout for w in workers))
    suite.expect("check names the server that exited", True,
                 f"a worker of PID {server.pid} (" in check.stdout)
    alone = suite.check("--path.state", tempfile.mkdtemp(prefix="vram-no-witness-"),
                        record="server killed, check with no witness state")
    suite.expect("check with no state: possibly left behind, the server's group named", True,
                 "held by 2 processes possibly left behind by a server that exited:" in alone.stdout
                 and f"PID {server.pid} (the process that started it), has exited" in alone.stdout)
    line = kill_line(check.stdout)
    suite.expect("suggested kill line", workers, line)
    killed_at = time.monotonic()
    subprocess.run(["kill"] + [str(pid) for pid in line or []], check=True)
    # wait_freed raises when the memory is still held after its limit.
    freed_after = suite.wait_freed()
    suite.expect("the suggested kill frees the memory within 10 s", True, freed_after < 10)
    suite.facts["left_behind_freed_seconds_after_kill"] = round(time.monotonic() - killed_at, 3)
    s = exporter.scrape()
    suite.expect("left-behind bytes after the kill", 0, value(s, "vram_left_behind_bytes", gpu=0))


@scenario("5f", "unreaped", "owner killed, left unreaped, its child holds")
def unreaped(suite):
    """The fork orphan with a parent that does not reap: the owner forked a child that
    keeps its files and is SIGKILLed, and its parent (this harness) leaves it a zombie.
    NVML goes on charging it; past the bound a free can take (2 s) it is gone, and the
    child is named."""
    exporter = suite.exporter
    owner = suite.owner("hold-and-fork", 2 * GiB)
    [child] = owner.children
    suite.spawned.add_pid(child)
    s = exporter.scrape()
    suite.expect("running owners before the kill", 1, owners(s, "running"))
    killed_at = time.monotonic()
    os.kill(owner.pid, signal.SIGKILL)  # never waited for: a zombie
    wait_for("the owner to be a zombie", lambda: proc_state(owner.pid) == "Z")
    charge = suite.charges().get(owner.pid)
    suite.expect("NVML still charges the zombie", True, bool(charge))
    first = exporter.scrape(record="owner killed, unreaped")
    # Scraped within the bound (else this says nothing), and not orphaned.
    suite.expect("within the bound, not orphaned", (True, 0),
                 (time.monotonic() - killed_at < 2.0, orphaned(first)))
    found = []
    wait_for("the exporter to call the memory orphaned", lambda: found.append(
        exporter.scrape()) or orphaned(found[-1]) == charge, limit=20)
    waited = time.monotonic() - killed_at
    s = exporter.scrape(record="owner unreaped past the bound")
    suite.expect("orphaned owner_gone = the zombie's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("orphaned after the bound (2 s), not before", True, 2.0 <= waited < 10.0)
    suite.facts["unreaped_orphaned_after_s"] = round(waited, 3)
    suite.expect("the child named", [child], holder_pids(s))
    check = suite.check(record="owner killed, unreaped")
    suite.expect("check exit status", 1, check.returncode)
    suite.expect("check's kill line: the child", [child], kill_line(check.stdout))
    suite.expect("check says the owner exited", True,
                 f"held for exited PID {owner.pid}; still held by PID {child} (" in check.stdout)
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()
    owner.proc.wait()
    s = exporter.scrape()
    suite.expect("orphaned once the child is killed", 0, orphaned(s))


@scenario("5g", "titled-workers", "server killed, its retitled workers left behind")
def titled_workers(suite):
    """A server's torch.multiprocessing workers retitle themselves with setproctitle, as
    SGLang's schedulers do, and the server is SIGKILLed: left behind, and the served
    exporter and check beside it agree; a check with no witness state finds them by their
    pipes to the dead server."""
    exporter = suite.exporter
    title = "sglang::scheduler_TP0"
    server, workers = suite.server(2 * GiB, workers=2, title=title)
    for worker in workers:
        suite.spawned.add_pid(worker)
    wait_for("both workers to be listed", lambda: set(workers) <= set(suite.charges()))
    suite.expect("the workers' command name is the title", [title[:15]] * 2,
                 [comm_of(worker) for worker in workers])
    exporter.scrape()
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    held = sum(suite.charges()[worker] for worker in workers)
    found = []
    wait_for("the exporter to count the workers left behind", lambda: found.append(
        exporter.scrape(record="retitled workers' server killed"))
        or value(found[-1], "vram_left_behind_bytes", gpu=0) == held)
    s = found[-1]
    served = sorted(int(l["pid"]) for l in series(s, "vram_left_behind_since_timestamp_seconds", gpu=0))
    suite.expect("served: the workers left behind", workers, served)
    rc, doc = suite.check_json(record="retitled workers' server killed")
    gpu = gpu0(doc)
    suite.expect("check beside it: exit status", 4, rc)
    suite.expect("check beside it: left behind, witnessed", ("left_behind", held),
                 (gpu["finding"], gpu["left_behind_bytes"]))
    suite.expect("check beside it: the same workers in the kill line", workers, kill_targets(gpu))
    suite.expect("check beside it: facts from the witness", [["parent", "parent_exit"]] * 2,
                 [w["process"].get("from_witness") for w in gpu["left_behind"]])
    rc, doc = suite.check_json("--path.state", tempfile.mkdtemp(prefix="vram-no-witness-"),
                               record="retitled workers, check with no witness state")
    gpu = gpu0(doc)
    suite.expect("no state: possibly left behind, by their pipes",
                 ["pipes_to_parent_closed"] * 2, [w["seen"].get("clue") for w in gpu["left_behind"]])
    subprocess.run(["kill"] + [str(pid) for pid in workers], check=True)
    suite.wait_freed()


@scenario("5c", "service-alone", "service whose launcher exits")
def service_alone(suite):
    """An owner in its own session whose launcher exits: a service, never left behind."""
    exporter = suite.exporter
    launcher, pid = suite.launched_service(2 * GiB)
    wait_for("the service to be listed", lambda: pid in suite.charges())
    exporter.scrape()  # it is seen with its launcher alive
    launcher.stdin.write("exit\n")
    launcher.stdin.flush()
    launcher.wait(timeout=30)
    wait_for("the service to be adopted", lambda: stat_fields(pid)[1] != str(launcher.pid))
    s = exporter.scrape(record="service's launcher exited")
    suite.expect("left-behind bytes", 0, value(s, "vram_left_behind_bytes", gpu=0))
    suite.expect("running owners", 1, owners(s, "running"))
    check = suite.check(record="service's launcher exited")
    suite.expect("check exit status", 0, check.returncode)
    suite.describe("service after its launcher exited", pid)
    os.kill(pid, signal.SIGKILL)
    suite.wait_freed()


@scenario(8, "zombie-owner", "zombie main thread")
def zombie_owner(suite):
    """The owner's main thread exited, other threads hold the context (state Z)."""
    owner = suite.owner("zombie-main", 4 * GiB)
    pid = owner.pid
    wait_for("main thread zombie", lambda: proc_state(pid) == "Z")
    s = suite.exporter.scrape()
    suite.expect("zombie owners", 1, owners(s, "zombie"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    rc, doc = suite.check_json()
    suite.expect("check exit status", 0, rc)
    suite.describe("zombie-leader owner", pid)
    os.kill(pid, signal.SIGKILL)
    owner.proc.wait()
    suite.wait_freed()
