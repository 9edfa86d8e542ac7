#!/usr/bin/env bash
# Tail latency as load grows: P50 and P99 at fixed rates of ¼, ½ and ¾ of nginx's max req/s
# (whole machine: each front on all of CPU 1, one worker; wrk/oha and the upstream on CPU 0),
# measured in the same run. oha -q --latency-correction, so a stalled request counts for every
# request that should have been sent meanwhile. The same rates straight to the upstream, with no
# front, give the set-up's own floor. Rounds interleave the fronts; figures are medians.
# Writes the section between the markers in docs/benchmarks.md.
# Usage: bench/tail.sh [SECONDS] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
source "$root/bench/lib.sh"
fronts="nginx proxyfleet haproxy"
fractions="25 50 75"
declare -A MAX P50 P99
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front); port=$(port_of $front); wait_ready "$port"; sleep 1
    log "round $round, $front: max req/s (wrk -t1 -c32 ${secs}s)"
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" "https://127.0.0.1:$port/" > "$work/wrk-$front.txt" 2>&1 || true
    MAX[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/wrk-$front.txt")"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
for front in $fronts; do log "$front max rounds:${MAX[$front]}"; MAX[$front]=$(echo "${MAX[$front]}" | median); done
percentiles() {   # oha json: "P50 P99" in milliseconds
  python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['latencyPercentiles']; print(' '.join('%.3f' % (p[k]*1000) for k in ('p50', 'p99')))" "$1" 2>/dev/null || echo nan nan
}
at_rate() {   # port, rate, key
  taskset -c 0 "$OHA" -z "${secs}s" -q "$2" -c 32 --latency-correction --no-tui --insecure --output-format json "https://127.0.0.1:$1/" > "$work/oha.json" 2>/dev/null || true
  read -r p50 p99 < <(percentiles "$work/oha.json")
  P50[$3]+=" $p50"; P99[$3]+=" $p99"
}
declare -A RATE
for f in $fractions; do RATE[$f]=$(awk -v r="${MAX[nginx]}" -v f="$f" 'BEGIN { printf "%d", r * f / 100 }'); done
for round in $(seq 1 "$rounds"); do
  for f in $fractions; do
    for front in $fronts; do
      pid=$(start_front $front); port=$(port_of $front); wait_ready "$port"; sleep 1
      taskset -c 0 wrk -t1 -c32 -d2s "https://127.0.0.1:$port/" >/dev/null 2>&1 || true   # warm pools
      log "round $round, $front: latency at ${RATE[$f]} req/s ($f % of nginx's max)"
      at_rate "$port" "${RATE[$f]}" "$front.$f"
      kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 0.5
    done
    log "round $round, no front: latency at ${RATE[$f]} req/s straight to the upstream"
    at_rate 19446 "${RATE[$f]}" "floor.$f"
  done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
for key in "${!P99[@]}"; do
  log "$key rounds: P50${P50[$key]}; P99${P99[$key]}"
  P50[$key]=$(echo "${P50[$key]}" | median); P99[$key]=$(echo "${P99[$key]}" | median)
done
rows() {
  local f
  for f in $fractions; do
    echo "| P99 ms at ${RATE[$f]} req/s ($f %) | ${P99[nginx.$f]} | ${P99[proxyfleet.$f]} | ${P99[haproxy.$f]} | ${P99[floor.$f]} | $(ratio "${P99[proxyfleet.$f]}" "${P99[nginx.$f]}") | $(ratio "${P99[proxyfleet.$f]}" "${P99[haproxy.$f]}") |"
  done
  for f in $fractions; do
    echo "| P50 ms at ${RATE[$f]} req/s ($f %) | ${P50[nginx.$f]} | ${P50[proxyfleet.$f]} | ${P50[haproxy.$f]} | ${P50[floor.$f]} | $(ratio "${P50[proxyfleet.$f]}" "${P50[nginx.$f]}") | $(ratio "${P50[proxyfleet.$f]}" "${P50[haproxy.$f]}") |"
  done
}
section=$(cat <<MD
<!-- tail.sh begin -->
## Tail latency at ¼, ½ and ¾ of nginx's max (\`bench/tail.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

Each front on all of CPU 1 (one worker); oha (\`-c32 -q RATE --latency-correction\`) and the
upstream on CPU 0. Max req/s (wrk \`-t1 -c32\`): nginx ${MAX[nginx]}, proxyfleet ${MAX[proxyfleet]},
HAProxy ${MAX[haproxy]}. "no front" is the same load straight to the upstream: the set-up's own
floor. Medians of $rounds interleaved rounds. Ratios below 1 are better.

| | nginx | proxyfleet | HAProxy | no front | proxyfleet / nginx | proxyfleet / HAProxy |
|---|---|---|---|---|---|---|
$(rows)
<!-- tail.sh end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q '<!-- tail.sh begin -->' "$doc"; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- tail.sh begin -->.*?<!-- tail.sh end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
