#!/usr/bin/env bash
# The whole test suite: formatting, lint, the unit and integration tests, a dry run of
# the real-GPU suite's plumbing, and the packages tested by installing them (as root: it
# makes a Debian root and installs into it). It ends with one line that counts everything.
#
# The integration tests run Debian programs that cargo cannot install (the list below,
# each with why). The chart's and the release workflow's tests need a pinned helm and
# actionlint, built with Go from their modules, and an offline Kubernetes validator
# (tests/tools.sh), and the package test cargo-deb and cargo-generate-rpm
# (deploy/packages/build.sh): all into a cache that later runs reuse. Before anything
# else it says what of these is missing and what it will install, then installs it
# (Debian's packages with apt-get, as root; otherwise it stops with the line that
# installs them). No test is ever skipped.
#
#   tests/run.sh                 say what is missing, install it, run everything
#   tests/run.sh --no-install    install nothing: with anything missing, name it and stop
set -euo pipefail
cd "$(dirname "$0")/.."

install=yes
case "${1:-}" in
"") ;;
--no-install) install=no ;;
-h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "tests/run.sh: unknown argument $1 (tests/run.sh --help)" >&2
    exit 2
    ;;
esac

# Most integration tests wait (on processes, on Prometheus, on deadlines they test)
# rather than compute, so they run more at once than there are cores: on 2 cores the
# integration tests took 70 s with 2 threads, 38 to 49 s with 8 and 45 s with 16.
# RUST_TEST_THREADS, when set, decides instead.
test_threads=${RUST_TEST_THREADS:-8}

started=$SECONDS
step=""
logs=$(mktemp -d)

say() {
    echo "tests/run.sh: $*" >&2
}

elapsed() {
    local seconds=$((SECONDS - started))
    printf '%dm%02ds' $((seconds / 60)) $((seconds % 60))
}

on_exit() {
    local status=$?
    rm -rf "$logs"
    if ((status != 0)); then
        say "FAILED in ${step:-setup} after $(elapsed) (exit status $status)"
    fi
}
trap on_exit EXIT

# The Debian packages the tests need, as "program package why"; a program given as a
# path is looked for there rather than on PATH.
required=(
    "promtool prometheus promtool checks the metrics and tests the alert rules"
    "prometheus prometheus a real Prometheus scrapes the exporter (end to end, dashboard)"
    "prometheus-alertmanager prometheus-alertmanager the orphan alert reaches a real Alertmanager"
    "python3 python3 the model CUDA processes, and the GPU suite's dry run"
    "systemd-analyze systemd systemd-analyze verifies and scores the units"
    "git git the build-info tests make scratch repositories"
    "buildah buildah deploy/image/build.sh builds the container image"
    "podman podman the image runs under podman"
    "/usr/sbin/runc runc podman runs the image through Debian's runc"
    "/usr/sbin/munged munge a one-node Slurm cluster authenticates with munge"
    "/usr/sbin/slurmctld slurmctld the one-node Slurm cluster's controller"
    "/usr/sbin/slurmd slurmd the one-node Slurm cluster's node daemon"
    "sbatch slurm-client the Slurm test submits and cancels a job"
    "mmdebstrap mmdebstrap the package test makes a clean Debian root to install the .deb into"
    "dpkg-shlibdeps dpkg-dev cargo-deb reads the binary's library dependencies with it"
    "rpm rpm the package test reads the .rpm with rpm -qp"
    "readelf binutils the package test lists the binary's dynamic dependencies"
    "shellcheck shellcheck actionlint checks the release workflow's shell steps with it"
)

# The Debian packages missing, each said with why, into `packages`.
packages=()
find_missing_packages() {
    local entry program package why
    for entry in "${required[@]}"; do
        read -r program package why <<<"$entry"
        if [[ $program == /* ]]; then
            [[ -x $program ]] && continue
        else
            command -v "$program" >/dev/null && continue
        fi
        say "missing $program (Debian package $package): $why"
        packages+=("$package")
    done
    # The Kubernetes validator's virtual environment (Debian's python3 splits venv out).
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        say "missing python3's venv (Debian package python3-venv): tests/tools.sh makes the Kubernetes validator's virtual environment"
        packages+=(python3-venv)
    fi
    if ((${#packages[@]})); then
        # shellcheck disable=SC2207
        packages=($(printf '%s\n' "${packages[@]}" | sort -u))
    fi
}

# Everything this run would install, said before anything is: the Debian packages, and
# the pinned tools built into the cache. With --no-install and something missing, it
# stops here.
tools=()
say_what_will_be_installed() {
    step="finding what is missing"
    find_missing_packages
    local line
    if command -v go >/dev/null || [[ -z $(tests/tools.sh missing) ]]; then
        while IFS= read -r line; do tools+=("$line"); done < <(tests/tools.sh missing)
    else
        tools+=("Go 1.26 or newer, which builds helm and actionlint: https://go.dev/doc/install (not installed by this script)")
    fi
    while IFS= read -r line; do tools+=("$line"); done < <(deploy/packages/build.sh --missing-tools)
    if ((${#packages[@]} == 0 && ${#tools[@]} == 0)); then
        say "everything the tests need is installed"
        return 0
    fi
    if [[ $install == no ]]; then
        say "--no-install: installing nothing, and these are missing:"
    else
        say "will install (tests/run.sh --no-install installs nothing):"
    fi
    ((${#packages[@]} == 0)) || say "  Debian packages, with apt-get: ${packages[*]}"
    for line in "${tools[@]}"; do
        say "  $line"
    done
    if [[ $install == no ]]; then
        say "install them (tests/run.sh without --no-install does), then run it again"
        # Stopped as asked, not failed: no FAILED line.
        trap - EXIT
        rm -rf "$logs"
        exit 1
    fi
}

install_missing_packages() {
    step="installing packages"
    ((${#packages[@]})) || return 0
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        say "installing ${packages[*]} with apt-get (running as root)"
        export DEBIAN_FRONTEND=noninteractive
        # Without an init system, the daemons' packages fail to configure when they try
        # to start them: the tests start their own. A policy that forbids starting
        # services, for the install only, unless the host has one already.
        local no_policy=
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            say "forbidding service starts (/usr/sbin/policy-rc.d) while installing"
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            no_policy=1
        fi
        apt-get update -qq
        apt-get install -y -qq "${packages[@]}" >/dev/null
        [[ -z $no_policy ]] || rm -f /usr/sbin/policy-rc.d
    else
        say "install them with:"
        say "    sudo apt-get install -y ${packages[*]}"
        exit 1
    fi
}

check_formatting() {
    step="cargo fmt"
    cargo fmt --all -- --check
}

lint() {
    step="cargo clippy"
    cargo clippy --workspace --all-targets --locked -- -D warnings
}

run_tests() {
    step="cargo test"
    cargo test --workspace --locked -- --test-threads "$test_threads" 2>&1 |
        tee "$logs/cargo-test"
}

# The real-GPU suite's own plumbing, dry-run against the fake NVML, so that it keeps up
# with the exporter's outputs between runs on a GPU (docs/gpu-validation.md).
dry_run_gpu_suite() {
    step="GPU suite dry run"
    local out
    out=$(mktemp -d -p "$logs")
    # The scripts that run only on a GPU host (peers.py, where_it_goes.py, ...) are at
    # least parsed here, so that none is found broken on the day a GPU is lent.
    python3 -c 'import ast, sys
for path in sys.argv[1:]:
    ast.parse(open(path).read(), path)' tests/gpu/*.py
    # Scenario 5g's workers retitle themselves with setproctitle (tests/tools.sh).
    PYTHONPATH="$(tests/tools.sh path setproctitle)" \
        python3 tests/gpu/dry_run.py --binary target/debug/vram-exporter \
        --library target/debug/deps/libfake_nvml.so \
        --latency-client target/debug/examples/scrape_latency --out "$out" 2>&1 |
        tee "$logs/dry-run"
}

# The .deb, the .rpm and the tarball, built with deploy/packages/build.sh from the
# release build and tested by installing the .deb into a clean Debian root
# (tests/packages/test.sh says what it checks). Its first run installs the two pinned
# packaging tools into the same cache as tests/tools.sh's (a few minutes, once).
test_packages() {
    step="package test"
    tests/packages/test.sh 2>&1 | tee "$logs/packages"
}

# "18 fake-NVML + 177 unit + 160 integration tests": what cargo test ran, by test binary
# (named after its target: the library's unit tests, the fake NVML's, the integration
# tests), from its "Running ..." and "test result: ..." lines.
count_tests() {
    awk '
        /^ *Running / {
            target = $NF; sub(/.*\//, "", target); sub(/-[0-9a-f]+\)$/, "", target)
            if (target == "vram_exporter") label = "unit"
            else if (target == "fake_nvml" || target == "nvml") label = "fake-NVML"
            else label = target
        }
        /^ *Doc-tests / { label = "doc" }
        /^test result: / {
            passed = $4
            if (!(label in count)) order[++labels] = label
            count[label] += passed
        }
        END {
            for (i = 1; i <= labels; i++) {
                if (count[order[i]] == 0) continue
                line = line (line == "" ? "" : " + ") count[order[i]] " " order[i]
            }
            print line " tests"
        }
    ' "$logs/cargo-test"
}

# "130 GPU dry-run checks", from the dry run's last line ("130 passed, 0 failed in 9.1 s").
count_dry_run_checks() {
    sed -n 's/^\([0-9]*\) passed, 0 failed in .*/\1 GPU dry-run checks/p' "$logs/dry-run" | tail -n 1
}

# "25 package checks", from the package test's last line ("25 package checks passed").
count_package_checks() {
    sed -n 's/^\([0-9]*\) package checks passed$/\1 package checks/p' "$logs/packages" | tail -n 1
}

# helm, built with Go from its module, and the offline Kubernetes validator, for the
# chart's tests: tests/tools.sh says what it installs before it does, into a cache that
# later runs reuse (a no-op once installed).
install_test_tools() {
    step="installing helm and the Kubernetes validator"
    tests/tools.sh install
}

say_what_will_be_installed
install_missing_packages
install_test_tools
check_formatting
lint
run_tests
dry_run_gpu_suite
test_packages
step="summary"
say "all green in $(elapsed): fmt, clippy, $(count_tests), $(count_dry_run_checks), $(count_package_checks)"
