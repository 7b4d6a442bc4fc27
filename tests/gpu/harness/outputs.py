"""Reading what the exporter says: the samples of /metrics, and what `check` prints and
its JSON."""

import re

from harness.procfs import comm_of


def parse(text):
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        labels = {}
        name = head
        if "{" in head:
            name, body = head.split("{", 1)
            for part in body.rstrip("}").split('",'):
                if part:
                    key, val = part.split('="', 1)
                    labels[key] = val.rstrip('"')
        samples.append((name, labels, float(value)))
    return samples


# Families that write only their non-zero members (docs/reference.md): counts by kind and
# the one active kind of a state set. A missing member is 0.
SPARSE_FAMILIES = {
    "vram_nvml_error", "vram_gpu_error", "vram_gpu_recovery_action", "vram_owner_processes",
    "vram_owned_bytes", "vram_gone_owner_processes", "vram_owner_processes_usage_unavailable",
    "vram_exited_container_processes", "vram_holder_processes", "vram_mig_owner_processes",
    "vram_mig_holder_processes", "vram_kubelet_error", "vram_container_engine_error",
}


def value(samples, name, **labels):
    found = [v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    if name in SPARSE_FAMILIES:
        assert len(found) <= 1 and 0.0 not in found, f"{name}{labels}: {found}"
        return found[0] if found else 0.0
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def series(samples, name, **labels):
    """The label sets of every sample of `name` matching `labels`."""
    return [l for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]


def owners(samples, state):
    return value(samples, "vram_owner_processes", gpu=0, state=state)


def orphaned(samples):
    return (value(samples, "vram_orphaned_bytes", gpu=0, reason="owner_gone")
            + value(samples, "vram_orphaned_bytes", gpu=0, reason="unattributed"))


def holder_pids(samples):
    """PIDs `vram_holder_info` names on GPU 0 (culprits only)."""
    return sorted(int(l["pid"]) for l in series(samples, "vram_holder_info", gpu=0))


def holders(samples, role):
    return value(samples, "vram_holder_processes", gpu=0, role=role)


def excerpt(text):
    """The series a reader of a scenario looks at, without HELP and TYPE lines."""
    keep = ("vram_owner", "vram_owned", "vram_gone", "vram_orphaned", "vram_unattributed",
            "vram_holder", "vram_used", "vram_host_pid", "vram_procfs")
    return "\n".join(line for line in text.splitlines() if line.startswith(keep))


# --- what `check` prints ----------------------------------------------------------

STARTED = r"(?:started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|started \d+ s after boot)"


def culprit_words(pid, comm, state, evidence):
    """How the verdict sentence names a culprit: `PID 524 (python3, sleeping, started ...,
    user root, parent 1, <evidence>)`; a container or more evidence may follow."""
    return (rf"PID {pid} \({re.escape(comm)}, {state}, {STARTED}(?:, user [^,()]+)?, parent \d+"
            rf"[^()]*?, {evidence}[^()]*\)")


def names_only_the_child(text, dead, child):
    """Whether `check`'s verdict on GPU 0 names the dead owner's forked child, and it alone,
    as the holder of the dead owner's memory. The child's parent is whoever adopted it
    (init, or a subreaper): not asserted."""
    return re.search(
        rf"GPU 0: .* held for exited PID {dead}; still held by "
        + culprit_words(child, comm_of(child), "sleeping",
                        "holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, "
                        rf"in the process group and session of exited PID {dead}")
        + rf" - killing {child} should free it\.", text) is not None


def kill_line(text):
    """The PIDs of the `suggested: kill ...` line, or None when there is none."""
    found = re.search(r"^  suggested: kill ([0-9 ]+?)   # ", text, re.M)
    return [int(pid) for pid in found.group(1).split()] if found else None


def exit_line(text):
    found = re.search(r"^exit status (\d+): (.*)$", text, re.M)
    return found.group(0) if found else None


def gpu0(doc):
    return next(gpu for gpu in doc["gpus"] if gpu["index"] == 0)


def pids(items):
    return sorted(item["pid"] for item in items)


def kill_targets(gpu):
    remedy = gpu.get("remedy") or {}
    return sorted(target["pid"] for target in remedy.get("targets", []))


def kinds(suspect):
    return [evidence["kind"] for evidence in suspect["evidence"]]


def find(items, pid):
    return next((item for item in items if item["pid"] == pid), None)
