#!/usr/bin/env bash
# The packages, tested by installing them (tests/run.sh runs this after cargo test):
#
# - deploy/packages/build.sh builds the .deb, the .rpm and the tarball twice, the second
#   time with a higher package revision, as a rebuilt package would have; the second
#   build compiles nothing and leaves the release build as it was;
# - the packages' and the tarball's binary is target/release/vram-exporter, byte for
#   byte, and its dynamic dependencies are glibc's alone, of the version the docs name;
# - the .rpm's version, files, config marks, scripts and requirements, read with rpm -qp;
# - a clean Debian root, made here with mmdebstrap from this host's release and package
#   sources, into which tests/packages/in-root.sh installs the .deb, runs it, upgrades
#   it over an edited flags file, removes it while the exporter runs as its user, and
#   purges it (that script says what it checks); then, in the same root, left as it was,
#   tests/packages/in-rpm-root.sh installs, upgrades and erases the .rpm with
#   `rpm --root` (a clean RPM distribution's root takes Fedora's, RHEL's or Rocky's
#   repositories, which this suite cannot reach; that script says what this does not
#   prove);
# - the release image, built with deploy/image/build.sh, is the size docs/kubernetes.md
#   says.
#
# It ends with "N package checks passed", or the check that failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
repository=$PWD

passed=0
ok() {
    passed=$((passed + 1))
    echo "ok - $*"
}
fail() {
    echo "tests/packages/test.sh: FAILED: $*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || fail "it makes a Debian root and installs into it with chroot: run it as root"
for program in mmdebstrap rpm rpm2archive dpkg-deb readelf ldd sha256sum buildah podman; do
    command -v "$program" >/dev/null || fail "$program is missing (tests/run.sh installs it)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

release=target/release/vram-exporter
# Whoever builds packages names themselves; the test, a name of its own.
maintainer="vram-exporter package test <package-test@vram-exporter.invalid>"
refused=0
deploy/packages/build.sh --maintainer "vram-exporter maintainers" --out "$work/0" 2>"$work/build-0.err" || refused=$?
if ((refused != 2)) || ! grep -q "the packages need a maintainer as NAME <EMAIL>" "$work/build-0.err"; then
    fail "build.sh took a maintainer without an email (exit $refused): $(cat "$work/build-0.err")"
fi
deploy/packages/build.sh --maintainer "$maintainer" --out "$work/1" >"$work/build-1.log"
[[ -x $release ]] || fail "build.sh left no $release"
built_at=$(stat -c %Y.%s "$release")
deploy/packages/build.sh --maintainer "$maintainer" --out "$work/2" --package-revision 2 >"$work/build-2.log" 2>"$work/build-2.err"
# Nothing compiled: the package build keeps the release profile fresh.
if grep -q "Compiling" "$work/build-2.err"; then
    fail "the second package build compiled something: $(grep Compiling "$work/build-2.err")"
fi
[[ $(stat -c %Y.%s "$release") == "$built_at" ]] || fail "the second package build rewrote $release"
cargo build --release --locked --bin vram-exporter 2>"$work/cargo.err"
if grep -q "Compiling" "$work/cargo.err"; then
    fail "cargo build --release after the package builds compiled: $(grep Compiling "$work/cargo.err")"
fi
ok "a second package build and a plain cargo build --release compile nothing"

# "vram-exporter 0.1.0 (revision d70a36fb2e96)"
version_line=$("$release" --version)
crate_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
revision=$(sed -n 's/^vram-exporter [^ ]* (revision \(.*\))$/\1/p' <<<"$version_line")
[[ $version_line == "vram-exporter $crate_version (revision $revision)" && -n $revision ]] ||
    fail "unexpected --version: $version_line"
# The commit's time, then the revision: a later commit's package sorts after.
committed=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S "${revision%-dirty}" --)
suffix="git$committed.$(git rev-list --count "${revision%-dirty}" --).${revision//-/.}"

one() {
    local found
    # shellcheck disable=SC2206
    found=($1)
    if ((${#found[@]} != 1)) || [[ ! -e ${found[0]} ]]; then
        fail "expected one file $1, found: ${found[*]}"
    fi
    echo "${found[0]}"
}
deb1=$(one "$work/1/vram-exporter_*.deb")
deb2=$(one "$work/2/vram-exporter_*.deb")
rpm1=$(one "$work/1/vram-exporter-*.rpm")
tarball=$(one "$work/1/vram-exporter-$crate_version.linux-*.tar.gz")

# --- the .deb, from outside ---------------------------------------------------------
[[ $(dpkg-deb -f "$deb1" Version) == "$crate_version-1+$suffix" ]] ||
    fail "the .deb's version is $(dpkg-deb -f "$deb1" Version), not $crate_version-1+$suffix"
[[ $(dpkg-deb -f "$deb2" Version) == "$crate_version-2+$suffix" ]] ||
    fail "the rebuilt .deb's version is $(dpkg-deb -f "$deb2" Version)"
dpkg --compare-versions "$(dpkg-deb -f "$deb2" Version)" gt "$(dpkg-deb -f "$deb1" Version)" ||
    fail "the rebuilt .deb's version is not higher"
# A package of the commit before, as build.sh names it, sorts before this one in both
# package managers, whatever the two hashes.
if parent=$(git rev-parse --short=12 HEAD~1 2>/dev/null); then
    before=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S "$parent" --).$(git rev-list --count "$parent" --)
    dpkg --compare-versions "$crate_version-1+git$before.$parent" lt "$(dpkg-deb -f "$deb1" Version)" ||
        fail "dpkg sorts the parent commit's package after this one's"
    [[ $(rpm --eval "%{lua: print(rpm.vercmp('$crate_version-1.git$before.$parent', '$crate_version-1.$suffix'))}") == -1 ]] ||
        fail "rpm sorts the parent commit's package after this one's"
fi
ok "the .deb's version is the crate's with the commit's time and the revision --version prints ($(dpkg-deb -f "$deb1" Version))"
[[ $(dpkg-deb -f "$deb1" Maintainer) == "$maintainer" ]] ||
    fail "the .deb's Maintainer is $(dpkg-deb -f "$deb1" Maintainer)"
ok "the .deb's Maintainer is the builder's name and email ($maintainer)"

dpkg-deb --fsys-tarfile "$deb1" | tar -xOf - ./usr/bin/vram-exporter >"$work/deb-binary"
cmp -s "$work/deb-binary" "$release" || fail "the .deb's binary is not $release"
ok "the .deb's binary is $release, byte for byte ($(stat -c %s "$release") bytes)"

depends=$(dpkg-deb -f "$deb1" Depends)
[[ $depends =~ ^libc6\ \(\>=\ 2\.[0-9]+\),\ passwd,\ systemd-sysusers$ ]] ||
    fail "the .deb depends on more than glibc, sysusers and passwd: $depends"
ok "the .deb depends on glibc, systemd-sysusers and passwd alone: $depends"

[[ $(dpkg-deb --info "$deb1" conffiles | sort) == "$(printf '%s\n' /etc/default/vram-exporter /etc/default/vram-exporter-slurm)" ]] ||
    fail "the .deb's conffiles: $(dpkg-deb --info "$deb1" conffiles)"
ok "the .deb marks /etc/default/vram-exporter and vram-exporter-slurm, and only them, as configuration"

packaged_files() {
    sort <<EOF
/usr/bin/vram-exporter
/usr/lib/systemd/system/vram-exporter-textfile.service
/usr/lib/systemd/system/vram-exporter-textfile.timer
/usr/lib/systemd/system/vram-exporter.service
/usr/lib/sysusers.d/vram-exporter.conf
/usr/share/doc/vram-exporter/README.md
/usr/share/doc/vram-exporter/vram-exporter.help.txt
/usr/share/vram-exporter/vram-exporter.json
/usr/share/vram-exporter/vram-exporter.rules.yml
/usr/libexec/vram-exporter/slurm/common.sh
/usr/libexec/vram-exporter/slurm/epilog
/usr/libexec/vram-exporter/slurm/healthcheck
/usr/libexec/vram-exporter/slurm/prolog
$1
EOF
}
diff <(packaged_files "$(printf '%s\n' /etc/default/vram-exporter /etc/default/vram-exporter-slurm /usr/share/doc/vram-exporter/copyright)") \
    <(dpkg-deb --fsys-tarfile "$deb1" | tar -tf - | grep -v '/$' | sed 's|^\.||' | sort) ||
    fail "the .deb's files differ from the expected (above)"
ok "the .deb holds the binary, the three units, the sysusers file, rules, dashboard, flags file, help and the Slurm hooks"

# The packaged units are deploy/systemd's with the packaged binary's path.
dpkg-deb -x "$deb1" "$work/deb-tree"
for unit in vram-exporter.service vram-exporter-textfile.service vram-exporter-textfile.timer; do
    diff <(sed 's|^ExecStart=/usr/bin/|ExecStart=/usr/local/bin/|' "$work/deb-tree/usr/lib/systemd/system/$unit") \
        "deploy/systemd/$unit" || fail "the packaged $unit differs from deploy/systemd/$unit by more than the binary's path"
done
cmp -s "$work/deb-tree/usr/lib/sysusers.d/vram-exporter.conf" deploy/systemd/vram-exporter.sysusers.conf ||
    fail "the packaged sysusers file is not deploy/systemd's"
cmp -s "$work/deb-tree/usr/share/vram-exporter/vram-exporter.rules.yml" alerts/vram-exporter.rules.yml ||
    fail "the packaged rules are not alerts/'s"
cmp -s "$work/deb-tree/usr/share/vram-exporter/vram-exporter.json" dashboards/vram-exporter.json ||
    fail "the packaged dashboard is not dashboards/'s"
grep -qxF "\$ vram-exporter textfile --help" "$work/deb-tree/usr/share/doc/vram-exporter/vram-exporter.help.txt" ||
    fail "the packaged help lacks the textfile command's"
diff <("$release" --help) <(sed -n '/^\$ vram-exporter --help$/,/^\$ vram-exporter check --help$/p' \
    "$work/deb-tree/usr/share/doc/vram-exporter/vram-exporter.help.txt" | sed '1d;$d' | sed '$d') ||
    fail "the packaged help is not what --help prints"
for hook in epilog prolog healthcheck common.sh; do
    cmp -s "$work/deb-tree/usr/libexec/vram-exporter/slurm/$hook" "deploy/slurm/$hook" ||
        fail "the packaged Slurm $hook is not deploy/slurm's"
done
for hook in epilog prolog healthcheck; do
    [[ -x $work/deb-tree/usr/libexec/vram-exporter/slurm/$hook ]] || fail "the packaged Slurm $hook is not executable"
done
cmp -s "$work/deb-tree/etc/default/vram-exporter-slurm" deploy/slurm/vram-exporter-slurm.default ||
    fail "the packaged Slurm settings are not deploy/slurm's"
ok "the packaged units, sysusers file, rules and dashboard are the repository's; the help is --help's; the Slurm hooks deploy/slurm's"

# --- the .rpm, read with rpm -qp -----------------------------------------------------
rpm_query() { rpm -qp --nosignature "$@" "$rpm1" 2>/dev/null; }
[[ $(rpm_query --qf '%{VERSION}-%{RELEASE}') == "$crate_version-1.$suffix" ]] ||
    fail "the .rpm's version is $(rpm_query --qf '%{VERSION}-%{RELEASE}')"
ok "the .rpm's version is the crate's with the revision --version prints ($(rpm_query --qf '%{VERSION}-%{RELEASE}'))"
diff <(packaged_files "$(printf '%s\n' /etc/sysconfig/vram-exporter /etc/sysconfig/vram-exporter-slurm /usr/share/licenses/vram-exporter/LICENSE)") \
    <(rpm_query --list | sort) || fail "the .rpm's files differ from the expected (above)"
mkdir -p "$work/rpm-tree"
rpm2archive - <"$rpm1" | tar -xzf - -C "$work/rpm-tree"
diff <(sed 's|^VRAM_EXPORTER_TEXTFILE_DIR=.*|VRAM_EXPORTER_TEXTFILE_DIR=/var/lib/node_exporter/textfile_collector|' \
    deploy/packages/vram-exporter.default) "$work/rpm-tree/etc/sysconfig/vram-exporter" ||
    fail "the .rpm's flags file is not the .deb's with RHEL's textfile directory"
ok "the .rpm holds the same files as the .deb, its flags file in /etc/sysconfig naming RHEL's textfile directory"
[[ $(rpm_query --configfiles | sort) == "$(printf '%s\n' /etc/sysconfig/vram-exporter /etc/sysconfig/vram-exporter-slurm)" ]] ||
    fail "the .rpm's config files: $(rpm_query --configfiles)"
[[ $(rpm_query --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' | grep ' /etc/' | sort) == \
    "$(printf '%s\n' "cn /etc/sysconfig/vram-exporter" "cn /etc/sysconfig/vram-exporter-slurm")" ]] ||
    fail "the .rpm's flags files are not config(noreplace): $(rpm_query --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]')"
ok "the .rpm marks /etc/sysconfig/vram-exporter and vram-exporter-slurm, and only them, as config(noreplace)"
[[ $(rpm_query --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' | grep '/slurm/' | sort) == "$(printf '%s\n' \
    "-rw-r--r-- /usr/libexec/vram-exporter/slurm/common.sh" "-rwxr-xr-x /usr/libexec/vram-exporter/slurm/epilog" \
    "-rwxr-xr-x /usr/libexec/vram-exporter/slurm/healthcheck" "-rwxr-xr-x /usr/libexec/vram-exporter/slurm/prolog")" ]] ||
    fail "the .rpm's Slurm hooks: $(rpm_query --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' | grep '/slurm/')"
ok "the .rpm installs the Slurm hooks in /usr/libexec/vram-exporter/slurm, executable"
[[ $(rpm_query --qf '[%{FILEDIGESTS} %{FILENAMES}\n]' | sed -n 's| /usr/bin/vram-exporter$||p') == \
    "$(sha256sum "$release" | cut -d' ' -f1)" ]] || fail "the .rpm's binary is not $release"
ok "the .rpm's binary is $release (its SHA-256)"
for script in POSTIN:postinst PREUN:prerm POSTUN:postrm; do
    diff <(rpm_query --qf "%{${script%%:*}}") "deploy/packages/scripts/${script#*:}" ||
        fail "the .rpm's %{${script%%:*}} is not deploy/packages/scripts/${script#*:}"
done
[[ $(rpm_query --qf '%{PREIN}') == "(none)" ]] || fail "the .rpm has a pre-install script"
ok "the .rpm's scripts are the .deb's maintainer scripts (post-install, pre- and post-uninstall)"
# Its requirements: glibc's libraries, libgcc_s (which glibc itself needs), the shell its
# scripts run in, sysusers and userdel, and the config() mark rpm gives every package
# with a config file; nothing else.
unexpected=$(rpm_query --requires | grep -v -E '^(libc\.so\.6|libm\.so\.6|ld-linux-x86-64\.so\.2|libgcc_s\.so\.1)\(|^rtld\(GNU_HASH\)$|^rpmlib\(|^config\(vram-exporter\) = |^/bin/sh$|^/usr/bin/systemd-sysusers$|^/usr/sbin/userdel$' || true)
[[ -z $unexpected ]] || fail "the .rpm requires more: $unexpected"
ok "the .rpm requires glibc's libraries, /bin/sh, systemd-sysusers and userdel alone"

# --- the tarball ---------------------------------------------------------------------
(cd "$work/1" && sha256sum --check --quiet "$(basename "$tarball").sha256") || fail "the tarball's SHA-256 does not match"
name=$(basename "$tarball" .tar.gz)
diff <(printf '%s\n' LICENSE README.md slurm/common.sh slurm/epilog slurm/healthcheck slurm/prolog \
    slurm/vram-exporter-slurm.default systemd/vram-exporter-textfile.service systemd/vram-exporter-textfile.timer \
    systemd/vram-exporter.service systemd/vram-exporter.sysusers.conf vram-exporter vram-exporter.flags \
    vram-exporter.help.txt vram-exporter.json vram-exporter.rules.yml | sed "s|^|$name/|") \
    <(tar -tzf "$tarball" | grep -v '/$') || fail "the tarball's files differ from the expected (above)"
tar -xzf "$tarball" -C "$work"
cmp -s "$work/$name/vram-exporter" "$release" || fail "the tarball's binary is not $release"
for file in LICENSE README.md; do
    cmp -s "$work/$name/$file" "$file" || fail "the tarball's $file is not the repository's"
done
ok "the tarball's SHA-256 matches; it holds the binary ($release), units, rules, dashboard, LICENSE, README and the Slurm hooks"

# Only glibc's libraries (and libgcc_s.so.1, which glibc's own packages depend on):
# NVML is loaded at run time. libc itself, always; the loader is named only when the
# linker kept a symbol of its own (fat LTO leaves none).
needed=$(readelf -d "$release" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
beyond_glibc=$(tr ' ' '\n' <<<"$needed" | grep -v -x -E 'ld-linux-x86-64\.so\.2|libc\.so\.6|libgcc_s\.so\.1|libm\.so\.6|' || true)
[[ $needed == *"libc.so.6 "* && -z $beyond_glibc ]] ||
    fail "the binary needs more than glibc's libraries: $needed"
unresolved=$(ldd "$release" | grep -v -E '^\s*(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|(libc|libm|libgcc_s)\.so\.[0-9]+ => )' || true)
[[ -z $unresolved ]] || fail "ldd finds more: $unresolved"
ok "the binary's dynamic dependencies are glibc's alone: $needed"
glibc=$(readelf -V "$release" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
grep -qF "glibc $glibc or newer" docs/deployment.md ||
    fail "docs/deployment.md does not say the binary needs glibc $glibc or newer (readelf -V)"
ok "docs/deployment.md names the glibc the binary needs ($glibc, from readelf -V)"

# --- a clean Debian root ---------------------------------------------------------------
# This host's release and its package sources (as files mmdebstrap pastes in), so that
# the binary meets the glibc it was built against.
codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)
[[ -n $codename ]] || fail "/etc/os-release names no VERSION_CODENAME"
sources=()
for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -s $file ]] && grep -q -v -E '^\s*(#|$)' "$file" && sources+=("$file")
done
((${#sources[@]})) || fail "this host has no apt sources for mmdebstrap to use"
cp "$deb1" "$work/v1.deb"
cp "$deb2" "$work/v2.deb"
cp "$rpm1" "$work/v1.rpm"
cp "$(one "$work/2/vram-exporter-*.rpm")" "$work/v2.rpm"
echo "making a clean $codename root with mmdebstrap and installing into it" >&2
mmdebstrap --quiet --variant=apt --include=systemd,passwd \
    --customize-hook="$repository/tests/packages/in-root.sh \"\$1\" $work $repository" \
    --customize-hook="$repository/tests/packages/in-rpm-root.sh \"\$1\" $work $repository" \
    "$codename" /dev/null "${sources[@]}"
[[ -s $work/in-root.passed ]] || fail "tests/packages/in-root.sh did not finish"
[[ -s $work/in-rpm-root.passed ]] || fail "tests/packages/in-rpm-root.sh did not finish"
passed=$((passed + $(cat "$work/in-root.passed") + $(cat "$work/in-rpm-root.passed")))

# --- the release image ------------------------------------------------------------------
# Its size, as podman lists it, against the figure docs/kubernetes.md gives (within 2 %:
# every change to the code moves it a little; a figure from another release moves it more).
image="localhost/vram-exporter-package-test:$$"
deploy/image/build.sh --binary "$release" --image "$image" >"$work/image.log" 2>&1 ||
    fail "deploy/image/build.sh: $(cat "$work/image.log")"
bytes=$(podman image inspect --format '{{.Size}}' "$image")
podman rmi --force "$image" >/dev/null 2>&1 || true
documented=$(sed -n 's/.*The image is \([0-9.]*\) MB.*/\1/p' docs/kubernetes.md | head -n 1)
[[ -n $documented ]] || fail "docs/kubernetes.md gives no size as 'The image is N MB'"
awk -v bytes="$bytes" -v mb="$documented" 'BEGIN { d = bytes / 1e6 - mb; if (d < 0) d = -d; exit !(d <= mb * 0.02) }' ||
    fail "the image is $(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }') MB ($bytes bytes), docs/kubernetes.md says $documented MB"
ok "the release image is $(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }') MB, as docs/kubernetes.md says ($documented MB)"

echo "$passed package checks passed"
