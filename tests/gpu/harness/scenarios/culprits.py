"""Who is who, by which PID: 7 an owner and 6 the exporter in a PID namespace, 10 an NVML
client beside a fork orphan, 11 three children, 12 an orphan in a PID namespace, 13 a
zombie-leader culprit, 14 a reused PID, 15 the exporter in a PID namespace reading the
host's /proc."""

import os
import re
import signal
import subprocess
import sys
import tempfile

from harness.programs import GiB
from harness.procfs import (
    children_of, comm_of, host_pids, pid_namespace, proc_state, start_ticks, wait_for,
)
from harness.outputs import (
    exit_line, find, gpu0, holder_pids, holders, kill_line, kill_targets, kinds, orphaned,
    owners, pids, series, value,
)
from harness.suite import Exporter, Owner, free_port, scenario


@scenario(7, "owner-pidns", "owner in PID namespace")
def owner_in_pid_namespace(suite):
    """An owner inside a PID namespace, the exporter on the host."""
    owner = suite.owner("hold", 2 * GiB,
                        prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))
    wait_for("the namespaced owner to be listed", lambda: len(suite.charges()) == 1)
    host_pid = next(iter(suite.charges()))
    suite.describe("owner in a PID namespace (host PID)", host_pid)
    s = suite.exporter.scrape()
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("listed under its host PID", True,
                 host_pid != owner.pid and os.path.exists(f"/proc/{host_pid}"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    os.kill(host_pid, signal.SIGKILL)
    owner.proc.wait()
    suite.wait_freed()


@scenario(6, "exporter-pidns", "exporter in PID namespace")
def exporter_in_pid_namespace(suite):
    """The exporter in a fresh PID namespace with its own /proc, an owner outside it:
    NVML hides the owner, so the memory is unattributed and not called orphaned."""
    owner = suite.owner("hold", 4 * GiB)
    blind = Exporter.start(suite, suite.spawned, "in a PID namespace", "exporter-pidns.log",
                           prefix=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"),
                           view="blind")
    s = blind.scrape()
    suite.expect("host PID namespace", 0, value(s, "vram_host_pid_namespace"))
    suite.expect("procfs shows its own PID namespace", 1, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("owners seen", 0, sum(owners(s, st) for st in ("running", "stopped", "gone")))
    suite.expect("unattributed bytes > 0", True, value(s, "vram_unattributed_bytes", gpu=0) > 0)
    suite.expect("orphaned bytes", 0, orphaned(s))
    blind.stop()
    suite.expect("warned at start", True, "PID namespace" in blind.log())
    os.kill(owner.pid, signal.SIGKILL)
    owner.proc.wait()


@scenario(10, "agent", "NVML client + fork orphan")
def agent_beside_orphan(suite):
    """An NVML-only client under a name no list knows (python3) beside a fork orphan:
    only the child is blamed; the client is a bystander and never in a kill line."""
    agent = suite.agent()
    owner = suite.owner("fork", 4 * GiB)
    owner.proc.wait()
    dead, [child] = owner.proc.pid, owner.children
    suite.spawned.add_pid(child)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    suite.describe("NVML-only client (python3)", agent.pid)
    suite.describe("fork-inherited culprit", child)
    suite.describe("the exporter (an NVML client too)", suite.exporter.proc.pid)
    rc, doc = suite.check_json(record="NVML-only client beside a fork orphan")
    gpu = gpu0(doc)
    bystander = find(gpu["bystanders"], agent.pid)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("the client is a bystander", True, bystander is not None)
    suite.expect("its evidence says no_context", True,
                 bystander is not None and "no_context" in kinds(bystander))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    suite.expect("the client is not a kill target", False, agent.pid in kill_targets(gpu))
    text = suite.check(record="NVML-only client beside a fork orphan")
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    suite.expect("the client is not in the kill line", False, agent.pid in (kill_line(text.stdout) or []))
    suite.expect("the client is named as not blamed", True,
                 re.search(rf"note: Not blamed, holding the device file without a context on GPU 0: .*"
                           rf"PID {agent.pid} \(", text.stdout) is not None)
    suite.expect("check's last line", "exit status 1: orphaned memory found", exit_line(text.stdout))
    s = suite.exporter.scrape(record="NVML-only client beside a fork orphan")
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    suite.expect("culprits", 1, holders(s, "culprit"))
    suite.expect("bystanders >= 1", True, holders(s, "bystander") >= 1)
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()
    rc, doc = suite.check_json()
    suite.expect("check exit after killing the child", 0, rc)


@scenario(11, "dataloader", "three children")
def dataloader_children(suite):
    """Three forked DataLoader-like children of one owner, which exits."""
    owner = suite.owner("fork", 6 * GiB, children=3)
    owner.proc.wait()
    dead, kids = owner.proc.pid, sorted(owner.children)
    for kid in kids:
        suite.spawned.add_pid(kid)
    wait_for("the dead owner to be listed", lambda: dead in suite.charges())
    for kid in kids:
        suite.describe(f"child {kid}", kid)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", kids, pids(gpu["culprits"]))
    suite.expect("check --json kill targets", kids, kill_targets(gpu))
    text = suite.check(record="three children")
    suite.expect("suggested kill line", kids, sorted(kill_line(text.stdout) or []))
    s = suite.exporter.scrape()
    suite.expect("holders named (vram_holder_info)", kids, holder_pids(s))
    for kid in kids[:2]:
        os.kill(kid, signal.SIGKILL)
    wait_for("two children to end", lambda: all(proc_state(kid) in (None, "Z") for kid in kids[:2]))
    rc, doc = suite.check_json()
    suite.expect("after killing two: check exit", 1, rc)
    suite.expect("after killing two: culprits", kids[2:], pids(gpu0(doc)["culprits"]))
    text = suite.check(record="three children, two killed")
    suite.expect("after killing two: kill line", kids[2:], kill_line(text.stdout))
    os.kill(kids[2], signal.SIGKILL)
    freed = suite.wait_freed()
    suite.expect("freed after killing the last (s < 2)", True, freed < 2)
    rc, doc = suite.check_json()
    suite.expect("check exit after killing all three", 0, rc)


@scenario(12, "orphan-pidns", "orphan in PID namespace")
def orphan_in_pid_namespace(suite):
    """A fork orphan inside a PID namespace (a shell is its PID 1), the exporter on the
    host: the culprit is named by its host PID."""
    owner = suite.owner("fork", 4 * GiB, prefix=(
        "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
        "sh", "-c", '"$@"; exec sleep 600', "sh"))
    [inner] = owner.children
    [init] = children_of(owner.proc.pid)
    namespace = pid_namespace(init)
    # The shell execs sleep once the owner has exited.
    wait_for("the owner to exit", lambda: comm_of(init) == "sleep")
    [host_child] = host_pids(inner, namespace)
    suite.spawned.add_pid(host_child)
    wait_for("the dead owner to be listed", lambda: suite.charges())
    suite.describe("culprit in a PID namespace (host PID)", host_child)
    suite.expect("child's host PID differs from its namespace PID", True, host_child != inner)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits (host PID)", [host_child], pids(gpu["culprits"]))
    suite.expect("check --json kill targets", [host_child], kill_targets(gpu))
    text = suite.check(record="fork orphan in a PID namespace")
    suite.expect("suggested kill line", [host_child], kill_line(text.stdout))
    s = suite.exporter.scrape()
    suite.expect("holder named (vram_holder_info)", [host_child], holder_pids(s))
    suite.expect("gone owners", 1, owners(s, "gone"))
    os.kill(host_child, signal.SIGKILL)
    suite.wait_freed()


@scenario(13, "zombie-culprit", "zombie-leader culprit")
def zombie_leader_culprit(suite):
    """The forked child's main thread calls pthread_exit while another thread lives: its
    /proc/PID/fd and maps are empty, its task's are not."""
    owner = suite.owner("fork", 4 * GiB, child_kind="zombie-leader")
    owner.proc.wait()
    [child] = owner.children
    suite.spawned.add_pid(child)
    wait_for("the child's main thread to be a zombie", lambda: proc_state(child) == "Z")
    suite.describe("zombie-leader culprit", child)
    rc, doc = suite.check_json()
    gpu = gpu0(doc)
    suite.expect("check exit status", 1, rc)
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    suite.expect("culprit state", "zombie", (find(gpu["culprits"], child) or {}).get("state"))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    text = suite.check(record="zombie-leader culprit")
    suite.expect("sentence names it as a zombie", True,
                 re.search(rf"still held by PID {child} \([^,]+, zombie, ", text.stdout) is not None)
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    s = suite.exporter.scrape()
    suite.expect("vram_holder_info (pid, state)", [(str(child), "zombie")],
                 [(l["pid"], l["state"]) for l in series(s, "vram_holder_info", gpu=0)])
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()


@scenario(14, "reuse", "PID reuse")
def pid_reuse(suite):
    """The dead owner's PID is handed to an NVML-only client. The owner runs in the
    suite's session: the kernel keeps a PID from reuse while it names a live process
    group or session, and the child keeps those alive."""
    exporter = suite.exporter
    owner = suite.owner("hold-then-fork", 4 * GiB, own_session=False)
    dead = owner.pid
    s = exporter.scrape()
    suite.expect("served exporter saw the owner live", 1, owners(s, "running"))
    [child] = owner.fork_now()
    suite.spawned.add_pid(child)
    charge = suite.charges().get(dead)
    reuser, attempts = suite.agent_at(dead)
    suite.facts["pid_reuse_attempts"] = attempts
    assert suite.expect("an NVML-only client got the dead owner's PID", True, reuser is not None), \
        f"no process could be started at PID {dead} in {attempts} attempts"
    suite.describe("NVML-only client at the dead owner's PID", dead)
    suite.describe("fork-inherited culprit", child)
    rc, doc = suite.check_json(record="PID reused by an NVML-only client")
    gpu = gpu0(doc)
    owner_doc = find(gpu["owners"], dead) or {}
    detail = owner_doc.get("detail") or {}
    suite.expect("check exit status", 1, rc)
    suite.expect("owner gone, reason reused", ("gone", "reused"), (owner_doc.get("state"), detail.get("reason")))
    suite.expect("reused by the client (its start time)", start_ticks(dead),
                 (detail.get("by") or {}).get("start_time_ticks"))
    suite.expect("check --json culprits", [child], pids(gpu["culprits"]))
    bystander = find(gpu["bystanders"], dead)
    suite.expect("the client is a bystander with no_context", True,
                 bystander is not None and "no_context" in kinds(bystander))
    suite.expect("check --json kill targets", [child], kill_targets(gpu))
    suite.expect("the client is not a kill target", False, dead in kill_targets(gpu))
    text = suite.check(record="PID reused by an NVML-only client")
    suite.expect("suggested kill line", [child], kill_line(text.stdout))
    suite.expect("the client is not in the kill line", False, dead in (kill_line(text.stdout) or []))
    suite.expect("check says the PID names another process", True,
                 re.search(rf"PID {dead}(?: \([^)]*\))? is gone: the PID now names PID {dead} ", text.stdout)
                 is not None)
    s = exporter.scrape(record="PID reused by an NVML-only client")
    suite.expect("vram_gone_owner_processes{reason=reused}", 1,
                 value(s, "vram_gone_owner_processes", gpu=0, reason="reused"))
    suite.expect("gone owners", 1, owners(s, "gone"))
    suite.expect("orphaned owner_gone = dead PID's charge", charge,
                 value(s, "vram_orphaned_bytes", gpu=0, reason="owner_gone"))
    suite.expect("holder named (vram_holder_info)", [child], holder_pids(s))
    os.kill(child, signal.SIGKILL)
    suite.wait_freed()


@scenario(15, "exporter-hostproc", "exporter ns, host /proc")
def exporter_in_pid_namespace_with_host_proc(suite):
    """The exporter in its own PID namespace reading the host's /proc (a container without
    hostPID that mounts the host's /proc at another path and passes --path.procfs), a live
    owner beside it in the namespace: NVML names the owner by its namespace PID (2), which
    is the host's kthreadd in the host's /proc. The namespace has its own /proc too, as a
    container has: CUDA reads /proc/<its own PID> and fails to start (error 304) where
    /proc is another namespace's."""
    host_proc = tempfile.mkdtemp(prefix="host-proc-")
    subprocess.run(["mount", "--bind", "/proc", host_proc], check=True)
    try:
        run_exporter_in_pid_namespace_with_host_proc(suite, host_proc)
    finally:
        subprocess.run(["umount", "--lazy", host_proc], check=False)
        os.rmdir(host_proc)


def run_exporter_in_pid_namespace_with_host_proc(suite, host_proc):
    port = free_port()
    log_path = os.path.join(suite.out, "exporter-pidns.log")
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    stderr = tempfile.TemporaryFile(mode="w+")
    script = ('python=$1 program=$2 bytes=$3 log=$4; shift 4; '
              '"$python" -c "$program" hold "$bytes" 0 sleep & exec "$@" >>"$log" 2>&1')
    proc = suite.spawned.add(subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh",
         sys.executable, suite.gpu.owner_program, str(2 * GiB), log_path]
        + suite.argv("--web.listen-address", f"127.0.0.1:{port}", "--path.procfs", host_proc),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True, env=suite.gpu.env("hostproc")), group=True)
    owner = Owner(proc, stderr)
    inner = owner.line("READY")[0]
    exporter = Exporter(suite, "in a PID namespace, host /proc", proc, port, log_path, offset)
    [init] = children_of(proc.pid)
    owner_host = [pid for pid in host_pids(inner, pid_namespace(init)) if comm_of(pid) != "vram-exporter"]
    suite.expect("owner's PID in the namespace", 2, inner)
    wait_for("the owner to be listed", lambda: suite.charges())
    charge = suite.charges().get(owner_host[0]) if owner_host else None
    suite.describe("owner in the exporter's namespace (host PID)", owner_host[0])
    s = exporter.scrape(record="exporter in its own PID namespace, host /proc")
    suite.expect("procfs shows its own PID namespace", 0, value(s, "vram_procfs_own_pid_namespace"))
    suite.expect("host PID namespace", 0, value(s, "vram_host_pid_namespace"))
    suite.expect("running owners", 1, owners(s, "running"))
    suite.expect("gone owners", 0, owners(s, "gone"))
    suite.expect("owned bytes (running) = NVML charge", charge,
                 value(s, "vram_owned_bytes", gpu=0, state="running"))
    suite.expect("orphaned bytes", 0, orphaned(s))
    rc, doc = suite.check_json(prefix=("nsenter", "--target", str(init), "--pid", "--"), view="hostproc",
                               record="check inside that namespace")
    owner_doc = find(gpu0(doc)["owners"], inner) or {}
    suite.expect("check inside: exit status", 0, rc)
    suite.expect("check inside: owner running, host PID in procfs_pid", ("running", owner_host[0]),
                 (owner_doc.get("state"), (owner_doc.get("process") or {}).get("procfs_pid")))
    exporter.stop()
