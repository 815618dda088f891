#!/usr/bin/env bash
# Builds kube-apiserver from Debian bookworm's `kubernetes` source package
# (1.20.2, the newest Kubernetes that can be had offline here: the source
# tree ships its vendor/ directory and builds with Debian's Go), and installs
# etcd-server 3.4. The binary is cached in build/kube-apiserver/bin, so only
# the first run pays (about 5-10 minutes on 2 cores).
#
# Fixes applied to the 1.20 tree:
# - rsync is needed by the build scripts;
# - vendor/github.com/modern-go/reflect2 is replaced by Debian's 1.0.2
#   (golang-github-modern-go-reflect2-dev): the vendored copy crashes with
#   Go >= 1.18 on the first CRD object.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/build/kube-apiserver"
BIN="$OUT/bin/kube-apiserver"
if [ -x "$BIN" ] && command -v etcd >/dev/null; then
    echo "kube-apiserver: cached at $BIN"
    exit 0
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if [ ! -e /etc/apt/sources.list.d/deb-src-bookworm.sources ]; then
    $SUDO tee /etc/apt/sources.list.d/deb-src-bookworm.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $SUDO apt-get update -qq
fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    dpkg-dev golang-go rsync jq openssl etcd-server golang-github-modern-go-reflect2-dev >/dev/null
if [ ! -x "$BIN" ]; then
    mkdir -p "$OUT/src" "$OUT/bin"
    cd "$OUT/src"
    if [ ! -d kubernetes ]; then
        apt-get source --download-only kubernetes >/dev/null
        tar xzf kubernetes_*.orig.tar.gz
        mv "$(find . -maxdepth 1 -type d -name 'kubernetes*' ! -name kubernetes | head -1)" kubernetes
    fi
    cd kubernetes
    rm -rf vendor/github.com/modern-go/reflect2
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
    export GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on GOTOOLCHAIN=local
    export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
    make WHAT=cmd/kube-apiserver >/dev/null
    cp _output/bin/kube-apiserver "$BIN"
fi
echo "kube-apiserver: built $("$BIN" --version)"
