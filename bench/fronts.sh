#!/usr/bin/env bash
# The rows issue 18 adds beside nginx and HAProxy, all three fronts in one run with the same
# set-up as bench/run.sh (front pinned to CPU 1 with FRONT_CPU_PERCENT of it, load generator
# and upstream on CPU 0): a new TLS connection per request (wrk -H 'Connection: close': a full
# handshake each time, the cost behind a cloud load balancer or for mobile clients), and the
# HTTP/2 front (h2load -c50 -m10, nginx's per-connection request limits raised). Rounds
# interleave the fronts; figures are medians. Writes the section between the markers in
# docs/benchmarks.md.   Usage: bench/fronts.sh [SECONDS] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
source "$root/bench/lib.sh"
command -v h2load >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null; }
# HTTP/2 on every front's listener, and no front closing h2 connections early.
sed -i -e 's/listen 127.0.0.1:18442 ssl;/listen 127.0.0.1:18442 ssl http2;/' \
       -e 's/access_log off;/access_log off; keepalive_requests 1000000; http2_max_requests 1000000;/' "$work/nginx.conf"
sed -i 's/alpn http\/1.1/alpn h2,http\/1.1/' "$work/haproxy.cfg"
setup_quota_cgroup
fronts="nginx proxyfleet haproxy"
declare -A CLOSE H2
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front quota); port=$(port_of $front); wait_ready "$port"; sleep 1
    log "round $round, $front: a new connection per request (wrk -t1 -c32 -H 'Connection: close' ${secs}s)"
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Connection: close' "https://127.0.0.1:$port/" > "$work/close-$front.txt" 2>&1 || true
    CLOSE[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/close-$front.txt")"
    log "round $round, $front: HTTP/2 front (h2load -c50 -m10 ${secs}s)"
    taskset -c 0 h2load -c50 -m10 -t1 -D "$secs" "https://127.0.0.1:$port/" > "$work/h2-$front.txt" 2>&1 || true
    H2[$front]+=" $(awk '/^finished in/ {for (i = 1; i <= NF; i++) if ($i == "req/s,") print $(i-1)}' "$work/h2-$front.txt")"
    grep -q '^status codes: .* 0 2xx' "$work/h2-$front.txt" && log "$front answered no 2xx over h2: $(grep '^status codes' "$work/h2-$front.txt")"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
for front in $fronts; do
  log "$front rounds: close req/s${CLOSE[$front]}; h2 req/s${H2[$front]}"
  CLOSE[$front]=$(echo "${CLOSE[$front]}" | median); H2[$front]=$(echo "${H2[$front]}" | median)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
section=$(cat <<MD
<!-- fronts.sh begin -->
## New connections and the HTTP/2 front (\`bench/fronts.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

Same set-up as the table above (each front on CPU 1 with ${FRONT_CPU_PERCENT} % of it; load
generator and upstream on CPU 0), the three fronts interleaved, medians of $rounds rounds.

| | nginx | proxyfleet | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy |
|---|---|---|---|---|---|
| new TLS connection per request, req/s (\`wrk -t1 -c32 -H 'Connection: close'\`) | ${CLOSE[nginx]} | ${CLOSE[proxyfleet]} | ${CLOSE[haproxy]} | $(ratio "${CLOSE[proxyfleet]}" "${CLOSE[nginx]}") | $(ratio "${CLOSE[proxyfleet]}" "${CLOSE[haproxy]}") |
| HTTP/2 front, req/s (\`h2load -c50 -m10\`) | ${H2[nginx]} | ${H2[proxyfleet]} | ${H2[haproxy]} | $(ratio "${H2[proxyfleet]}" "${H2[nginx]}") | $(ratio "${H2[proxyfleet]}" "${H2[haproxy]}") |
<!-- fronts.sh end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q '<!-- fronts.sh begin -->' "$doc"; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- fronts.sh begin -->.*?<!-- fronts.sh end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
