#!/usr/bin/env bash
# Build the .deb, the .rpm and the release tarball (with its SHA-256 sum) from the
# release build, in one command:
#
#   deploy/packages/build.sh                         # into target/packages/
#   deploy/packages/build.sh --out DIR               # somewhere else
#   deploy/packages/build.sh --package-revision N    # the packages' own revision (1)
#   deploy/packages/build.sh --binary PATH           # an exporter built elsewhere
#   deploy/packages/build.sh --maintainer "NAME <EMAIL>"   # who the packages name
#   deploy/packages/build.sh --missing-tools         # say what a build would install
#
# The maintainer is whoever builds the packages, as Debian's tools take it: --maintainer,
# else DEBFULLNAME and DEBEMAIL, else git's user.name and user.email; a build that finds
# no email stops and says so (a Debian Maintainer field must carry one).
#
# The packages are made from [package.metadata.deb] and [package.metadata.generate-rpm]
# in Cargo.toml by cargo-deb and cargo-generate-rpm, pinned below and installed once
# with `cargo install` into a cache that later runs reuse: $VRAM_EXPORTER_TOOLS, by
# default ~/.cache/vram-exporter-tools (as tests/tools.sh does for helm).
#
# The binary is the developer's own release build (`cargo build --release`, which this
# runs with nothing added to the environment, so that it rebuilds nothing a plain one
# would not), packed as built: no strip, so the packages' binary is byte for byte
# target/release/vram-exporter. The packages' version is the crate's, and their revision
# carries the commit's time (UTC), its count of commits and the source revision that
# `vram-exporter --version` prints, so that a later commit's package sorts after an
# earlier one's, as dpkg and rpm compare versions: 0.1.0-1+git20261205143012.341.d70a36fb2e96
# for the .deb, 0.1.0-1.git20261205143012.341.d70a36fb2e96 for the .rpm. A revision git
# does not know (a binary built elsewhere, "unknown") cannot be dated, and a shallow
# clone cannot count: the build stops and says so.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1

cache=${VRAM_EXPORTER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/vram-exporter-tools}
out=target/packages
package_revision=1
binary=""
maintainer=""
missing_tools=no

say() { echo "build.sh: $*" >&2; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

while (($#)); do
    case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --package-revision) package_revision=${2:?--package-revision needs a number}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --maintainer) maintainer=${2:?--maintainer needs NAME <EMAIL>}; shift 2 ;;
    --missing-tools) missing_tools=yes; shift ;;
    -h | --help) usage ;;
    *) say "unknown argument $1"; usage ;;
    esac
done
[[ $package_revision =~ ^[0-9]+$ ]] || {
    say "--package-revision takes a whole number, not '$package_revision'"
    exit 2
}

# The two pinned tools, and where they go: what --missing-tools names when absent.
tool_root() { echo "$cache/$1-$2"; }
if [[ $missing_tools == yes ]]; then
    for pinned in "cargo-deb $CARGO_DEB_VERSION" "cargo-generate-rpm $CARGO_GENERATE_RPM_VERSION"; do
        read -r name version <<<"$pinned"
        [[ -x $(tool_root "$name" "$version")/bin/$name ]] ||
            echo "$name $version: cargo install --locked --debug into $(tool_root "$name" "$version") (deploy/packages/build.sh)"
    done
    exit 0
fi

if [[ -z $maintainer ]]; then
    if [[ -n ${DEBEMAIL:-} ]]; then
        maintainer="${DEBFULLNAME:-$DEBEMAIL} <$DEBEMAIL>"
    elif email=$(git config user.email 2>/dev/null) && [[ -n $email ]]; then
        maintainer="$(git config user.name 2>/dev/null || echo "$email") <$email>"
    fi
fi
name_and_email='^[^<>]+ <[^@<> ]+@[^@<> ]+>$'
[[ $maintainer =~ $name_and_email ]] || {
    say "the packages need a maintainer as NAME <EMAIL> (got '${maintainer}'): pass --maintainer, or set DEBFULLNAME and DEBEMAIL, or git's user.name and user.email"
    exit 2
}

for program in tar gzip sha256sum readelf; do
    command -v "$program" >/dev/null || {
        say "$program is not installed; install it with: apt-get install -y tar gzip coreutils binutils"
        exit 1
    }
done
# cargo-deb's "$auto" dependencies come from dpkg-shlibdeps.
command -v dpkg-shlibdeps >/dev/null || {
    say "dpkg-shlibdeps is not installed; install it with: apt-get install -y dpkg-dev"
    exit 1
}

# `cargo install` of a pinned tool into the cache, once; only a complete install takes
# the name that later runs look for. Built with the debug profile: on a 2-core machine
# cargo-generate-rpm took 6m22s to build optimised and 1m26s not, and packing one
# binary is no work a tool needs optimising for.
tool() {
    local name=$1 version=$2
    local root
    root=$(tool_root "$name" "$version")
    if [[ ! -x $root/bin/$name ]]; then
        say "installing $name $version: cargo install --locked into $root (a few minutes, once)"
        rm -rf "$root.partial"
        cargo install --quiet --locked --debug --version "$version" --root "$root.partial" "$name" >&2
        rm -rf "$root"
        mv "$root.partial" "$root"
    fi
    echo "$root/bin/$name"
}
cargo_deb=$(tool cargo-deb "$CARGO_DEB_VERSION")
cargo_generate_rpm=$(tool cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION")

if [[ -z $binary ]]; then
    say "cargo build --release"
    cargo build --release --locked --bin vram-exporter
    binary=target/release/vram-exporter
fi
[[ -x $binary ]] || { say "$binary is not an executable"; exit 1; }
# The manifests name target/release/vram-exporter: a binary from elsewhere goes there.
if [[ $(realpath "$binary") != $(realpath -m target/release/vram-exporter) ]]; then
    mkdir -p target/release
    cp "$binary" target/release/vram-exporter
fi

# "vram-exporter 0.1.0 (revision d70a36fb2e96)": the version and revision the binary
# itself reports. Neither a .deb's nor an .rpm's revision may hold a '-' ("-dirty").
version_line=$("$binary" --version)
version=$(sed -n 's/^vram-exporter \([^ ]*\) (revision .*)$/\1/p' <<<"$version_line")
revision=$(sed -n 's/^vram-exporter [^ ]* (revision \(.*\))$/\1/p' <<<"$version_line")
[[ -n $version && -n $revision ]] || {
    say "cannot read the version and revision from '$version_line'"
    exit 1
}
crate_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[[ $version == "$crate_version" ]] || {
    say "$binary is version $version, the crate $crate_version: rebuild it"
    exit 1
}
# The commit's time and its count of ancestors before its hash: hashes alone sort at
# random between commits, and commits made in one second (a rebase, a script) share a
# time, but never a count along one history.
commit=${revision%-dirty}
committed=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S "$commit" -- 2>/dev/null) || committed=""
commits=$(git rev-list --count "$commit" -- 2>/dev/null) || commits=""
[[ $committed =~ ^[0-9]{14}$ && $commits =~ ^[0-9]+$ ]] || {
    say "cannot date revision '$revision' (git log in this checkout): build from the git checkout the binary was built from"
    exit 1
}
[[ $(git rev-parse --is-shallow-repository) == false ]] || {
    say "this is a shallow clone, whose commits cannot be counted: fetch its history first (git fetch --unshallow)"
    exit 1
}
package_suffix="git$committed.$commits.${revision//-/.}"

# What the packages carry besides the manifests' own files: the units with the packaged
# binary's path, and the help of every command as the documentation a man page would be.
staged=target/packages/staged
rm -rf "$staged"
mkdir -p "$staged" "$out"
for unit in vram-exporter.service vram-exporter-textfile.service vram-exporter-textfile.timer; do
    sed 's|^ExecStart=/usr/local/bin/vram-exporter|ExecStart=/usr/bin/vram-exporter|' \
        "deploy/systemd/$unit" >"$staged/$unit"
done
# The .rpm's flags file names the textfile directory of RHEL's node_exporter.
sed 's|^VRAM_EXPORTER_TEXTFILE_DIR=.*|VRAM_EXPORTER_TEXTFILE_DIR=/var/lib/node_exporter/textfile_collector|' \
    deploy/packages/vram-exporter.default >"$staged/vram-exporter.sysconfig"
grep -qx 'VRAM_EXPORTER_TEXTFILE_DIR=/var/lib/node_exporter/textfile_collector' "$staged/vram-exporter.sysconfig" || {
    say "deploy/packages/vram-exporter.default sets no VRAM_EXPORTER_TEXTFILE_DIR"
    exit 1
}
{
    echo "$version_line"
    for command in "" check snapshot textfile; do
        echo
        echo "\$ vram-exporter${command:+ $command} --help"
        # shellcheck disable=SC2086
        "$binary" $command --help
    done
} >"$staged/vram-exporter.help.txt"

# Each family's own names: name_version-revision_arch.deb, name-version-release.arch.rpm.
deb="$out/vram-exporter_$version-$package_revision+${package_suffix}_$(dpkg --print-architecture).deb"
rpm="$out/vram-exporter-$version-$package_revision.$package_suffix.$(uname -m).rpm"
say "cargo deb ($CARGO_DEB_VERSION)"
"$cargo_deb" --no-build --no-strip --locked --deb-revision "$package_revision+$package_suffix" \
    --maintainer "$maintainer" --output "$deb" >&2
say "cargo generate-rpm ($CARGO_GENERATE_RPM_VERSION)"
"$cargo_generate_rpm" --set-metadata "release = \"$package_revision.$package_suffix\"" \
    --output "$rpm" >&2

# The tarball: the units as they are in deploy/systemd (the binary in /usr/local/bin),
# for hosts with neither package manager.
arch=$(uname -m)
name="vram-exporter-$version.linux-$arch"
tree="target/packages/$name"
rm -rf "$tree"
mkdir -p "$tree/systemd"
cp "$binary" "$tree/vram-exporter"
cp deploy/systemd/vram-exporter.service deploy/systemd/vram-exporter-textfile.service \
    deploy/systemd/vram-exporter-textfile.timer deploy/systemd/vram-exporter.sysusers.conf \
    "$tree/systemd/"
cp deploy/packages/vram-exporter.default "$tree/vram-exporter.flags"
mkdir -p "$tree/slurm"
cp -p deploy/slurm/epilog deploy/slurm/prolog deploy/slurm/healthcheck deploy/slurm/common.sh \
    deploy/slurm/vram-exporter-slurm.default "$tree/slurm/"
cp alerts/vram-exporter.rules.yml dashboards/vram-exporter.json LICENSE README.md \
    "$staged/vram-exporter.help.txt" "$tree/"
# The same bytes for the same sources: names sorted, owners and times fixed (the
# commit's time, or the epoch outside git), no name or time in the gzip header.
stamp=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$stamp" \
    -C target/packages -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
rm -rf "$tree"

say "built, from $version_line:"
for file in "$deb" "$rpm" "$out/$name.tar.gz" "$out/$name.tar.gz.sha256"; do
    [[ -s $file ]] || { say "$file was not made"; exit 1; }
    echo "$file"
done
