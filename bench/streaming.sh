#!/usr/bin/env bash
# A 1 GiB download and a 1 GiB upload through the release proxy (TLS front, plain upstream),
# printing the proxy's peak RSS (VmHWM) before and after: bodies must stream with bounded
# memory. Upstreams: python3 -m http.server serving a sparse 1 GiB file, and proxyfleet-echo
# (which reads the upload whole; its memory is not measured).
#   Usage: bench/streaming.sh [SIZE_MIB]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=${1:-1024}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/proxyfleet/target}
bin=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release
work=$(mktemp -d); pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls.key -out tls.crt -subj /CN=localhost -addext subjectAltName=DNS:localhost -days 1 2>/dev/null
mkdir www && truncate -s "${size}M" www/big
cat > proxy.yaml <<YAML
listeners:
  - name: https
    address: "127.0.0.1:18450"
    tls: {certificates: [{certFile: $work/tls.crt, keyFile: $work/tls.key, default: true}]}
admin: {address: "127.0.0.1:18951"}
limits: {maxRequestBodyBytes: $(( (size + 1) * 1024 * 1024 ))}
routes:
  - {name: up, match: {pathPrefix: /up}, upstream: echo, timeout: 300s}
  - {name: down, upstream: files, timeout: 300s}
upstreams:
  - {name: files, endpoints: ["127.0.0.1:18452"]}
  - {name: echo, endpoints: ["127.0.0.1:18453"]}
YAML
(cd www && exec python3 -m http.server 18452 --bind 127.0.0.1) > files.log 2>&1 & pids+=($!)
ECHO_ADDR=127.0.0.1:18453 "$bin/proxyfleet-echo" > echo.log 2>&1 & pids+=($!)
"$bin/proxyfleet-proxy" --config proxy.yaml > proxy.log 2>&1 & proxy=$!; pids+=($proxy)
for _ in $(seq 100); do curl -fs http://127.0.0.1:18452/big -r 0-0 -o /dev/null && curl -fsk https://127.0.0.1:18450/big -r 0-0 -o /dev/null && break; sleep 0.1; done
hwm() { awk '/VmHWM/ {printf "%.1f MiB", $2 / 1024}' /proc/$proxy/status; }
echo "proxy peak RSS before: $(hwm)"
t=$(date +%s.%N)
got=$(curl -sk --cacert tls.crt https://localhost:18450/big --resolve localhost:18450:127.0.0.1 -o /dev/null -w '%{size_download}')
echo "download: $got bytes in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s; proxy peak RSS: $(hwm)"
t=$(date +%s.%N)
answer=$(curl -sk --cacert tls.crt -T www/big https://localhost:18450/up --resolve localhost:18450:127.0.0.1)
echo "upload: ${answer% *} ${answer##* } in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s; proxy peak RSS: $(hwm)"
