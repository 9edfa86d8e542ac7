#!/usr/bin/env bash
# HTTP/3 against HTTP/2 and HTTP/1.1 through the same proxyfleet listener (issue 19), side by
# side in one run: the front (one worker, pinned to CPU 1 with FRONT_CPU_PERCENT of it, default
# 50, so the front and not the client is the limit) proxies to the same TLS nginx upstream on
# CPU 0; the load comes from proxyfleet-protobench, one client code for the three protocols,
# pinned to CPU 0. 64 requests in flight in every row: 64 HTTP/1.1 connections, or 4
# connections of 16 streams for HTTP/2 and HTTP/3. Rounds interleave the protocols; medians.
# nginx 1.22 and HAProxy 2.6 as packaged by Debian have no QUIC, so there is no peer row.
# Writes its section of docs/benchmarks.md.
# Usage: bench/h3.sh [SECONDS] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
export FRONT_CPU_PERCENT=${FRONT_CPU_PERCENT:-50}
source "$root/bench/lib.sh"
( cd "$root" && cargo build --release -q -p proxyfleet-proxy --bin proxyfleet-protobench )
BENCH=$CARGO_TARGET_DIR/release/proxyfleet-protobench

cat > "$work/certs/h3-proxyfleet.yaml" <<CONF
workerThreads: 1
listeners:
  - name: https
    address: "127.0.0.1:18461"
    tls:
      certificates: [{certFile: $work/certs/tls.crt, keyFile: $work/certs/tls.key, default: true}]
      http3: {maxConcurrentStreams: 256}
admin: {address: "127.0.0.1:19912"}
limits: {http2: {maxConcurrentStreams: 256}}
routes: [{name: all, upstream: up}]
upstreams:
  - name: up
    endpoints: ["127.0.0.1:19441"]
    tls: {caFile: $work/certs/ca.crt, serverName: localhost}
CONF
setup_quota_cgroup
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec taskset -c 1 "$@"' _ "$QUOTA_CG" \
  "$PROXY" --config "$work/certs/h3-proxyfleet.yaml" --log-format text >"$work/h3-front.out" 2>&1 &
FRONT=$!
trap 'kill $UP $FRONT 2>/dev/null || true; remove_quota_cgroup' EXIT
wait_ready 18461

run() { # run PROTO → JSON line of protobench
  local conns=4 streams=16
  [ "$1" = h1 ] && conns=64 streams=1
  taskset -c 0 "$BENCH" --proto "$1" --connect 127.0.0.1:18461 --name localhost --ca "$work/certs/ca.crt" \
    --connections $conns --streams $streams --duration "${secs}s"
}
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
protos="h1 h2 h3"
declare -A RPS P50 P99 CPU ERR
for round in $(seq 1 "$rounds"); do
  for p in $protos; do
    t0=$(cputicks $FRONT)
    out=$(run $p)
    ticks=$(( $(cputicks $FRONT) - t0 ))
    log "round $round, $p: $out"
    n=$(field "$out" requests)
    RPS[$p]+=" $(field "$out" req_per_s)"; P50[$p]+=" $(field "$out" p50_ms)"; P99[$p]+=" $(field "$out" p99_ms)"
    ERR[$p]+=" $(field "$out" errors)"
    CPU[$p]+=" $(awk -v c="$ticks" -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')"
  done
done
for p in $protos; do
  log "$p rounds: req/s${RPS[$p]}; p99 ms${P99[$p]}; front µs/request${CPU[$p]}; errors${ERR[$p]}"
  RPS[$p]=$(echo "${RPS[$p]}" | median); P50[$p]=$(echo "${P50[$p]}" | median); P99[$p]=$(echo "${P99[$p]}" | median)
  CPU[$p]=$(echo "${CPU[$p]}" | median); ERR[$p]=$(echo "${ERR[$p]}" | tr ' ' '\n' | awk '{ s += $1 } END { print s + 0 }')
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
section=$(cat <<MD
<!-- h3.sh begin -->
## HTTP/3, HTTP/2 and HTTP/1.1 through one listener (\`bench/h3.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

One proxyfleet front (one worker on CPU 1 with ${FRONT_CPU_PERCENT} % of it) serving the same
listener over TCP and over QUIC, proxying to the same TLS nginx upstream on CPU 0.
\`proxyfleet-protobench\` (one client code for the three protocols, on CPU 0) keeps 64 requests
in flight: 64 HTTP/1.1 connections, or 4 connections × 16 streams for HTTP/2 and HTTP/3.
Latencies are closed-loop (at the front's maximum rate). Medians of $rounds interleaved
rounds. nginx 1.22 and HAProxy 2.6 as Debian packages them have no QUIC, so no peer row here.

| | HTTP/1.1 | HTTP/2 | HTTP/3 | h3 / h2 | h3 / h1 |
|---|---|---|---|---|---|
| requests/s | ${RPS[h1]} | ${RPS[h2]} | ${RPS[h3]} | $(ratio "${RPS[h3]}" "${RPS[h2]}") | $(ratio "${RPS[h3]}" "${RPS[h1]}") |
| P50 ms | ${P50[h1]} | ${P50[h2]} | ${P50[h3]} | | |
| P99 ms | ${P99[h1]} | ${P99[h2]} | ${P99[h3]} | $(ratio "${P99[h3]}" "${P99[h2]}") | $(ratio "${P99[h3]}" "${P99[h1]}") |
| front CPU µs per request | ${CPU[h1]} | ${CPU[h2]} | ${CPU[h3]} | $(ratio "${CPU[h3]}" "${CPU[h2]}") | $(ratio "${CPU[h3]}" "${CPU[h1]}") |
| errors (all rounds) | ${ERR[h1]} | ${ERR[h2]} | ${ERR[h3]} | | |
<!-- h3.sh end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q '<!-- h3.sh begin -->' "$doc"; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- h3.sh begin -->.*?<!-- h3.sh end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
