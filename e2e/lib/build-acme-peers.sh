#!/usr/bin/env bash
# Builds the certificate peers of the e2e tests from the Go module proxy, once per version, into
# $PROXYFLEET_CACHE/bin: cert-manager's controllers (our small main in e2e/peers/cert-manager
# around the root module's packages; CRDs copied beside it), Pebble and its DNS stand-in. A second call is a no-op.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/versions.sh"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
log() { printf '[build-acme-peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
bin=$PROXYFLEET_CACHE/bin
mkdir -p "$bin"
cm=$bin/cert-manager-controller-$CERT_MANAGER_VERSION
crds=$PROXYFLEET_CACHE/cert-manager-$CERT_MANAGER_VERSION-crds.yaml
main_sum=$(sha256sum "$root/e2e/peers/cert-manager/main.go" | cut -c1-12)
if [ ! -x "$cm-$main_sum" ]; then
  start=$(date +%s)
  log "building cert-manager $CERT_MANAGER_VERSION's controllers (cold: a few minutes)"
  src=$PROXYFLEET_CACHE/cert-manager-$CERT_MANAGER_VERSION-src
  mkdir -p "$src"
  cp "$root/e2e/peers/cert-manager/main.go" "$src/main.go"
  printf 'module proxyfleet.local/certmanager\n\ngo 1.26.0\n\nrequire github.com/cert-manager/cert-manager %s\n' "$CERT_MANAGER_VERSION" > "$src/go.mod"
  (cd "$src" && go mod tidy >/dev/null 2>&1 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cm-$main_sum" .)
  moddir=$(cd "$src" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
  cat "$moddir"/deploy/crds/*.yaml > "$crds"
  ln -sf "$cm-$main_sum" "$bin/cert-manager-controller"
  log "cert-manager built in $(( $(date +%s) - start ))s"
fi
for tool in pebble pebble-challtestsrv; do
  if [ ! -x "$bin/$tool-$PEBBLE_VERSION" ]; then
    log "building $tool $PEBBLE_VERSION"
    GOBIN=$bin/pebble-build CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/letsencrypt/pebble/v2/cmd/$tool@$PEBBLE_VERSION"
    mv "$bin/pebble-build/$tool" "$bin/$tool-$PEBBLE_VERSION" && rmdir "$bin/pebble-build"
  fi
  ln -sf "$bin/$tool-$PEBBLE_VERSION" "$bin/$tool"
done
ln -sf "$cm-$main_sum" "$bin/cert-manager-controller"
