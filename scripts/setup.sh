#!/usr/bin/env bash
# Installs what a fresh machine of this kind lacks (Debian packages, rustfmt/clippy) and
# builds the cluster binaries once into ~/.cache/proxyfleet. Idempotent and quick when warm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
need=()
# cmake: aws-lc-sys (the proxy's TLS provider) builds with it where its own C build does not apply.
for pkg_cmd in containerd:containerd runc:runc iptables:iptables conntrack:conntrack socat:socat \
               nginx:nginx-light haproxy:haproxy wrk:wrk lua5.1:lua5.1 prometheus:prometheus curl:curl jq:jq openssl:openssl \
               cmake:cmake; do
  c=${pkg_cmd%%:*}; p=${pkg_cmd##*:}
  command -v "$c" >/dev/null 2>&1 || need+=("$p")
done
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts these as services on install; our tests start their own instances.
  for s in nginx haproxy prometheus prometheus-node-exporter containerd; do
    (service "$s" stop || systemctl stop "$s") >/dev/null 2>&1 || true
  done
fi
if command -v rustup >/dev/null 2>&1; then
  for comp in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$comp" || { log "adding rust component $comp"; rustup component add "$comp" >/dev/null; }
  done
fi
bash "$root/e2e/lib/build-k8s.sh"
