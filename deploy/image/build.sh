#!/usr/bin/env bash
# Build the vram-exporter container image with buildah, from nothing but this machine's
# Debian packages and the release build: no base image is pulled (FROM scratch).
#
# The image holds the exporter, the dynamic loader and exactly the shared libraries it
# needs, taken from this machine (found with ldd), plus the parts of glibc that NVIDIA's
# libnvidia-ml.so.1 links against. NVML itself is not in the image: the NVIDIA container
# toolkit mounts the driver's libnvidia-ml.so.1 into /usr/lib/<multiarch triplet> of the
# container, which the loader searches, and runs ldconfig there.
#
#   deploy/image/build.sh                      # cargo build --release, then the image
#   deploy/image/build.sh --binary PATH        # an exporter binary built elsewhere
#   deploy/image/build.sh --image REF          # another name (default below)
#   deploy/image/build.sh --print-image        # print the default name and exit
#   deploy/image/build.sh --print-source       # print the source label's address and exit
#
# The source label is VRAM_EXPORTER_SOURCE_URL, or else the address of the checkout's
# origin remote (git@host:path and ssh:// remotes as https://host/path).
#
# The image runs as nobody (65534) by default. A complete holder scan needs
# CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE, which only root gets without file capabilities:
# the DaemonSet in deploy/kubernetes runs it as user 0 with every other capability
# dropped (docs/kubernetes.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
image="localhost/vram-exporter:$version"
binary=""
print_source=no
while (($#)); do
    case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --image) image=${2:?--image needs a name}; shift 2 ;;
    --print-image) echo "$image"; exit 0 ;;
    --print-source) print_source=yes; shift ;;
    -h | --help) usage ;;
    *) echo "build.sh: unknown argument $1" >&2; usage ;;
    esac
done

# Where the source lives, for the source label: VRAM_EXPORTER_SOURCE_URL,
# or else the checkout's `origin` remote as a web address; none is made up.
source_url=${VRAM_EXPORTER_SOURCE_URL:-}
if [[ -z $source_url ]] && remote=$(git remote get-url origin 2>/dev/null); then
    case "$remote" in
    https://* | http://*) source_url=$(sed -E 's|^(https?://)[^/@]*@|\1|' <<<"$remote") ;;
    ssh://*) source_url=$(sed -E 's|^ssh://([^/@]*@)?([^/:]*)(:[0-9]+)?/|https://\2/|' <<<"$remote") ;;
    *@*:*) source_url=$(sed -E 's|^[^@]*@([^:]*):/?|https://\1/|' <<<"$remote") ;;
    esac
    source_url=${source_url%.git}
    source_url=${source_url%/}
fi
[[ $print_source == no ]] || { echo "$source_url"; exit 0; }

command -v buildah >/dev/null || {
    echo "build.sh: buildah is not installed; install it with: apt-get install -y buildah" >&2
    exit 1
}
command -v ldd >/dev/null || {
    echo "build.sh: ldd is not installed; install it with: apt-get install -y libc-bin" >&2
    exit 1
}

if [[ -z $binary ]]; then
    # The developer's own release build, with nothing in the environment that it would
    # not have: build.rs finds the same revision either way, and a variable that a plain
    # `cargo build --release` lacks would make the next one rebuild everything.
    echo "build.sh: cargo build --release" >&2
    cargo build --release --locked --bin vram-exporter
    binary=target/release/vram-exporter
fi
[[ -x $binary ]] || { echo "build.sh: $binary is not an executable" >&2; exit 1; }
# The revision the binary itself reports (`--version`, as in vram_build_info), so that
# the label and the metric never disagree, whoever built the binary.
revision=$("$binary" --version 2>/dev/null | sed -n 's/^vram-exporter .* (revision \(.*\))$/\1/p')
[[ -n $revision ]] || revision=unknown

source_labels=()
if [[ -n $source_url ]]; then
    source_labels=(--label "org.opencontainers.image.source=$source_url")
else
    echo "build.sh: no source address (set VRAM_EXPORTER_SOURCE_URL, or clone with an origin remote): the image gets no source label" >&2
fi

case "$(uname -m)" in
x86_64) triplet=x86_64-linux-gnu; platform=linux/amd64 ;;
aarch64) triplet=aarch64-linux-gnu; platform=linux/arm64 ;;
*) echo "build.sh: no multiarch triplet known for $(uname -m)" >&2; exit 1 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
libdir="$root/usr/lib/$triplet"
mkdir -p "$root/usr/local/bin" "$libdir" "$root/etc" "$root/usr/lib64"
install -m 0755 "$binary" "$root/usr/local/bin/vram-exporter"

# What the binary links against, as ldd resolves it here: `name => /path (address)` for
# libraries, `/path (address)` for the loader (its PT_INTERP, which must stay where the
# binary says). A statically linked binary has neither.
ldd_output=$(ldd "$binary" 2>&1) || {
    echo "build.sh: ldd cannot read $binary: $ldd_output" >&2
    exit 1
}
libraries=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$ldd_output")
loader=$(awk '$1 ~ /^\// { print $1 }' <<<"$ldd_output")
libc=$(awk '$1 == "libc.so.6" && $3 ~ /^\// { print $3 }' <<<"$ldd_output")
[[ -n $libc && -n $loader ]] || {
    echo "build.sh: $binary does not link glibc dynamically:" >&2
    echo "$ldd_output" >&2
    exit 1
}
# libnvidia-ml.so.1 is linked against these parts of glibc (libpthread, libdl and librt
# are stubs since glibc 2.34, but their names must still resolve). The toolkit mounts
# only NVIDIA's own libraries, so they come from here, beside libc.
for extra in libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6; do
    path="$(dirname "$libc")/$extra"
    [[ -e $path ]] || { echo "build.sh: $path is missing" >&2; exit 1; }
    libraries+=$'\n'"$path"
done
copied=()
for library in $(sort -u <<<"$libraries"); do
    # Under the name the loader looks for (the soname), with the content it points to.
    install -m 0755 "$(readlink -f "$library")" "$libdir/$(basename "$library")"
    copied+=("$(basename "$library")")
done
mkdir -p "$root$(dirname "$loader")"
install -m 0755 "$(readlink -f "$loader")" "$root$loader"

# A user table for `nobody` (the default user) and root (the DaemonSet's), and the
# library directories for the toolkit's ldconfig: Debian's loader searches
# /usr/lib/<triplet> by itself; hosts whose toolkit mounts NVML into /usr/lib64 rely on
# the cache ldconfig writes.
printf 'root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf '/usr/lib/%s\n/usr/lib64\n' "$triplet" >"$root/etc/ld.so.conf"

# The image's creation time is the commit's, so a rebuild of one commit is the same image.
created_epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
created=$(date -u -d "@$created_epoch" +%Y-%m-%dT%H:%M:%SZ)
cat >"$work/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
USER 65534:65534
EXPOSE 9077
ENTRYPOINT ["/usr/local/bin/vram-exporter"]
EOF

echo "build.sh: $image from $binary with ${copied[*]} and $(basename "$loader")" >&2
buildah bud \
    --quiet \
    --layers=false \
    --timestamp "$created_epoch" \
    --platform "$platform" \
    --label "org.opencontainers.image.title=vram-exporter" \
    --label "org.opencontainers.image.description=Prometheus exporter that tells live GPU memory from orphaned GPU memory" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.created=$created" \
    --label "org.opencontainers.image.licenses=Apache-2.0" \
    "${source_labels[@]}" \
    --tag "$image" \
    --file "$work/Containerfile" \
    "$work" >/dev/null
echo "$image"
