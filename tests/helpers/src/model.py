"""A model GPU process for the integration tests, started as `python3 -c PROGRAM SPEC`.

SPEC is JSON: it names itself `name`, opens the files in `open`, opens and maps (shared,
one page, read-write as a CUDA context does) the files in `map`, and maps write-only the
files in `map_write_only` and read-only those in `map_read_only` (as the MPS control
daemon maps the GPU's node and nvidiactl), then by `mode` holds them ("hold"), forks
`children` that hold them beside it ("fork-and-stay"), forks `children` named
`child_name` and exits ("fork"; "hold-then-fork" waits for SIGUSR1 first), lets its main
thread exit while another thread holds them ("zombie-leader"), or starts its MPS server
("mps-daemon": a child named `child_name` that drops the parent's mappings, as the real
server, a program of its own, has none of them, and maps `server_map` read-write). It
prints `READY <pid>` once it holds its files, `CHILD <pid>` for each child it leaves
behind, and `SERVER <pid>` before READY once its server holds its files. "hold-and-fork"
forks `children` named `child_name` that keep its files and holds them beside them,
printing `CHILD <pid>` for each before READY.

Mode "server" is an inference server as vLLM and SGLang start theirs: it holds nothing
itself and starts `children` workers through Python's multiprocessing (`start_method`:
spawn, as torch.multiprocessing does, by default; fork, as vLLM starts its engine), each
naming itself `child_name` (and, given a `title`, retitling itself with `setproctitle`, as
SGLang's schedulers and vLLM's engine do) and opening and mapping the files in
`worker_open` and `worker_map`; it prints `WORKER <pid>` for each once all hold them. "daemon" double-forks (fork, setsid, fork) and the middle
process exits, so the holder leads nothing and its parent is whoever adopts it; it
prints `CHILD <pid>` for the holder. "launch-service" starts a holder that leads a
session of its own and exits once it prints `CHILD <pid>`, as a service's launcher does.
"reexec" holds its files, forks a child named `child_name` that maps them too, and on
SIGUSR1 execs a sleeping `python3` under the same PID (keeping its start time).
"""

import ctypes
import json
import mmap
import os
import signal
import sys
import threading
import time

spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None)


def rename(name):
    libc.prctl(15, ctypes.c_char_p(name.encode()), 0, 0, 0)


def park():
    while True:
        time.sleep(1000)


if spec["session_leader"]:
    os.setsid()
rename(spec["name"])
kept = []
for path in spec["open"]:
    kept.append(os.open(path, os.O_RDWR))
for path in spec["map"]:
    fd = os.open(path, os.O_RDWR)
    kept.append(fd)
    kept.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
narrow = []
for key, prot in (("map_write_only", mmap.PROT_WRITE), ("map_read_only", mmap.PROT_READ)):
    for path in spec.get(key, []):
        fd = os.open(path, os.O_RDWR)
        kept.append(fd)
        narrow.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED, prot))
mode = spec["mode"]
# A spawned worker runs this through `exec`, with `spec` and `queue` given.
WORKER = """
import ctypes, mmap, os, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(spec['name'].encode()), 0, 0, 0)
if spec['title']:
    # As SGLang's schedulers and vLLM's engine core do: the title replaces the command
    # line, and the command name is its first 15 bytes.
    import setproctitle
    setproctitle.setproctitle(spec['title'])
kept = [os.open(path, os.O_RDWR) for path in spec['open']]
for path in spec['map']:
    fd = os.open(path, os.O_RDWR)
    kept.append(fd)
    kept.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
queue.put(os.getpid())
while True:
    time.sleep(1000)
"""
if mode == "server":
    import multiprocessing
    context = multiprocessing.get_context(spec.get("start_method", "spawn"))
    queue = context.Queue()
    worker = {
        "name": spec["child_name"],
        "open": spec["worker_open"],
        "map": spec["worker_map"],
        "title": spec.get("title"),
    }
    workers = [
        context.Process(target=exec, args=(WORKER, {"spec": worker, "queue": queue}))
        for _ in range(spec["children"])
    ]
    for process in workers:
        process.start()
    for pid in sorted(queue.get(timeout=60) for _ in workers):
        print("WORKER", pid, flush=True)
if mode == "daemon":
    if os.fork() == 0:
        os.setsid()
        child = os.fork()
        if child == 0:
            rename(spec["child_name"])
            park()
        print("CHILD", child, flush=True)
        os._exit(0)
    os.wait()
    os._exit(0)
if mode == "launch-service":
    if os.fork() == 0:
        os.setsid()
        rename(spec["child_name"])
        print("CHILD", os.getpid(), flush=True)
        park()
    os._exit(0)
if mode == "reexec":
    child = os.fork()
    if child == 0:
        rename(spec["child_name"])
        park()
    print("CHILD", child, flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    print("READY", os.getpid(), flush=True)
    signal.sigwait([signal.SIGUSR1])
    os.execvp("python3", ["python3", "-c", "import time\nwhile True: time.sleep(1000)"])
if mode == "mps-daemon":
    # The MPS control daemon starts its server, a child in its session.
    ready, told = os.pipe()
    server = os.fork()
    if server == 0:
        for mapping in narrow:
            mapping.close()
        rename(spec["child_name"])
        for path in spec["server_map"]:
            fd = os.open(path, os.O_RDWR)
            kept.append(fd)
            kept.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
        os.write(told, b"1")
        park()
    os.read(ready, 1)
    print("SERVER", server, flush=True)
if mode == "hold-and-fork":
    # An owner whose forked children keep its files beside it (DataLoader workers).
    children = []
    for _ in range(spec["children"]):
        child = os.fork()
        if child == 0:
            rename(spec["child_name"])
            park()
        children.append(child)
    for child in children:
        print("CHILD", child, flush=True)
if mode == "fork-and-stay":
    # A container's PID 1 and its child, both holding the context.
    for _ in range(spec["children"]):
        if os.fork() == 0:
            park()
    park()
if mode == "hold-then-fork":
    # A live owner first; on SIGUSR1 it becomes the fork-inherited orphan.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    print("READY", os.getpid(), flush=True)
    signal.sigwait([signal.SIGUSR1])
    mode = "fork"
if mode == "fork":
    children = []
    for _ in range(spec["children"]):
        child = os.fork()
        if child == 0:
            rename(spec["child_name"])
            if spec["child_zombie_leader"]:
                threading.Thread(target=park).start()
                libc.pthread_exit(None)
            park()
        children.append(child)
    for child in children:
        print("CHILD", child, flush=True)
    os._exit(0)
print("READY", os.getpid(), flush=True)
if mode == "zombie-leader":
    threading.Thread(target=park).start()
    libc.pthread_exit(None)
park()
