#!/usr/bin/env bash
# Does a front scale from one worker to two, or is the second lost to locking? Each front
# (nginx worker_processes, HAProxy nbthread, proxyfleet workerThreads) runs once with one
# worker and a quota of PER_WORKER_PERCENT of a CPU, pinned to CPU 1, and once with two workers
# and twice that quota, free to use both CPUs; wrk (-t1) and the upstream stay on CPU 0. The
# quota keeps the front the bottleneck (bench/lib.sh), so "scaling" = two-worker req/s over
# one-worker req/s, 2.00 being perfect. A third pass ("whole machine") runs two workers with no
# quota and wrk -t2 beside them on both CPUs, as a two-core node with no CPU limit would; there
# the load generator is a limit too, so it shows what a front leaves the rest of the machine.
# Rounds interleave the fronts; figures are medians.
# Writes the section between the markers in docs/benchmarks.md.
# Usage: bench/workers.sh [SECONDS] [ROUNDS]   (PER_WORKER_PERCENT, default 25)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
per=${PER_WORKER_PERCENT:-25}
source "$root/bench/lib.sh"
fronts="nginx proxyfleet haproxy"
declare -A RPS CPU
workers() {   # N: every front's configuration set to N workers
  sed -i "1s/^worker_processes [0-9]*;/worker_processes $1;/" "$work/nginx.conf"
  sed -i "s/^  nbthread [0-9]*/  nbthread $1/" "$work/haproxy.cfg"
  sed -i "s/^workerThreads: [0-9]*/workerThreads: $1/" "$work/certs/proxyfleet.yaml"
}
for n in 1 2 w; do
  if [ $n = 1 ]; then workers 1; FRONT_CPUS=1; else workers 2; FRONT_CPUS=0,1; fi
  # wrk's CPUs and threads, and whether the front runs under a quota
  if [ $n = w ]; then wrk_cpus=0,1; wrk_threads=2; quota=; else wrk_cpus=0; wrk_threads=1; quota=quota; fi
  remove_quota_cgroup
  [ $n = w ] || QUOTA_CG=$(quota_cgroup proxyfleet-bench-w$n $((per * n)))
  for round in $(seq 1 "$rounds"); do
    for front in $fronts; do
      pid=$(start_front $front $quota); port=$(port_of $front); wait_ready "$port"; sleep 1
      log "round $round, $front, pass $n, ${quota:-no} quota on CPUs $FRONT_CPUS: wrk -t$wrk_threads -c64 ${secs}s on CPUs $wrk_cpus"
      pids=$(pids_of $pid); c0=$(cputicks $pids)
      taskset -c $wrk_cpus wrk -t$wrk_threads -c64 -d"${secs}s" "https://127.0.0.1:$port/" > "$work/wrk-$front.txt" 2>&1 || true
      c1=$(cputicks $pids)
      RPS[$front.$n]+=" $(awk '/Requests\/sec/ {print $2}' "$work/wrk-$front.txt")"
      CPU[$front.$n]+=" $(us_per_request $((c1 - c0)) "$work/wrk-$front.txt")"
      kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
    done
  done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
for front in $fronts; do
  for n in 1 2 w; do
    log "$front, pass $n: req/s${RPS[$front.$n]}; CPU µs/request${CPU[$front.$n]}"
    RPS[$front.$n]=$(echo "${RPS[$front.$n]}" | median); CPU[$front.$n]=$(echo "${CPU[$front.$n]}" | median)
  done
done
row() {   # label, key suffix, array name
  local -n a=$3
  echo "| $1 | ${a[nginx.$2]} | ${a[proxyfleet.$2]} | ${a[haproxy.$2]} | $(ratio "${a[proxyfleet.$2]}" "${a[nginx.$2]}") | $(ratio "${a[proxyfleet.$2]}" "${a[haproxy.$2]}") |"
}
scaling() { ratio "${RPS[$1.2]}" "${RPS[$1.1]}"; }
section=$(cat <<MD
<!-- workers.sh begin -->
## One worker and two (\`bench/workers.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

One worker: ${per} % of CPU 1. Two workers (nginx \`worker_processes 2\`, HAProxy \`nbthread 2\`,
proxyfleet \`workerThreads: 2\`): $((2 * per)) % quota over both CPUs. wrk \`-t1 -c64\` and the upstream
on CPU 0. Whole machine: two workers, no quota, wrk \`-t2 -c64\` on both CPUs beside them.
Medians of $rounds interleaved rounds; CPU is the front's µs per request.

| | nginx | proxyfleet | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy |
|---|---|---|---|---|---|
$(row "req/s, 1 worker" 1 RPS)
$(row "req/s, 2 workers" 2 RPS)
| scaling (2 workers / 1) | $(scaling nginx) | $(scaling proxyfleet) | $(scaling haproxy) | | |
$(row "CPU µs per request, 1 worker" 1 CPU)
$(row "CPU µs per request, 2 workers" 2 CPU)
$(row "req/s, 2 workers, whole machine" w RPS)
$(row "CPU µs per request, 2 workers, whole machine" w CPU)
<!-- workers.sh end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q '<!-- workers.sh begin -->' "$doc"; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- workers.sh begin -->.*?<!-- workers.sh end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
