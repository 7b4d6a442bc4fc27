#!/usr/bin/env bash
# The pinned programs that the chart's and the release workflow's tests need and that
# neither Debian nor cargo provides, installed once into a cache that later runs reuse (a
# second run costs nothing):
#
#   helm            built with this machine's Go from its module (helm.sh/helm/v4)
#                   through the Go module proxy
#   validate        tests/tools/validate.py with kubernetes-validate from the Python
#                   registry (the Kubernetes API schemas, offline) in a virtual
#                   environment of its own, and the Prometheus Operator's
#                   CustomResourceDefinitions, which controller-gen (a Go module too)
#                   writes from the Operator's Go types (tests/tools/crds/go.mod)
#   actionlint      the GitHub Actions linter, built with Go from its module
#                   (github.com/rhysd/actionlint), for .github/workflows/
#
#   setproctitle    the Python package SGLang's and vLLM's workers rename themselves
#                   with, from the Python registry, into a folder of its own that the
#                   model servers of the after-kill tests put on PYTHONPATH
#
#   tests/tools.sh install          install what is missing, saying what before it does
#   tests/tools.sh install helm     only helm (the release workflow packages the chart)
#   tests/tools.sh missing          say what `install` would install, and install nothing
#   tests/tools.sh path helm        print where helm is, or fail with the line that installs it
#   tests/tools.sh path validate
#   tests/tools.sh path actionlint
#   tests/tools.sh path setproctitle
#
# The cache is $VRAM_EXPORTER_TOOLS, by default ~/.cache/vram-exporter-tools, one folder
# per tool and version: changing a version below installs the new one beside the old.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v4.3.2
CONTROLLER_TOOLS_VERSION=v0.23.0
ACTIONLINT_VERSION=v1.7.12
# The version tests/tools/crds/go.mod requires.
PROMETHEUS_OPERATOR_VERSION=$(sed -n 's|^require github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring \(v[^ ]*\)$|\1|p' tests/tools/crds/go.mod)
KUBERNETES_VALIDATE_VERSION=$(sed -n 's/^kubernetes-validate==//p' tests/tools/requirements.txt)
SETPROCTITLE_VERSION=1.3.8

cache=${VRAM_EXPORTER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/vram-exporter-tools}
helm_dir="$cache/helm-$HELM_VERSION"
venv="$cache/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
crds="$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
actionlint_dir="$cache/actionlint-$ACTIONLINT_VERSION"
setproctitle_dir="$cache/setproctitle-$SETPROCTITLE_VERSION"

say() { echo "tests/tools.sh: $*" >&2; }

need_go() {
    command -v go >/dev/null || {
        say "$1 is built with Go, which is not installed: install Go 1.26 or newer (https://go.dev/doc/install), then run tests/tools.sh install"
        exit 1
    }
}

install_helm() {
    [[ -x $helm_dir/helm ]] && return
    need_go helm
    say "installing helm $HELM_VERSION: go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION into $helm_dir (a few minutes, once)"
    local start=$SECONDS
    # As helm's own release build: no cgo (nothing to compile in C), no debug symbols,
    # and the version `helm version` prints.
    CGO_ENABLED=0 GOBIN="$helm_dir.partial" go install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
    # Only a complete build takes the name that later runs look for.
    rm -rf "$helm_dir"
    mv "$helm_dir.partial" "$helm_dir"
    say "helm $HELM_VERSION built in $((SECONDS - start)) s"
}

install_validate() {
    # A virtual environment cannot move (its scripts name its path), so it is made where
    # it stays, and counts as installed only once its last step has left a mark.
    if [[ ! -e $venv/installed ]]; then
        say "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (pip, tests/tools/requirements.txt) into $venv"
        rm -rf "$venv"
        python3 -m venv "$venv" || {
            say "python3 -m venv failed; on Debian install it with: apt-get install -y python3-venv"
            exit 1
        }
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            --requirement tests/tools/requirements.txt
        touch "$venv/installed"
    fi
    if [[ ! -d $crds ]]; then
        need_go "The Prometheus Operator's CRDs are"
        local controller_gen="$cache/controller-gen-$CONTROLLER_TOOLS_VERSION/controller-gen"
        if [[ ! -x $controller_gen ]]; then
            say "installing controller-gen $CONTROLLER_TOOLS_VERSION: go install sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
            GOBIN="$(dirname "$controller_gen")" go install \
                "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
        fi
        say "writing the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs into $crds (controller-gen)"
        rm -rf "$crds.partial"
        # The Operator's own settings (its Makefile): no descriptions, floats allowed.
        (cd tests/tools/crds && "$controller_gen" crd:crdVersions=v1,maxDescLen=0,allowDangerousTypes=true \
            paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
            "output:crd:dir=$crds.partial")
        mv "$crds.partial" "$crds"
    fi
}

install_setproctitle() {
    [[ -e $setproctitle_dir/installed ]] && return
    say "installing setproctitle $SETPROCTITLE_VERSION (pip) into $setproctitle_dir"
    rm -rf "$setproctitle_dir"
    # The validator's pip: the same python3 that runs the model servers, and a pip that
    # Debian's python3 may lack.
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
        --target "$setproctitle_dir" "setproctitle==$SETPROCTITLE_VERSION"
    touch "$setproctitle_dir/installed"
}

install_actionlint() {
    [[ -x $actionlint_dir/actionlint ]] && return
    need_go actionlint
    say "installing actionlint $ACTIONLINT_VERSION: go install github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION into $actionlint_dir (a minute, once)"
    CGO_ENABLED=0 GOBIN="$actionlint_dir.partial" go install \
        "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
    rm -rf "$actionlint_dir"
    mv "$actionlint_dir.partial" "$actionlint_dir"
}

# One line per tool that `install` would install: what, and where.
missing() {
    [[ -x $helm_dir/helm ]] ||
        echo "helm $HELM_VERSION: built with Go (go install helm.sh/helm/v4/cmd/helm) into $helm_dir"
    [[ -e $venv/installed ]] ||
        echo "kubernetes-validate $KUBERNETES_VALIDATE_VERSION: pip into a virtual environment in $venv"
    [[ -d $crds ]] ||
        echo "the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs: written by controller-gen $CONTROLLER_TOOLS_VERSION (built with Go) into $crds"
    [[ -x $actionlint_dir/actionlint ]] ||
        echo "actionlint $ACTIONLINT_VERSION: built with Go (go install github.com/rhysd/actionlint/cmd/actionlint) into $actionlint_dir"
    [[ -e $setproctitle_dir/installed ]] ||
        echo "setproctitle $SETPROCTITLE_VERSION: pip (the validator's) into $setproctitle_dir"
    return 0
}

case "${1:-}" in
install)
    mkdir -p "$cache"
    case "${2:-}" in
    "")
        install_helm
        install_validate
        install_actionlint
        install_setproctitle
        ;;
    helm) install_helm ;;
    *) say "install takes nothing (everything) or helm"; exit 2 ;;
    esac
    ;;
missing)
    missing
    ;;
path)
    case "${2:-}" in
    helm) tool=$helm_dir/helm ;;
    validate) tool=$venv/bin/python ;;
    actionlint) tool=$actionlint_dir/actionlint ;;
    setproctitle)
        if [[ ! -e $setproctitle_dir/installed ]]; then
            say "setproctitle is not installed; install it with: tests/tools.sh install"
            exit 1
        fi
        echo "$setproctitle_dir"
        exit 0
        ;;
    *) say "path takes helm, validate, actionlint or setproctitle"; exit 2 ;;
    esac
    if [[ ! -x $tool ]] || { [[ $2 == validate ]] && [[ ! -e $venv/installed || ! -d $crds ]]; }; then
        say "$2 is not installed; install it with: tests/tools.sh install"
        exit 1
    fi
    if [[ $2 == validate ]]; then
        # The command that validates: python, the script, and the CRDs it reads.
        printf '%s\n' "$tool" "$PWD/tests/tools/validate.py" "--crds=$crds"
    else
        echo "$tool"
    fi
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
