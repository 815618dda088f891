#!/usr/bin/env bash
# Builds the official Gateway API conformance suite, v1.7.0, offline from
# the Go module proxy: the `conformance.test` binary (the suite with its
# manifests embedded, sigs.k8s.io/gateway-api/conformance) and `echo-basic`,
# the backend every conformance test talks to
# (sigs.k8s.io/gateway-api-conformance-images/echo-basic).
#
# Two pins differ from upstream's go.mod, both because of what the proxy
# serves (docs/src/controller/gateway-api.md, "Conformance"):
# - conformance@v1.7.0 replaces sigs.k8s.io/gateway-api with `../`; a
#   consuming module pins it to v1.7.0 instead.
# - it requires sigs.k8s.io/gateway-api-conformance-images v0.2.0, which the
#   proxy refuses; v0.1.0 has the same gRPC echo service and the same
#   servers (HTTP, h2c, HTTPS, TCP, UDP echo), so both the suite and the
#   image use v0.1.0. The suite's manifests name the images
#   `echo-basic:v0.1.0` and `:v0.2.0`; `cluster conformance` tags this one
#   build as both.
#
# v1.7.0 needs Go 1.27 (GOTOOLCHAIN=go1.27.3, served by the Go proxy).
# Output, OUTSIDE the clone so a machine builds it once:
#   ${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}/gateway-conformance-v$VERSION/bin
# printed on the last line. Re-running is a no-op once both binaries exist
# (about 3-5 minutes the first time on 2 cores).
set -euo pipefail
VERSION="${GATEWAY_CONFORMANCE_VERSION:-1.7.0}"
IMAGES_VERSION="${GATEWAY_CONFORMANCE_IMAGES_VERSION:-0.1.0}"
export GOTOOLCHAIN="${GOTOOLCHAIN_CONFORMANCE:-go1.27.3}" GOFLAGS=-mod=mod CGO_ENABLED=0
CACHE="${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}"
OUT="$CACHE/gateway-conformance-v$VERSION"
BIN="$OUT/bin"
mkdir -p "$BIN"
log() { echo "gateway conformance: $*" >&2; }

if [ -x "$BIN/conformance.test" ] && [ -x "$BIN/echo-basic" ]; then
    echo "$BIN"
    exit 0
fi
command -v go >/dev/null || { log "Go is needed (it fetches go1.27.3 itself)"; exit 1; }

work="$OUT/src"
mkdir -p "$work"
cd "$work"
[ -f go.mod ] || go mod init dynbal-gateway-conformance >/dev/null 2>&1
go mod edit \
    -require="sigs.k8s.io/gateway-api/conformance@v$VERSION" \
    -require="sigs.k8s.io/gateway-api@v$VERSION" \
    -require="sigs.k8s.io/gateway-api-conformance-images@v$IMAGES_VERSION" \
    -replace="sigs.k8s.io/gateway-api=sigs.k8s.io/gateway-api@v$VERSION" \
    -replace="sigs.k8s.io/gateway-api-conformance-images=sigs.k8s.io/gateway-api-conformance-images@v$IMAGES_VERSION"
cat > conformance_test.go <<'GO'
// The upstream entry point, unchanged: flags select the profile, the
// GatewayClass and the report (see tests/src/bin/cluster.rs, `conformance`).
package conformance_test

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
GO
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/gateway-api-conformance-images/echo-basic"
GO
log "resolving modules (go $(go env GOVERSION))"
go mod tidy >&2
log "building conformance.test"
go test -c -trimpath -o "$BIN/conformance.test.tmp" . >&2
mv "$BIN/conformance.test.tmp" "$BIN/conformance.test"
log "building echo-basic"
go build -trimpath -ldflags="-s -w" -o "$BIN/echo-basic.tmp" sigs.k8s.io/gateway-api-conformance-images/echo-basic >&2
mv "$BIN/echo-basic.tmp" "$BIN/echo-basic"
echo "$BIN"
