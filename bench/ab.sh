#!/usr/bin/env bash
# A/B of proxy builds on bench/run.sh's set-up, with nginx as the reference in every round.
# Rounds interleave the variants, so a drift of the machine's speed hits all of them alike;
# prints each round and the medians. Writes nothing.
#   Usage: VARIANTS="old=/path/to/proxyfleet-proxy new=/path/to/other" bench/ab.sh [SECONDS] [ROUNDS]
#   Default: max req/s front-bound (the front under bench/run.sh's CPU quota), wrk -t1 -c32.
#   RATE=N: latency instead, at N req/s with no quota (oha -q --latency-correction, after a 2 s
#   wrk warm-up), as bench/run.sh's latency rows. CONNECTIONS (default 32) sets the connections.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-8}; rounds=${2:-5}; connections=${CONNECTIONS:-32}; rate=${RATE:-}
[ -n "${VARIANTS:-}" ] || { echo "set VARIANTS=\"name=binary ...\"" >&2; exit 2; }
PROXY_BIN=${PROXY_BIN:-${VARIANTS%% *}}; PROXY_BIN=${PROXY_BIN#*=}   # lib.sh builds nothing then
source "$root/bench/lib.sh"
if [ -z "$rate" ]; then setup_quota_cgroup; quota=quota; else quota=; fi
declare -A A B
for round in $(seq 1 "$rounds"); do
  for variant in $VARIANTS nginx; do
    name=${variant%%=*}
    if [ "$name" = nginx ]; then front=nginx; else front=proxyfleet; PROXY=${variant#*=}; fi
    pid=$(start_front $front $quota); port=$(port_of $front)
    wait_ready "$port"
    sleep 1
    if [ -z "$rate" ]; then
      pids=$(pids_of $pid); c0=$(cputicks $pids)
      taskset -c 0 wrk -t1 -c"$connections" -d"${secs}s" "https://127.0.0.1:$port/" > "$work/ab-wrk.txt"
      c1=$(cputicks $pids)
      a=$(awk '/Requests\/sec/ {print $2}' "$work/ab-wrk.txt")
      b=$(us_per_request $((c1 - c0)) "$work/ab-wrk.txt")
      log "round $round, $name: $a req/s, $b µs CPU per request"
    else
      taskset -c 0 wrk -t1 -c"$connections" -d2s "https://127.0.0.1:$port/" >/dev/null 2>&1 || true
      taskset -c 0 "$OHA" -z "${secs}s" -q "$rate" -c "$connections" --latency-correction --no-tui --insecure \
        --output-format json "https://127.0.0.1:$port/" > "$work/ab-oha.json" 2>/dev/null || true
      read -r a b < <(python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['latencyPercentiles']; print('%.3f %.3f' % (p['p90']*1000, p['p99']*1000))" "$work/ab-oha.json" 2>/dev/null || echo nan nan)
      log "round $round, $name: P90 $a ms, P99 $b ms at $rate req/s"
    fi
    A[$name]+=" $a"; B[$name]+=" $b"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
reference=$(echo "${A[nginx]}" | median)
for variant in $VARIANTS nginx; do
  name=${variant%%=*}; m=$(echo "${A[$name]}" | median); ratio=$(awk -v a="$m" -v b="$reference" 'BEGIN { printf "%.2f", a / b }')
  if [ -z "$rate" ]; then
    printf '%-12s median %8s req/s (%s × nginx), %s µs CPU per request; rounds:%s\n' "$name" "$m" "$ratio" "$(echo "${B[$name]}" | median)" "${A[$name]}"
  else
    printf '%-12s median P90 %s ms (%s × nginx), P99 %s ms; P90 rounds:%s; P99 rounds:%s\n' "$name" "$m" "$ratio" "$(echo "${B[$name]}" | median)" "${A[$name]}" "${B[$name]}"
  fi
done
