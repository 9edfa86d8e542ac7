#!/usr/bin/env bash
# Where each front's CPU goes under full load, and what it costs its peers: same set-up as
# bench/run.sh; for each front, wrk -t1 -c32 for SECONDS (default 6) and, per request, the
# front's user and kernel CPU, CPU 0's busy time and, of it, wrk's and the upstream nginx's own
# CPU, and the context switches of the front (voluntary, involuntary), wrk and the upstream.
# Prints a table; writes nothing.
#   Usage: bench/split.sh [SECONDS] [ROUNDS]    FRONTS="proxyfleet nginx nginx12 haproxy" chooses
#   fronts; "proxyfleet+NAME=VALUE" runs the proxy with that environment variable set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-6}; rounds=${2:-1}
source "$root/bench/lib.sh"
hz=$(getconf CLK_TCK)
# user + system ticks of one CPU from /proc/stat; busy = everything but idle and iowait
cpu_busy() { awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
ticks() { local u=0 s=0 p; for p in "$@"; do read -r a b < <(awk '{print $14, $15}' /proc/$p/stat); u=$((u + a)); s=$((s + b)); done; echo "$u $s"; }
switches() { local v=0 n=0 p t; for p in "$@"; do for t in /proc/$p/task/*; do
  v=$((v + $(awk '/^voluntary_ctxt/ {print $2}' "$t/status"))); n=$((n + $(awk '/^nonvoluntary_ctxt/ {print $2}' "$t/status"))); done; done; echo "$v $n"; }
printf '%-24s %9s %8s %6s %6s %8s %8s %6s %6s %7s %7s %6s %6s\n' front req/s 'µs/req' user kernel 'cpu1 %' 'cpu0 µs' wrk upstr 'vcs/req' 'ics/req' 'wrk cs' 'up cs'
sleep 1
for round in $(seq 1 "$rounds"); do
  for front in ${FRONTS:-proxyfleet nginx haproxy}; do
    name=$front; envvar=
    case $front in *+*) envvar=${front#*+}; front=${front%%+*};; esac   # proxyfleet+VAR=VALUE: with that environment
    if [ -n "$envvar" ]; then pid=$(env "$envvar" bash -c "$(declare -f start_front); PROXY=$PROXY work=$work start_front $front"); else pid=$(start_front "$front"); fi
    port=$(port_of "$front")
    wait_ready "$port"
    sleep 0.5
    pids=$(pids_of "$pid")
    taskset -c 0 wrk -t1 -c32 -d"$((secs + 2))s" "https://127.0.0.1:$port/" > "$work/split-wrk.txt" &
    W=$!
    sleep 1   # past connection set-up
    upw=$(pgrep -P "$UP" | head -1)
    read -r wu0 ws0 < <(ticks $W); read -r uu0 us0 < <(ticks $upw); read -r wv0 _ < <(switches $W); read -r uv0 _ < <(switches $upw)
    read -r u0 s0 < <(ticks $pids); read -r v0 n0 < <(switches $pids); c00=$(cpu_busy 0); c10=$(cpu_busy 1)
    r0=$(wc -l < "$work/up-$front.log"); t0=$(date +%s.%N)
    sleep "$secs"
    read -r wu1 ws1 < <(ticks $W); read -r uu1 us1 < <(ticks $upw); read -r wv1 _ < <(switches $W); read -r uv1 _ < <(switches $upw)
    read -r u1 s1 < <(ticks $pids); read -r v1 n1 < <(switches $pids); c01=$(cpu_busy 0); c11=$(cpu_busy 1)
    r1=$(wc -l < "$work/up-$front.log"); t1=$(date +%s.%N)
    wait $W
    kill -9 $pids 2>/dev/null; wait "$pid" 2>/dev/null || true
    awk -v f="$name" -v n=$((r1 - r0)) -v t="$(echo "$t1 - $t0" | bc)" -v hz="$hz" \
        -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v c0=$((c01 - c00)) -v c1=$((c11 - c10)) -v w=$((wu1 + ws1 - wu0 - ws0)) -v up=$((uu1 + us1 - uu0 - us0)) -v wv=$((wv1 - wv0)) -v uv=$((uv1 - uv0)) -v v=$((v1 - v0)) -v nv=$((n1 - n0)) \
      'BEGIN { us = 1e6 / hz / n;
        printf "%-24s %9.0f %8.1f %6.1f %6.1f %8.0f %8.1f %6.1f %6.1f %7.2f %7.2f %6.2f %6.2f\n", f, n / t, (u + s) * us, u * us, s * us,
          100 * c1 / hz / t, c0 * us, w * us, up * us, v / n, nv / n, wv / n, uv / n }'
    sleep 1
  done
done
