#!/usr/bin/env bash
# Run by tests/packages/test.sh as mmdebstrap's customize hook, from outside a clean
# Debian root that has nothing but the essential packages, apt, systemd and passwd:
#
#   tests/packages/in-root.sh ROOT WORK REPOSITORY
#
# WORK holds v1.deb and v2.deb (the same package, the second with a higher revision).
# In the root it installs v1 and checks: the user exists, no unit is enabled, the binary
# prints the host's release build's --version and the same `check --replay` of the
# shipped story, `systemd-analyze verify` passes on the installed units, the Slurm epilog
# runs from where slurm.conf names it and says what it finds. Then it edits
# the flags file, upgrades to v2 (the edit is kept), starts the exporter as its user,
# removes the package (no process of the user is left, the flags file is) and purges it
# (the root is as it was before the install: files, users and groups). It writes the
# number of its checks to WORK/in-root.passed.
set -euo pipefail
root=${1:?the root}
work=${2:?the work folder}
repository=${3:?the repository}
release="$repository/target/release/vram-exporter"

passed=0
ok() {
    passed=$((passed + 1))
    echo "ok - in the Debian root: $*"
}
fail() {
    echo "tests/packages/in-root.sh: FAILED: $*" >&2
    exit 1
}
in_root() {
    DEBIAN_FRONTEND=noninteractive chroot "$root" "$@"
}

# The exporter in the root reads /proc as it serves.
if ! mountpoint -q "$root/proc"; then
    mount -t proc proc "$root/proc"
    trap 'umount "$root/proc"' EXIT
fi

# What the root holds before the install, to compare with what the purge leaves. Left
# out: the kernel's and the package manager's own records, logs and caches, and what
# shadow's tools write on every change to the user database on any host (their lock
# file and the backups passwd- and the like), which belong to passwd, not to this package.
inventory() {
    (cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o -path ./tmp \
        -o -path ./var/lib/dpkg -o -path ./var/log -o -path ./var/cache -o -path ./etc/.pwd.lock \
        -o -path ./etc/passwd- -o -path ./etc/group- -o -path ./etc/shadow- -o -path ./etc/gshadow- \) \
        -prune -o -printf '%p %M %u:%g\n' | sort)
    for database in passwd group shadow gshadow; do
        echo "--- /etc/$database"
        cat "$root/etc/$database"
    done
}
# The test's own files in the root, made before the first inventory so that it counts
# them on both sides.
inside=/srv/package-test
mkdir -p "$root$inside"
cp "$work/v1.deb" "$work/v2.deb" "$repository/examples/story-gpu2-orphaned.json" "$root$inside/"
inventory >"$work/before"

in_root dpkg --install "$inside/v1.deb" >"$work/dpkg-install.log" 2>&1 || {
    cat "$work/dpkg-install.log" >&2
    fail "dpkg --install v1.deb"
}
ok "dpkg --install v1.deb"

entry=$(in_root getent passwd vram-exporter) || fail "no user vram-exporter after the install"
IFS=: read -r _ _ uid _ _ home shell <<<"$entry"
if ((uid >= 1000)) || [[ $shell != /usr/sbin/nologin || $home != / ]]; then
    fail "the user is not a system user without a shell: $entry"
fi
in_root getent group vram-exporter >/dev/null || fail "no group vram-exporter after the install"
ok "the install made the system user vram-exporter ($entry) through sysusers"

for unit in vram-exporter.service vram-exporter-textfile.timer vram-exporter-textfile.service; do
    state=$(in_root systemctl is-enabled "$unit" 2>&1 || true)
    [[ $state == disabled || $state == static ]] || fail "$unit is $state after the install"
done
enabled=$(find "$root/etc/systemd" -name 'vram-exporter*' 2>/dev/null || true)
[[ -z $enabled ]] || fail "the install enabled units: $enabled"
ok "the install enables no unit"

[[ $(in_root vram-exporter --version) == "$("$release" --version)" ]] ||
    fail "--version in the root: $(in_root vram-exporter --version)"
ok "vram-exporter --version: $(in_root vram-exporter --version)"

status=0
in_root vram-exporter check --replay "$inside/story-gpu2-orphaned.json" >"$work/check-root" 2>&1 || status=$?
expected=0
"$release" check --replay "$repository/examples/story-gpu2-orphaned.json" >"$work/check-host" 2>&1 || expected=$?
((status == 1 && expected == 1)) || fail "check --replay exited $status in the root, $expected on the host (1: orphaned memory)"
diff "$work/check-host" "$work/check-root" || fail "check --replay says something else in the root"
ok "check --replay of the shipped story exits 1 and says what the release build says ($(grep -c '' "$work/check-root") lines)"


# No --man=no: the units' Documentation= names the packaged README, which is there,
# where systemd's man pages (which verify would open with man) are not.
said=$(in_root systemd-analyze verify /usr/lib/systemd/system/vram-exporter.service \
    /usr/lib/systemd/system/vram-exporter-textfile.service /usr/lib/systemd/system/vram-exporter-textfile.timer 2>&1) ||
    fail "systemd-analyze verify: $said"
[[ -z $said ]] || fail "systemd-analyze verify warns: $said"
ok "systemd-analyze verify passes on the installed units, man pages or not"

# What the textfile unit runs, with the flags file's variables, as the user: the file
# appears in the directory the flags file names (Debian's), made for the user as an
# operator would, and taken away again before the last inventory.
textfile_dir=/var/lib/prometheus/node-exporter
grep -qx "VRAM_EXPORTER_TEXTFILE_DIR=$textfile_dir" "$root/etc/default/vram-exporter" ||
    fail "the .deb's flags file does not name Debian's textfile directory"
mkdir -p "$root$textfile_dir"
in_root chown vram-exporter:vram-exporter "$textfile_dir"
in_root setpriv --reuid=vram-exporter --regid=vram-exporter --clear-groups /bin/sh -c \
    ". /etc/default/vram-exporter && exec vram-exporter textfile --replay $inside/story-gpu2-orphaned.json \
    -o \"\$VRAM_EXPORTER_TEXTFILE_DIR/vram-exporter.prom\" \$VRAM_EXPORTER_TEXTFILE_ARGS" >"$work/textfile.log" 2>&1 ||
    fail "the textfile command with the flags file: $(cat "$work/textfile.log")"
grep -q '^vram_orphaned_bytes{' "$root$textfile_dir/vram-exporter.prom" ||
    fail "no metrics in $textfile_dir/vram-exporter.prom"
ok "the flags file names $textfile_dir, where the textfile command writes as the user"

# The Slurm hooks where slurm.conf names them, with the installed binary and the
# installed settings file (a copy, with a log of its own; in /tmp, which the inventory
# leaves out). With no NVML in the root the epilog cannot tell, and leaves the node in
# service; on the shipped story's GPU 2, orphaned, it fails (and, with no scontrol in
# the root, says it cannot drain).
hooks=/usr/libexec/vram-exporter/slurm
for hook in epilog prolog healthcheck; do
    [[ -x $root$hooks/$hook ]] || fail "the .deb did not install an executable $hooks/$hook"
done
slurm_settings() {
    cp "$root/etc/default/vram-exporter-slurm" "$root/tmp/slurm-settings"
    printf '%s\n' "VRAM_EXPORTER_LOG=/tmp/hooks.log" "VRAM_EXPORTER_EPILOG_WAIT=1s" "$@" >>"$root/tmp/slurm-settings"
    rm -f "$root/tmp/hooks.log"
}
epilog() {
    in_root env -i SLURM_JOB_ID=7 SLURM_JOB_GPUS="$1" SLURMD_NODENAME=node1 \
        VRAM_EXPORTER_SLURM_SETTINGS=/tmp/slurm-settings "$hooks/epilog"
}
slurm_settings
status=0
epilog 0 || status=$?
((status == 0)) || fail "the epilog without NVML exited $status: $(cat "$root/tmp/hooks.log")"
grep -q "vram-exporter-epilog: job 7: cannot tell whether GPUs 0 are free, so the node stays in service: NVML down: " \
    "$root/tmp/hooks.log" || fail "the epilog without NVML said: $(cat "$root/tmp/hooks.log")"
slurm_settings "VRAM_EXPORTER_CHECK_ARGS=\"--replay $inside/story-gpu2-orphaned.json\"" "VRAM_EXPORTER_GPU_NUMBERING=nvml"
status=0
epilog 2 || status=$?
((status == 1)) || fail "the epilog of a job on the story's GPU 2 exited $status: $(cat "$root/tmp/hooks.log")"
grep -q "vram-exporter-epilog: job 7: GPUs 2 still hold memory after the job: GPU 2 orphaned: 74.3 GiB" \
    "$root/tmp/hooks.log" || fail "the epilog on the story's GPU 2 said: $(cat "$root/tmp/hooks.log")"
grep -q "vram-exporter-epilog: job 7: cannot drain node node1 " "$root/tmp/hooks.log" ||
    fail "the epilog did not say it cannot drain without scontrol: $(cat "$root/tmp/hooks.log")"
rm -f "$root/tmp/slurm-settings" "$root/tmp/hooks.log"
ok "the Slurm hooks run from $hooks with the installed settings: unknown without NVML, a failed epilog on an orphan"

# An operator's edit, then the rebuilt package with a higher version over it.
flags=$root/etc/default/vram-exporter
sed -i 's|^VRAM_EXPORTER_ARGS=.*|VRAM_EXPORTER_ARGS="--web.listen-address=:9177 --log.level=debug"|' "$flags"
echo "# edited by the package test" >>"$flags"
cp "$flags" "$work/flags-edited"
in_root dpkg --install "$inside/v2.deb" >"$work/dpkg-upgrade.log" 2>&1 || {
    cat "$work/dpkg-upgrade.log" >&2
    fail "dpkg --install v2.deb over v1"
}
# shellcheck disable=SC2016 # dpkg-query's own ${Version}, not the shell's.
version=$(in_root dpkg-query --show --showformat='${Version}' vram-exporter)
[[ $version == "$(dpkg-deb -f "$work/v2.deb" Version)" ]] || fail "after the upgrade the version is $version"
cmp -s "$flags" "$work/flags-edited" || fail "the upgrade changed the edited flags file: $(diff "$work/flags-edited" "$flags")"
leftovers=$(find "$root/etc/default" -name 'vram-exporter.dpkg-*')
[[ -z $leftovers ]] || fail "the upgrade left $leftovers"
ok "the upgrade to $version kept the edited /etc/default/vram-exporter"

# The exporter running as its user, as the service would, when the package goes.
in_root setpriv --reuid=vram-exporter --regid=vram-exporter --clear-groups \
    /usr/bin/vram-exporter --replay "$inside/story-gpu2-orphaned.json" --web.listen-address=127.0.0.1:0 \
    >"$work/serving.log" 2>&1 &
serving=$!
for _ in $(seq 100); do
    grep -q 'msg=listening' "$work/serving.log" && break
    kill -0 "$serving" 2>/dev/null || break
    sleep 0.1
done
grep -q 'msg=listening' "$work/serving.log" || fail "the exporter did not start as vram-exporter: $(cat "$work/serving.log")"
user_processes() {
    for dir in /proc/[0-9]*; do
        [[ $(stat -c %u "$dir" 2>/dev/null) == "$uid" ]] && echo "${dir#/proc/}"
    done
    return 0
}
[[ -n $(user_processes) ]] || fail "no process runs as vram-exporter (uid $uid) while the exporter serves"
in_root dpkg --remove vram-exporter >"$work/dpkg-remove.log" 2>&1 || {
    cat "$work/dpkg-remove.log" >&2
    fail "dpkg --remove"
}
grep -q "stopping the processes of user vram-exporter: [0-9]" "$work/dpkg-remove.log" ||
    fail "the removal did not say it stopped the exporter: $(cat "$work/dpkg-remove.log")"
left=$(user_processes)
[[ -z $left ]] || fail "processes of vram-exporter left after the removal: $left"
wait "$serving" || true
[[ ! -e $root/usr/bin/vram-exporter ]] || fail "dpkg --remove left the binary"
[[ ! -e $root$textfile_dir/vram-exporter.prom ]] || fail "dpkg --remove left the textfile output, which node_exporter would go on serving"
cmp -s "$flags" "$work/flags-edited" || fail "dpkg --remove did not keep the edited flags file"
ok "dpkg --remove stopped the exporter running as vram-exporter, removed the files and the textfile output, and kept the flags file"

in_root dpkg --purge vram-exporter >"$work/dpkg-purge.log" 2>&1 || {
    cat "$work/dpkg-purge.log" >&2
    fail "dpkg --purge"
}
rmdir "$root$textfile_dir" "$root/var/lib/prometheus"
inventory >"$work/after"
diff "$work/before" "$work/after" || fail "the purge left the root otherwise than it was (above)"
ok "dpkg --purge left the root as it was before the install: files, users and groups"

echo "$passed" >"$work/in-root.passed"
