#!/usr/bin/env bash
# Builds the OpenTelemetry Collector the tracing tests export to, offline from
# the Go module proxy: the collector's own OTLP receiver (gRPC and HTTP) and
# the contrib file exporter, composed the way the collector's builder (ocb)
# composes a distribution, in one generated main package. The tests read the
# spans the collector writes as OTLP JSON (tests/src/otel_collector.rs).
#
# Pinned at v0.161.0: the newest release whose contrib fileexporter the Go
# module proxy serves with a tidy module graph here; every collector module
# is kept at that one release (the 1.x modules at the versions it requires).
# Output, OUTSIDE the clone so a machine builds it once:
#   ${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}/otelcol-v$VERSION/otelcol
# printed on the last line. Re-running is a no-op once it exists (about two
# minutes the first time on 2 cores).
set -euo pipefail
VERSION="${OTELCOL_VERSION:-0.161.0}"
export GOFLAGS=-mod=mod CGO_ENABLED=0
CACHE="${DYNBAL_CACHE:-$HOME/.cache/dynamic-balancer}"
OUT="$CACHE/otelcol-v$VERSION"
mkdir -p "$OUT"
log() { echo "otelcol: $*" >&2; }

if [ -x "$OUT/otelcol" ]; then
    echo "$OUT/otelcol"
    exit 0
fi
command -v go >/dev/null || { log "Go is needed"; exit 1; }

work="$OUT/src"
mkdir -p "$work"
cd "$work"
[ -f go.mod ] || go mod init dynbal-otelcol >/dev/null 2>&1
cat > main.go <<'GO'
// A collector distribution of two components: what ocb generates for a
// manifest naming the otlp receiver and the file exporter.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory()); err != nil {
		return f, err
	}
	return f, nil
}

func main() {
	info := component.BuildInfo{Command: "otelcol", Description: "dynamic-balancer test collector", Version: "VERSION"}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
				DefaultScheme:     "env",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
GO
sed -i "s/\"VERSION\"/\"$VERSION\"/" main.go
log "resolving modules (go $(go env GOVERSION))"
go get "go.opentelemetry.io/collector/otelcol@v$VERSION" \
    "go.opentelemetry.io/collector/receiver/otlpreceiver@v$VERSION" \
    "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter@v$VERSION" >&2
# The env provider is a 1.x module the three above do not require: pinned to
# the confmap release they do, so no newer one on the proxy drifts in.
confmap="$(go list -m -f '{{.Version}}' go.opentelemetry.io/collector/confmap)"
go get "go.opentelemetry.io/collector/confmap/provider/envprovider@$confmap" >&2
go mod tidy >&2
log "building"
go build -trimpath -ldflags="-s -w" -o "$OUT/otelcol.tmp" . >&2
mv "$OUT/otelcol.tmp" "$OUT/otelcol"
echo "$OUT/otelcol"
