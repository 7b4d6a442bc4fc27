#!/usr/bin/env bash
# Package the Helm chart for a release, with the image the release publishes as its
# default, so that `helm install` of the released chart needs no image value (the
# chart of the repository names none, and says so until one is set):
#
#   deploy/chart/package.sh --image ghcr.io/OWNER/vram-exporter            # into target/chart/
#   deploy/chart/package.sh --image ghcr.io/OWNER/vram-exporter --out DIR
#
# It copies charts/vram-exporter, sets image.repository in the copy's values.yaml and
# runs `helm package` on it, with $HELM or else the pinned helm that tests/tools.sh
# installs; it prints the .tgz's path. The chart's version and appVersion (the image's
# tag) are Cargo.toml's version: a test fails when they differ.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

image=""
out=target/chart
while (($#)); do
    case "$1" in
    --image) image=${2:?--image needs a repository}; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "package.sh: unknown argument $1" >&2; usage ;;
    esac
done
# A repository as the chart's schema takes it, without a tag or digest (the tag is the
# chart's appVersion), and in lower case, as registries require.
[[ $image =~ ^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)+$ ]] || {
    echo "package.sh: --image takes a repository in lower case, without a tag, such as ghcr.io/owner/vram-exporter, not '$image'" >&2
    exit 2
}
helm=${HELM:-$(tests/tools.sh path helm)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r charts/vram-exporter "$work/vram-exporter"
values="$work/vram-exporter/values.yaml"
[[ $(grep -c '^  repository: ""$' "$values") == 1 ]] || {
    echo "package.sh: charts/vram-exporter/values.yaml has no one empty image.repository to set" >&2
    exit 1
}
sed -i "s|^  repository: \"\"$|  repository: $image|" "$values"
mkdir -p "$out"
"$helm" package "$work/vram-exporter" --destination "$out" | sed -n 's/^Successfully packaged chart and saved it to: //p'
