#!/usr/bin/env bash
# The rows issue 18 adds beside nginx and HAProxy, all three fronts in one run with the same
# set-up as bench/run.sh (front pinned to CPU 1 with FRONT_CPU_PERCENT of it, load generator
# and upstream on CPU 0): a new TLS connection per request (wrk -H 'Connection: close': a full
# handshake each time, the cost behind a cloud load balancer or for mobile clients), and the
# HTTP/2 front (h2load -c50 at -m1, -m10 and -m100 streams per connection, nginx's per-connection
# request limits raised; each front's own concurrent-stream limit applies), with the front's
# RSS right after the -m100 run. Rounds
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
declare -A CLOSE H2 RSS
streams="1 10 100"
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front quota); port=$(port_of $front); wait_ready "$port"; sleep 1
    log "round $round, $front: a new connection per request (wrk -t1 -c32 -H 'Connection: close' ${secs}s)"
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Connection: close' "https://127.0.0.1:$port/" > "$work/close-$front.txt" 2>&1 || true
    CLOSE[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/close-$front.txt")"
    for m in $streams; do
      log "round $round, $front: HTTP/2 front (h2load -c50 -m$m ${secs}s)"
      # h2load can hang after its duration (seen against nginx at -m100): bounded, and a run
      # that did not finish leaves no figure for that round.
      timeout $((secs + 15)) taskset -c 0 h2load -c50 -m$m -t1 -D "$secs" "https://127.0.0.1:$port/" > "$work/h2-$front.txt" 2>&1 || true
      H2[$front.$m]+=" $(awk '/^finished in/ {for (i = 1; i <= NF; i++) if ($i == "req/s,") print $(i-1)}' "$work/h2-$front.txt")"
      grep -q '^status codes: .* 0 2xx' "$work/h2-$front.txt" && log "$front answered no 2xx over h2: $(grep '^status codes' "$work/h2-$front.txt")"
    done
    RSS[$front]+=" $(( $(rss_kb $(pids_of $pid)) / 1024 ))"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
for front in $fronts; do
  log "$front rounds: close req/s${CLOSE[$front]}; h2 -m1${H2[$front.1]}; -m10${H2[$front.10]}; -m100${H2[$front.100]}; RSS MiB${RSS[$front]}"
  CLOSE[$front]=$(echo "${CLOSE[$front]}" | median); RSS[$front]=$(echo "${RSS[$front]}" | median)
  for m in $streams; do H2[$front.$m]=$(echo "${H2[$front.$m]}" | median); done
done
h2row() { echo "| HTTP/2 front, req/s (\`h2load -c50 -m$1\`) | ${H2[nginx.$1]} | ${H2[proxyfleet.$1]} | ${H2[haproxy.$1]} | $(ratio "${H2[proxyfleet.$1]}" "${H2[nginx.$1]}") | $(ratio "${H2[proxyfleet.$1]}" "${H2[haproxy.$1]}") |"; }
section=$(cat <<MD
<!-- fronts.sh begin -->
## New connections and the HTTP/2 front (\`bench/fronts.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

Same set-up as the table above (each front on CPU 1 with ${FRONT_CPU_PERCENT} % of it; load
generator and upstream on CPU 0), the three fronts interleaved, medians of $rounds rounds.

| | nginx | proxyfleet | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy |
|---|---|---|---|---|---|
| new TLS connection per request, req/s (\`wrk -t1 -c32 -H 'Connection: close'\`) | ${CLOSE[nginx]} | ${CLOSE[proxyfleet]} | ${CLOSE[haproxy]} | $(ratio "${CLOSE[proxyfleet]}" "${CLOSE[nginx]}") | $(ratio "${CLOSE[proxyfleet]}" "${CLOSE[haproxy]}") |
$(h2row 1)
$(h2row 10)
$(h2row 100)
| front RSS after the -m100 run, MiB | ${RSS[nginx]} | ${RSS[proxyfleet]} | ${RSS[haproxy]} | | |
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
