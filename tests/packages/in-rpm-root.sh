#!/usr/bin/env bash
# Run by tests/packages/test.sh as mmdebstrap's customize hook, after in-root.sh has
# installed and purged the .deb in the same root (which it left as it was):
#
#   tests/packages/in-rpm-root.sh ROOT WORK REPOSITORY
#
# WORK holds v1.rpm and v2.rpm (the same package, the second with a higher release). No
# RPM distribution's root can be made here (that takes Fedora's, RHEL's or Rocky's
# repositories, and this suite reaches Debian's alone), so the host's rpm installs them
# into this clean root with `rpm --root`, which runs their scriptlets chrooted into it.
# The root's rpm database is empty, so rpm cannot resolve the requirements: the test
# checks them itself (each required file and library is in the root) and installs with
# --nodeps. Then the same checks as the .deb's: install (the user, no unit enabled, the
# --version and `check --replay` of the release build, `systemd-analyze verify`, the
# flags file with RHEL's textfile directory, which the textfile command writes to as the
# unit would), an upgrade over an edited flags file (kept), an erase while the exporter
# runs as its user (stopped, its files and user gone, the edit saved as .rpmsave), and
# the root as it was before but for rpm's own records. It writes the number of its
# checks to WORK/in-rpm-root.passed.
#
# What this does not prove: that dnf resolves the requirements against a RHEL rpm
# database (they are checked as files here); that RHEL's /bin/sh (bash), shadow-utils
# and systemd-sysusers run the scriptlets as Debian's do; that the rpm of RHEL 8 or 9
# (4.14, 4.16) reads a package built by the rpm crate as this rpm (4.18) does; SELinux
# labels and policy; and the units under RHEL 8's systemd 239, which ignores the newer
# sandboxing directives (ProtectClock=, ProtectKernelLogs=, ...) with a warning.
set -euo pipefail
root=${1:?the root}
work=${2:?the work folder}
repository=${3:?the repository}
release="$repository/target/release/vram-exporter"

passed=0
ok() {
    passed=$((passed + 1))
    echo "ok - in the RPM-installed root: $*"
}
fail() {
    echo "tests/packages/in-rpm-root.sh: FAILED: $*" >&2
    exit 1
}
in_root() {
    chroot "$root" "$@"
}
# The database where RHEL keeps it (Debian's rpm would keep it in root's home).
rpm_root() {
    rpm --root "$root" --dbpath /var/lib/rpm --nosignature "$@"
}

if ! mountpoint -q "$root/proc"; then
    mount -t proc proc "$root/proc"
    trap 'umount "$root/proc"' EXIT
fi

# As in-root.sh's, and rpm's own records left out as dpkg's are there.
inventory() {
    (cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o -path ./tmp \
        -o -path ./var/lib/dpkg -o -path ./var/lib/rpm -o -path ./usr/lib/sysimage/rpm -o -path ./var/log \
        -o -path ./var/cache -o -path ./etc/.pwd.lock \
        -o -path ./etc/passwd- -o -path ./etc/group- -o -path ./etc/shadow- -o -path ./etc/gshadow- \) \
        -prune -o -printf '%p %M %u:%g\n' | sort)
    for database in passwd group shadow gshadow; do
        echo "--- /etc/$database"
        cat "$root/etc/$database"
    done
}
inside=/srv/rpm-test
mkdir -p "$root$inside"
cp "$work/v1.rpm" "$work/v2.rpm" "$repository/examples/story-gpu2-orphaned.json" "$root$inside/"
inventory >"$work/rpm-before"
# Where RHEL's node_exporter reads text files: the operator's, made for this user once the
# package made the user (below), and taken away again before the last inventory.
textfile_dir=/var/lib/node_exporter/textfile_collector

# What dnf would resolve: every requirement the package states is a file or a library
# in this root.
missing=()
while read -r requirement; do
    case "$requirement" in
    /*) [[ -e $root$requirement ]] || missing+=("$requirement") ;;
    rpmlib\(* | rtld\(* | config\(*) ;;
    *.so*\(*)
        library=${requirement%%(*}
        [[ -n $(find "$root/lib" "$root/lib64" "$root/usr/lib" "$root/usr/lib64" -name "$library" 2>/dev/null | head -n 1) ]] ||
            missing+=("$requirement")
        ;;
    *) missing+=("$requirement (neither a file nor a library)") ;;
    esac
done < <(rpm -qp --nosignature --requires "$work/v1.rpm" 2>/dev/null | sed 's/ *[<>=].*//' | sort -u)
((${#missing[@]} == 0)) || fail "the root lacks what the .rpm requires: ${missing[*]}"
ok "every requirement of the .rpm is in the root: $(rpm -qp --nosignature --requires "$work/v1.rpm" 2>/dev/null | grep -c '')"

rpm_root --initdb
rpm_root --install --nodeps "$work/v1.rpm" >"$work/rpm-install.log" 2>&1 || {
    cat "$work/rpm-install.log" >&2
    fail "rpm --root --install v1.rpm"
}
# Debian's rpm says it is not Debian's package manager; sysusers says what it made.
# Anything else (a scriptlet's error or warning) is a failure.
said=$(grep -v -E '^$|^rpm: (RPM should not be used directly|However assuming you know what you are doing)|^Creating (group|user) .vram-exporter.' \
    "$work/rpm-install.log" || true)
[[ -z $said ]] || fail "the install said: $said"
[[ $(rpm_root -q vram-exporter) == "$(rpm -qp --nosignature "$work/v1.rpm" 2>/dev/null)" ]] ||
    fail "rpm -q after the install: $(rpm_root -q vram-exporter)"
ok "rpm --root --install v1.rpm, its %post run in the root"

entry=$(in_root getent passwd vram-exporter) || fail "no user vram-exporter after the install"
IFS=: read -r _ _ uid _ _ home shell <<<"$entry"
if ((uid >= 1000)) || [[ $shell != /usr/sbin/nologin || $home != / ]]; then
    fail "the user is not a system user without a shell: $entry"
fi
in_root getent group vram-exporter >/dev/null || fail "no group vram-exporter after the install"
ok "the install made the system user vram-exporter ($entry) through sysusers"

enabled=$(find "$root/etc/systemd" -name 'vram-exporter*' 2>/dev/null || true)
[[ -z $enabled ]] || fail "the install enabled units: $enabled"
ok "the install enables no unit"

[[ $(in_root vram-exporter --version) == "$("$release" --version)" ]] ||
    fail "--version in the root: $(in_root vram-exporter --version)"
status=0
in_root vram-exporter check --replay "$inside/story-gpu2-orphaned.json" >"$work/rpm-check-root" 2>&1 || status=$?
"$release" check --replay "$repository/examples/story-gpu2-orphaned.json" >"$work/rpm-check-host" 2>&1 || true
if ((status != 1)) || ! diff -q "$work/rpm-check-host" "$work/rpm-check-root" >/dev/null; then
    fail "check --replay in the root exited $status or said something else"
fi
ok "the installed binary prints the release build's --version and check --replay"

said=$(in_root systemd-analyze verify /usr/lib/systemd/system/vram-exporter.service \
    /usr/lib/systemd/system/vram-exporter-textfile.service /usr/lib/systemd/system/vram-exporter-textfile.timer 2>&1) ||
    fail "systemd-analyze verify: $said"
[[ -z $said ]] || fail "systemd-analyze verify warns: $said"
ok "systemd-analyze verify passes on the installed units, man pages or not"

flags=$root/etc/sysconfig/vram-exporter
grep -qx "VRAM_EXPORTER_TEXTFILE_DIR=$textfile_dir" "$flags" ||
    fail "the .rpm's flags file does not name RHEL's textfile directory: $(grep TEXTFILE_DIR "$flags")"
# What the textfile unit runs, with the flags file's variables, as the user: the file
# appears in the directory the flags file names.
mkdir -p "$root$textfile_dir"
in_root chown vram-exporter:vram-exporter "$textfile_dir"
in_root setpriv --reuid=vram-exporter --regid=vram-exporter --clear-groups /bin/sh -c \
    ". /etc/sysconfig/vram-exporter && exec vram-exporter textfile --replay $inside/story-gpu2-orphaned.json \
    -o \"\$VRAM_EXPORTER_TEXTFILE_DIR/vram-exporter.prom\" \$VRAM_EXPORTER_TEXTFILE_ARGS" >"$work/rpm-textfile.log" 2>&1 ||
    fail "the textfile command with the flags file: $(cat "$work/rpm-textfile.log")"
grep -q '^vram_orphaned_bytes{' "$root$textfile_dir/vram-exporter.prom" ||
    fail "no metrics in $textfile_dir/vram-exporter.prom"
ok "the flags file names $textfile_dir, where the textfile command writes as the user"

# An operator's edit, then the rebuilt package over it.
sed -i 's|^VRAM_EXPORTER_ARGS=.*|VRAM_EXPORTER_ARGS="--web.listen-address=:9177"|' "$flags"
echo "# edited by the package test" >>"$flags"
cp "$flags" "$work/rpm-flags-edited"
rpm_root --upgrade --nodeps "$work/v2.rpm" >"$work/rpm-upgrade.log" 2>&1 || {
    cat "$work/rpm-upgrade.log" >&2
    fail "rpm --root --upgrade v2.rpm over v1"
}
[[ $(rpm_root -q vram-exporter) == "$(rpm -qp --nosignature "$work/v2.rpm" 2>/dev/null)" ]] ||
    fail "after the upgrade: $(rpm_root -q vram-exporter)"
cmp -s "$flags" "$work/rpm-flags-edited" || fail "the upgrade changed the edited flags file"
leftovers=$(find "$root/etc/sysconfig" -name 'vram-exporter.rpm*')
[[ -z $leftovers ]] || fail "the upgrade left $leftovers"
in_root getent passwd vram-exporter >/dev/null || fail "the upgrade removed the user"
[[ -e $root$textfile_dir/vram-exporter.prom ]] || fail "the upgrade removed the textfile output"
ok "the upgrade to $(rpm_root -q vram-exporter) kept the edited flags file, the user and the output"

in_root setpriv --reuid=vram-exporter --regid=vram-exporter --clear-groups \
    /usr/bin/vram-exporter --replay "$inside/story-gpu2-orphaned.json" --web.listen-address=127.0.0.1:0 \
    >"$work/rpm-serving.log" 2>&1 &
serving=$!
for _ in $(seq 100); do
    grep -q 'msg=listening' "$work/rpm-serving.log" && break
    kill -0 "$serving" 2>/dev/null || break
    sleep 0.1
done
grep -q 'msg=listening' "$work/rpm-serving.log" || fail "the exporter did not start as vram-exporter: $(cat "$work/rpm-serving.log")"
user_processes() {
    for dir in /proc/[0-9]*; do
        [[ $(stat -c %u "$dir" 2>/dev/null) == "$uid" ]] && echo "${dir#/proc/}"
    done
    return 0
}
[[ -n $(user_processes) ]] || fail "no process runs as vram-exporter (uid $uid) while the exporter serves"
rpm_root --erase vram-exporter >"$work/rpm-erase.log" 2>&1 || {
    cat "$work/rpm-erase.log" >&2
    fail "rpm --root --erase"
}
grep -q "stopping the processes of user vram-exporter: [0-9]" "$work/rpm-erase.log" ||
    fail "the erase did not say it stopped the exporter: $(cat "$work/rpm-erase.log")"
[[ -z $(user_processes) ]] || fail "processes of vram-exporter left after the erase: $(user_processes)"
wait "$serving" || true
[[ ! -e $root/usr/bin/vram-exporter ]] || fail "the erase left the binary"
cmp -s "$flags.rpmsave" "$work/rpm-flags-edited" || fail "the erase did not save the edited flags file as .rpmsave"
ok "rpm --erase stopped the exporter, removed the files and saved the edited flags file as .rpmsave"

[[ -z $(ls -A "$root$textfile_dir") ]] || fail "the erase left $(ls -A "$root$textfile_dir") in $textfile_dir"
rm "$flags.rpmsave"
rmdir "$root$textfile_dir" "$root/var/lib/node_exporter"
inventory >"$work/rpm-after"
# rpm made /etc/sysconfig and /usr/share/licenses for the package's files and leaves
# them: every RHEL host has both (its filesystem package owns them).
diff "$work/rpm-before" <(grep -v -x -e './etc/sysconfig drwxr-xr-x root:root' \
    -e './usr/share/licenses drwxr-xr-x root:root' "$work/rpm-after") ||
    fail "the erase left the root otherwise than it was (above)"
ok "rpm --erase left the root as it was before the install: files, the textfile output, users and groups"

echo "$passed" >"$work/in-rpm-root.passed"
