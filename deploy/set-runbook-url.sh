#!/usr/bin/env bash
# Sets the runbook URL: where your site serves docs/runbook.md (a Git server's view of
# your copy of this repository, a wiki, a docs site). Every alert's runbook_url is this
# URL, `#` and the alert's name in lower case; the dashboard's Runbook link is this URL.
#
#   deploy/set-runbook-url.sh https://gitlab.example.com/ops/vram-exporter/-/blob/main/docs/runbook.md
#
# It replaces the current one, the chart's default `runbookBaseUrl`, in every file that
# carries it: the rules and their unit tests (alerts/), the runbook's table of settings,
# the dashboard, the chart (its default value, its README and its copies of the rules
# and the dashboard) and the plain manifests in deploy/kubernetes/. With Helm, set the chart's value instead:
# `helm install ... --set runbookBaseUrl=URL`.
set -euo pipefail
cd "$(dirname "$0")/.."

new=${1:-}
if [[ $# -ne 1 || ! $new =~ ^https?://. || $new == *[[:space:]\#\|\'\"\\]* ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    echo "set-runbook-url.sh: give one http(s) URL, without spaces, quotes, | or #" >&2
    exit 2
fi
current=$(sed -n 's/^runbookBaseUrl: //p' charts/vram-exporter/values.yaml)
[[ -n $current ]] || {
    echo "set-runbook-url.sh: charts/vram-exporter/values.yaml has no runbookBaseUrl line" >&2
    exit 1
}
[[ $new != "$current" ]] || { echo "set-runbook-url.sh: already $new"; exit 0; }

mapfile -t files < <(grep -rlF -- "$current" alerts docs/runbook.md dashboards charts/vram-exporter deploy/kubernetes | sort)
for file in "${files[@]}"; do
    # Literal text on both sides: only the URL's own characters, no pattern.
    NEW=$new CURRENT=$current perl -pi -e 's/\Q$ENV{CURRENT}\E/$ENV{NEW}/g' "$file"
    echo "set-runbook-url.sh: $file"
done
echo "set-runbook-url.sh: runbook URL $current -> $new in ${#files[@]} files"
