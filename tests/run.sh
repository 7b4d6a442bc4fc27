#!/usr/bin/env bash
# The whole test suite: formatting, lint, unit and integration tests.
#
# The integration tests start Debian's prometheus (with promtool) and
# prometheus-alertmanager, python3 for one process shape, buildah, podman and runc to
# build and run the container image and to serve Podman's API, and munge, slurmctld,
# slurmd and Slurm's client commands for a one-node Slurm cluster; cargo cannot install
# those. Missing ones are
# installed when this runs as root with apt-get, otherwise it stops with the line that
# installs them. The chart's tests need a pinned helm, built with Go from its module,
# and an offline Kubernetes validator from the Python registry: tests/tools.sh installs
# them into a cache when missing (saying what it installs first) and reuses them after.
# No test is ever skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
command -v promtool >/dev/null || packages+=(prometheus)
command -v prometheus >/dev/null || packages+=(prometheus)
command -v prometheus-alertmanager >/dev/null || packages+=(prometheus-alertmanager)
command -v python3 >/dev/null || packages+=(python3)
# The validator's virtual environment (Debian's python3 splits venv out).
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
command -v systemd-analyze >/dev/null || packages+=(systemd)
# The build-info tests make scratch repositories (a source tarball builds without git).
command -v git >/dev/null || packages+=(git)
# The container image: built with buildah, run with podman through Debian's runc.
command -v buildah >/dev/null || packages+=(buildah)
command -v podman >/dev/null || packages+=(podman)
[[ -x /usr/sbin/runc ]] || packages+=(runc)
# A one-node Slurm cluster (tests/integration/slurm.rs).
[[ -x /usr/sbin/munged ]] || packages+=(munge)
[[ -x /usr/sbin/slurmctld ]] || packages+=(slurmctld)
[[ -x /usr/sbin/slurmd ]] || packages+=(slurmd)
command -v sbatch >/dev/null || packages+=(slurm-client)
if ((${#packages[@]})); then
    # shellcheck disable=SC2207
    packages=($(printf '%s\n' "${packages[@]}" | sort -u))
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "tests/run.sh: installing ${packages[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        # Without an init system, the daemons' packages fail to configure when they try
        # to start them: the tests start their own. A policy that forbids starting
        # services, for the install only, unless the host has one already.
        no_policy=
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            echo "tests/run.sh: forbidding service starts (/usr/sbin/policy-rc.d) while installing" >&2
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            no_policy=1
        fi
        apt-get update -qq
        apt-get install -y -qq "${packages[@]}" >/dev/null
        [[ -z $no_policy ]] || rm -f /usr/sbin/policy-rc.d
    else
        echo "tests/run.sh: missing ${packages[*]}; install them with:" >&2
        echo "    sudo apt-get install -y ${packages[*]}" >&2
        exit 1
    fi
fi

# helm and the validator for tests/integration/helm.rs (a no-op once installed).
tests/tools.sh install

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

# The real-GPU suite's own plumbing, dry-run against the fake NVML, so that it keeps up
# with the exporter's outputs between runs on a GPU (docs/gpu-validation.md).
dry_run_out=$(mktemp -d)
python3 tests/gpu/dry_run.py --binary target/debug/vram-exporter \
    --library target/debug/deps/libfake_nvml.so --out "$dry_run_out"
rm -rf "$dry_run_out"
