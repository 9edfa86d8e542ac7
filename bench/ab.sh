#!/usr/bin/env bash
# A/B of proxy builds, front-bound (the same quota and set-up as bench/run.sh), with nginx as
# the reference in every round. Rounds interleave the variants, so a drift of the machine's
# speed hits all of them alike; prints each round and the medians. Writes nothing.
#   Usage: VARIANTS="old=/path/to/proxyfleet-proxy new=/path/to/other" bench/ab.sh [SECONDS] [ROUNDS]
#   CONNECTIONS (default 32, as bench/run.sh) sets wrk's connection count.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-8}; rounds=${2:-5}; connections=${CONNECTIONS:-32}
[ -n "${VARIANTS:-}" ] || { echo "set VARIANTS=\"name=binary ...\"" >&2; exit 2; }
PROXY_BIN=${PROXY_BIN:-${VARIANTS%% *}}; PROXY_BIN=${PROXY_BIN#*=}   # lib.sh builds nothing then
source "$root/bench/lib.sh"
setup_quota_cgroup
declare -A RPS CPU
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for round in $(seq 1 "$rounds"); do
  for variant in $VARIANTS nginx; do
    name=${variant%%=*}
    if [ "$name" = nginx ]; then front=nginx; else front=proxyfleet; PROXY=${variant#*=}; fi
    pid=$(start_front $front quota); port=$(port_of $front)
    for _ in $(seq 1 50); do curl -sk "https://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.1; done
    sleep 1
    pids=$(pids_of $pid); c0=$(cputicks $pids)
    taskset -c 0 wrk -t1 -c"$connections" -d"${secs}s" "https://127.0.0.1:$port/" > "$work/ab-wrk.txt"
    c1=$(cputicks $pids)
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/ab-wrk.txt")
    us=$(awk -v c=$((c1 - c0)) -v n="$(awk '/requests in/ {print $1}' "$work/ab-wrk.txt")" -v hz="$(getconf CLK_TCK)" \
      'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')
    RPS[$name]+=" $rps"; CPU[$name]+=" $us"
    log "round $round, $name: $rps req/s, $us µs CPU per request"
    kill -9 $pids 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
reference=$(echo "${RPS[nginx]}" | median)
for variant in $VARIANTS nginx; do
  name=${variant%%=*}; m=$(echo "${RPS[$name]}" | median)
  printf '%-12s median %8s req/s (%s × nginx), %s µs CPU per request; rounds:%s\n' "$name" "$m" \
    "$(awk -v a="$m" -v b="$reference" 'BEGIN { printf "%.2f", a / b }')" "$(echo "${CPU[$name]}" | median)" "${RPS[$name]}"
done
