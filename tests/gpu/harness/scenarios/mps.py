"""16 to 18, a GPU shared through MPS: a live client, a client killed, a client that forks
and exits."""

import os
import re
import shutil
import signal
import tempfile
import time

from harness.programs import GiB
from harness.procfs import (
    children_of, comm_of, device_holders, mps_daemons, proc_state, start_ticks, stat_fields,
    wait_for,
)
from harness.outputs import (
    find, gpu0, holder_pids, holders, kill_line, kill_targets, kinds, names_only_the_child,
    orphaned, owners, pids, value,
)
from harness.suite import Exporter, scenario


@scenario(16, "mps", "MPS", "mps-live", "mps-killed", "mps-fork", "17", "18")
def mps(suite):
    """A GPU shared through MPS (the real control daemon, with pipe and log directories of
    its own): 16 a live client, 17 a client killed, 18 a client that forks a child (which
    never touches CUDA) and exits. The control daemon and its server hold the GPU's device
    file; neither may be blamed or put into a kill line; the child alone is the culprit,
    and killing it frees the memory. MPS is ended with `quit` however the scenario ends."""
    work = tempfile.mkdtemp(prefix="vram-mps-")
    directories = dict(CUDA_MPS_PIPE_DIRECTORY=os.path.join(work, "pipe"),
                       CUDA_MPS_LOG_DIRECTORY=os.path.join(work, "log"))
    for folder in directories.values():
        os.makedirs(folder)
    env = dict(suite.gpu.env(), **directories)
    daemon = None
    try:
        daemon = suite.gpu.mps_start(env)
        run_mps(suite, daemon, directories)
    finally:
        # `quit` waits for the clients to finish: end them first.
        suite.spawned.kill_all()
        suite.gpu.mps_quit(env)
        if daemon is not None:
            try:
                # Init reaps the daemon; a zombie has ended too.
                wait_for("MPS to end", lambda: proc_state(daemon) in (None, "Z") and not [
                    pid for pid in mps_daemons(directories["CUDA_MPS_PIPE_DIRECTORY"])
                    if proc_state(pid) != "Z"], limit=30)
            except AssertionError as error:
                suite.expect("MPS ended by quit", "ended", str(error), ok=False)
        shutil.rmtree(work, ignore_errors=True)


def mps_lists(suite):
    """NVML's compute and MPS lists of GPU 0: {pid: (compute bytes, MPS bytes)}."""
    reading = suite.gpu.query()
    both = {}
    for key, at in (("charges", 0), ("mps_charges", 1)):
        for pid, used in reading.get(key, {}).items():
            both.setdefault(int(pid), [None, None])[at] = used
    return {pid: tuple(used) for pid, used in both.items()}


def run_mps(suite, daemon, directories):
    exporter = suite.exporter
    facts = suite.facts.setdefault("mps", {})
    facts["daemon"] = dict(pid=daemon, start_ticks=start_ticks(daemon), comm=comm_of(daemon))

    suite.scenario = "16 MPS live client"
    live = suite.owner("hold", 3 * GiB, env=directories)
    # The daemon starts its server when the first client connects: its child.
    wait_for("the MPS server", lambda: children_of(daemon), limit=60)
    [server] = children_of(daemon)
    wait_for("the client and the server listed",
             lambda: {live.pid, server} <= set(mps_lists(suite)), limit=30)
    lists = mps_lists(suite)
    facts["live"] = dict(client=live.pid, server=server, lists={str(k): v for k, v in lists.items()})
    suite.expect("NVML: client on the compute and MPS lists", True,
                 all(used is not None for used in lists[live.pid]))
    suite.expect("NVML: server on the compute list only", True,
                 lists[server][0] is not None and lists[server][1] is None)
    suite.expect("NVML: daemon on no list", False, daemon in lists)
    suite.expect("server's parent is the daemon", daemon, int(stat_fields(server)[1]))
    for label, pid in (("MPS control daemon", daemon), ("MPS server", server), ("live MPS client", live.pid)):
        suite.describe(label, pid)
    s = exporter.scrape(record="MPS, a live client")
    suite.expect("running owners (client and server)", 2, owners(s, "running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json(record="MPS, a live client")
    suite.expect("check exit status", 0, rc)
    suite.expect("check --json owners, running", sorted([(live.pid, "running"), (server, "running")]),
                 sorted((o["pid"], o["state"]) for o in gpu0(doc)["owners"]))

    suite.scenario = "17 MPS client killed"
    killed = suite.owner("hold", 2 * GiB, env=directories)
    wait_for("the client listed", lambda: killed.pid in mps_lists(suite))
    killed_at = time.monotonic()
    os.kill(killed.pid, signal.SIGKILL)
    killed.proc.wait()
    wait_for("the killed client's memory freed", lambda: killed.pid not in mps_lists(suite))
    freed = time.monotonic() - killed_at
    facts["killed_client_freed_seconds"] = round(freed, 3)
    suite.expect("freed by the server after SIGKILL (s < 2)", True, freed < 2)
    s = exporter.scrape(record="MPS, a client killed")
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    suite.expect("holders (all roles)", 0,
                 sum(holders(s, role) for role in ("culprit", "bystander", "undetermined")))
    rc, doc = suite.check_json(record="MPS, a client killed")
    suite.expect("check exit status", 0, rc)

    suite.scenario = "18 MPS fork orphan"
    client = suite.owner("hold-then-fork", 4 * GiB, env=directories)
    dead = client.pid
    wait_for("the forking client listed", lambda: dead in mps_lists(suite))
    s = exporter.scrape()
    suite.expect("served exporter saw the client live", 3, owners(s, "running"))
    [child] = client.fork_now()
    suite.spawned.add_pid(child)
    wait_for("the dead client listed", lambda: dead in mps_lists(suite) and proc_state(dead) is None)
    lists = mps_lists(suite)
    charge = lists[dead][0]
    facts["fork"] = dict(dead_client=dead, child=child, server=server, daemon=daemon,
                         lists={str(k): v for k, v in lists.items()},
                         holders=device_holders(suite.gpu.device_prefix))
    suite.expect("NVML: dead client on the compute and MPS lists", True,
                 all(used is not None for used in lists[dead]))
    for label, pid in (("MPS control daemon", daemon), ("MPS server", server),
                       ("dead client's child", child)):
        suite.describe(label, pid)

    text = suite.check(record="MPS fork orphan")
    suite.expect("check's verdict names the child only", True,
                 names_only_the_child(text.stdout, dead, child))
    suite.expect("check exit status", 1, text.returncode)
    suite.expect("suggested kill line: the child only", [child], kill_line(text.stdout))
    note = re.search(r"^  note: Not blamed, the MPS control daemon and server, which serve every MPS "
                     r"client of GPU 0: (.*)$", text.stdout, re.M)
    note = note.group(1) if note else ""
    suite.expect("daemon listed as not blamed, with why", True, re.search(
        rf"PID {daemon} \(nvidia-cuda-mps, [^()]*the MPS control daemon: parent of MPS server PID "
        rf"{server}, listed by NVML on no GPU, leading its own session; killing it frees no "
        r"client's memory and ends MPS for every client, maps GPU 0's device file write-only: the "
        r"driver is initialised but it holds no context", note) is not None)
    suite.expect("server listed as not blamed, with why", True, re.search(
        rf"PID {server} \(nvidia-cuda-mps, [^()]*the MPS server: on GPU 0's compute list and not its "
        rf"MPS list, which names the clients, child of MPS control daemon PID {daemon}", note)
        is not None)
    rc, doc = suite.check_json(record="MPS fork orphan")
    gpu = gpu0(doc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("check --json remedy", ("kill", [child]),
                 (gpu["remedy"]["action"], kill_targets(gpu)))
    daemon_doc = find(gpu["bystanders"], daemon) or {}
    server_doc = find(gpu["bystanders"], server) or {}
    suite.expect("check --json daemon: evidence", ["mps_control_daemon", "maps_gpu_without_context",
                                                   "mps_command_name"],
                 kinds(daemon_doc) if daemon_doc else None)
    suite.expect("check --json daemon maps GPU 0 write-only", {"0": "write_only"},
                 (daemon_doc.get("mappings") or {}).get("gpus_without_read_write"))
    suite.expect("check --json server: evidence", ["mps_server", "mps_command_name"],
                 kinds(server_doc) if server_doc else None)
    s = exporter.scrape(record="MPS fork orphan (exporter started before)")
    suite.expect("orphaned owner_gone = dead client's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    suite.expect("bystanders >= 2 (daemon, server)", True, holders(s, "bystander") >= 2)
    late = Exporter.start(suite, suite.spawned, "started after the dead client", "exporter-mps.log")
    s = late.scrape(record="MPS fork orphan (exporter started after the dead client)")
    suite.expect("exporter started after: holder named", [child], holder_pids(s))
    suite.expect("exporter started after: culprits", 1, holders(s, "culprit"))
    late.stop()

    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    wait_for("the orphan freed", lambda: dead not in mps_lists(suite))
    freed = time.monotonic() - killed_at
    facts["child_kill_frees_seconds"] = round(freed, 3)
    suite.expect("killing the child frees it (s < 2)", True, freed < 2)
    rc, doc = suite.check_json(record="MPS fork orphan, child killed")
    suite.expect("check exit after killing the child", 0, rc)
    suite.expect("daemon and server still run", True,
                 proc_state(daemon) is not None and proc_state(server) is not None)
