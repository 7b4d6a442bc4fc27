"""The processes a scenario starts and kills, the exporter it scrapes, the suite (its rows,
its calls to `check`, its owners) and the registry of scenarios."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from harness.programs import LAUNCHER, NOT_AVAILABLE, SERVER
from harness.procfs import describe, start_ticks, wait_for
from harness.outputs import excerpt, parse


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- processes --------------------------------------------------------------------

class Spawned:
    """Processes started for one scenario (or the whole run), killed however it ends:
    session leaders with their process group, other processes alone, and single PIDs
    (forked children) only while their start time still names the process we saw."""

    def __init__(self):
        self.procs = []  # (Popen, leads its own process group)
        self.pids = []  # (pid, start time in ticks)

    def add(self, proc, group):
        self.procs.append((proc, group))
        return proc

    def add_pid(self, pid):
        self.pids.append((pid, start_ticks(pid)))

    def kill_all(self):
        for pid, started in reversed(self.pids):
            if started is not None and start_ticks(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc, group in reversed(self.procs):
            try:
                if group:
                    os.killpg(proc.pid, signal.SIGKILL)
                elif proc.poll() is None:
                    proc.kill()
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                print(f"process {proc.pid} did not end after SIGKILL", file=sys.stderr)
        self.procs.clear()
        self.pids.clear()


def read_line(proc, limit=180.0):
    """The next line `proc` prints, or '' once `limit` seconds pass (it is killed then,
    with its process group): a hung CUDA init must not hang the suite."""
    def kill():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    timer = threading.Timer(limit, kill)
    timer.start()
    try:
        return proc.stdout.readline()
    finally:
        timer.cancel()


class Owner:
    """A GPU owner the suite started (see OWNER_LIFE)."""

    def __init__(self, proc, stderr):
        self.proc = proc
        self.stderr = stderr
        self.pid = None
        self.children = []

    def line(self, word):
        text = read_line(self.proc)
        parts = text.split()
        if not parts or parts[0] != word:
            self.stderr.seek(0)
            raise AssertionError(f"the owner printed {text!r}, not {word}; its stderr ends: "
                                 f"{self.stderr.read()[-800:]!r}")
        return [int(part) for part in parts[1:]]

    def fork_now(self):
        """hold-then-fork: fork the children and exit; returns the children."""
        self.proc.stdin.write("fork\n")
        self.proc.stdin.flush()
        self.children = self.line("CHILD")
        self.proc.wait(timeout=60)
        return self.children


class Exporter:
    def __init__(self, suite, name, proc, port, log_path, log_offset):
        self.suite = suite
        self.name = name
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.log_offset = log_offset
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"exporter {name} exited; see {log_path}"
                assert time.monotonic() < deadline, f"exporter {name} did not start; see {log_path}"
                time.sleep(0.05)

    @classmethod
    def start(cls, suite, spawned, name, log_name, prefix=(), view=None):
        port = free_port()
        log_path = os.path.join(suite.out, log_name)
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        log = open(log_path, "a")
        # Its own session, so a stop reaches it through unshare, which ignores SIGTERM.
        proc = spawned.add(subprocess.Popen(
            list(prefix) + suite.argv("--web.listen-address", f"127.0.0.1:{port}"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=suite.gpu.env(view)), group=True)
        log.close()
        return cls(suite, name, proc, port, log_path, offset)

    def scrape(self, record=None):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()
        if record:
            self.suite.record(f"/metrics ({self.name}): {record}", excerpt(body))
        return parse(body)

    def log(self):
        with open(self.log_path) as f:
            f.seek(self.log_offset)
            return f.read()

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=20)


# --- the suite --------------------------------------------------------------------

class Suite:
    def __init__(self, binary, out, gpu):
        self.binary = binary
        self.out = out
        self.gpu = gpu
        self.rows = []
        self.facts = {"durations_s": {}}
        self.processes = {}
        self.outputs = []
        self.scenario = None
        self.state = tempfile.mkdtemp(prefix="vram-witness-")  # the witness state's folder
        self.spawned = None  # the current scenario's processes
        self.exporter = None  # the exporter on the host, shared by the scenarios

    # Results.
    def expect(self, what, expected, got, ok=None):
        passed = (expected == got) if ok is None else bool(ok)
        self.rows.append(dict(scenario=self.scenario, check=what, expected=expected, got=got, passed=passed))
        mark = "pass" if passed else "FAIL"
        print(f"{self.scenario:<28} {what:<52} {str(expected):>22} {str(got):>22}  {mark}", flush=True)
        return passed

    def record(self, title, text):
        self.outputs.append(f"===== {self.scenario}: {title}\n{text.rstrip()}\n")

    def describe(self, label, pid):
        facts = describe(pid, self.gpu.device_prefix)
        self.processes.setdefault(self.scenario, {})[label] = facts
        return facts

    # NVML as the harness sees it.
    def used(self):
        return self.gpu.query()["used"]

    def charges(self):
        return {int(pid): (None if used == NOT_AVAILABLE else used)
                for pid, used in self.gpu.query()["charges"].items()}

    def idle(self):
        reading = self.gpu.query()
        return reading["used"] == 0 and not reading["charges"]

    def wait_freed(self, limit=10.0):
        return wait_for("the GPU's memory to be freed", self.idle, limit=limit)

    # The binary.
    def argv(self, *args):
        # Every exporter and check of the run share one witness state, as on a host they
        # share /run/vram-exporter, unless a call names another.
        state = [] if "--path.state" in args else ["--path.state", self.state]
        return [self.binary, *args, *state, *self.gpu.exporter_args()]

    def check(self, *args, prefix=(), view=None, record=None):
        result = subprocess.run(list(prefix) + self.argv("check", *args), capture_output=True,
                                text=True, timeout=90, env=self.gpu.env(view))
        if record:
            self.record(f"{record}: {' '.join(['check', *args])} (exit {result.returncode})",
                        result.stdout + ("\n--- stderr ---\n" + result.stderr if result.stderr else ""))
        return result

    def check_json(self, *args, prefix=(), view=None, record=None):
        result = self.check("--json", *args, prefix=prefix, view=view, record=record)
        try:
            return result.returncode, json.loads(result.stdout)
        except ValueError:
            raise AssertionError(f"check --json printed no JSON (exit {result.returncode}): "
                                 f"{result.stderr[-500:]!r}")

    # Processes.
    def owner(self, mode, nbytes, children=1, child_kind="sleep", prefix=(), own_session=True,
              env=None):
        """Start a GPU owner; by default it leads its own session, as a job from a shell or
        a service does; `env` adds to its environment (MPS's directories make it an MPS
        client). Returns once it holds its memory (READY) or has forked (CHILD)."""
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(
            list(prefix) + [sys.executable, "-c", self.gpu.owner_program, mode, str(nbytes),
                            str(children), child_kind],
            stdin=subprocess.PIPE if mode == "hold-then-fork" else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=own_session,
            env=dict(self.gpu.env(), **(env or {})))
        self.spawned.add(proc, group=own_session)
        owner = Owner(proc, stderr)
        if mode == "fork":
            owner.children = owner.line("CHILD")
        else:
            if mode == "hold-and-fork":
                owner.children = owner.line("CHILD")
            owner.pid = owner.line("READY")[0]
        return owner

    def server(self, nbytes, workers, title=None):
        """Start a server in its own session with `workers` spawn workers holding `nbytes`
        each (see SERVER), retitled `title` with setproctitle when given; returns it and the
        workers' PIDs once every one holds them."""
        stderr = tempfile.TemporaryFile(mode="w+")
        env = self.gpu.env()
        if title:
            env["VRAM_WORKER_TITLE"] = title
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", SERVER, self.gpu.owner_program, str(nbytes), str(workers)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True, env=env), group=True)
        owner = Owner(proc, stderr)
        pids = sorted(owner.line("READY")[0] for _ in range(workers))
        return proc, pids

    def launched_service(self, nbytes):
        """Start an owner through a launcher that gives it its own session (see LAUNCHER);
        returns the launcher, still alive, and the owner's PID."""
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, self.gpu.owner_program, str(nbytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True, env=self.gpu.env()), group=True)
        pid = Owner(proc, stderr).line("CHILD")[0]
        self.spawned.add_pid(pid)
        return proc, pid

    def agent(self):
        """Start an NVML-only client and return it once it holds a device handle."""
        proc = self.spawned.add(subprocess.Popen(
            [sys.executable, "-c", self.gpu.agent_program], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=self.gpu.env()),
            group=True)
        assert read_line(proc).strip() == "UP", "the NVML-only client did not start"
        return proc

    def agent_at(self, pid, attempts=300):
        """Start an NVML-only client at exactly `pid` (free, as a reaped process's PID is)
        through /proc/sys/kernel/ns_last_pid, as a busy node hands a dead owner's PID out
        again; other processes (threads too) may take the number first, so it retries.
        Returns the client and the attempts it took, or (None, attempts)."""
        for attempt in range(1, attempts + 1):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            proc = subprocess.Popen([sys.executable, "-c", self.gpu.agent_program],
                                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                    start_new_session=True, env=self.gpu.env())
            if proc.pid == pid:
                self.spawned.add(proc, group=True)
                assert read_line(proc).strip() == "UP", "the NVML-only client did not start"
                return proc, attempt
            proc.kill()
            proc.wait()
        return None, attempts


SCENARIOS = []


def scenario(number, name, title, *aliases):
    """Register a scenario: --only knows it by `name`, its number or an alias, its rows
    say `number title`; they run in the order registered."""
    def register(function):
        SCENARIOS.append(dict(number=number, name=name, title=title, aliases=aliases, run=function))
        return function
    return register
