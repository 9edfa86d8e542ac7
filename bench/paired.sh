#!/usr/bin/env bash
# Front-bound req/s of two fronts measured at the same time, so that a drift of the machine's
# speed (this VM's changes within seconds, ±15 % between bench/run.sh's rounds) hits both alike
# and cancels in their ratio. Same set-up as bench/run.sh; both fronts on CPU 1, each in its
# own cgroup with PAIRED_CPU_PERCENT (default 25) of it, so they never wait for each other;
# one wrk per front and the upstream on CPU 0, which stays below saturation (its busy share is
# printed). The two fronts swap cgroup, start order and wrk order every round (the slot alone
# was measured to matter by 2-7 %, in a direction that differed between experiments); the
# figure is the geometric mean of the rounds' ratios, which cancels that, with their range.
# Writes nothing.
#   Usage: bench/paired.sh [SECONDS] [ROUNDS]     PAIRS="proxyfleet:nginx proxyfleet:haproxy"
#   PROXY_B=/path/to/other/proxyfleet-proxy adds a front "proxyfleetB" (that build, the same
#   configuration on its own ports) and makes the default pair proxyfleetB:proxyfleet: an A/B
#   of two builds that no drift can bias.
#   H2_STREAMS=N loads each front over HTTP/2 with h2load -c50 -mN instead of wrk (every front's
#   h2 listener on, nginx's per-connection request limits raised, as in bench/fronts.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-5}
source "$root/bench/lib.sh"
percent=${PAIRED_CPU_PERCENT:-25}
if [ -n "${H2_STREAMS:-}" ]; then
  command -v h2load >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null; }
  sed -i -e 's/listen 127.0.0.1:18442 ssl;/listen 127.0.0.1:18442 ssl http2;/' \
         -e 's/access_log off;/access_log off; keepalive_requests 1000000; http2_max_requests 1000000;/' "$work/nginx.conf"
  sed -i 's/alpn http\/1.1/alpn h2,http\/1.1/' "$work/haproxy.cfg"
fi
# load PORT OUTPUT: one front's load for the round; prints nothing, leaves "Requests/sec: N" in OUTPUT.
load() {
  if [ -n "${H2_STREAMS:-}" ]; then
    timeout $((secs + 15)) taskset -c 0 h2load -c50 -m"$H2_STREAMS" -t1 -D "$secs" "https://127.0.0.1:$1/" 2>&1 |
      awk '/^finished in/ { for (i = 1; i <= NF; i++) if ($i == "req/s,") print "Requests/sec:", $(i-1) }' > "$2" || true
  else
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" "https://127.0.0.1:$1/" > "$2"
  fi
}
if [ -n "${PROXY_B:-}" ]; then : "${PAIRS:=proxyfleetB:proxyfleet}"; fi
cg_a=$(quota_cgroup proxyfleet-bench-a "$percent"); cg_b=$(quota_cgroup proxyfleet-bench-b "$percent")
cpu_busy() { awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
declare -A RATIO RPS_A RPS_B BUSY0
pairs=${PAIRS:-proxyfleet:nginx proxyfleet:haproxy}
for round in $(seq 1 "$rounds"); do
  for pair in $pairs; do
    a=${pair%%:*}; b=${pair#*:}
    if [ $((round % 2)) = 1 ]; then
      QUOTA_CG=$cg_a; pa=$(start_front "$a" quota); QUOTA_CG=$cg_b; pb=$(start_front "$b" quota); first=$a; second=$b
    else
      QUOTA_CG=$cg_a; pb=$(start_front "$b" quota); QUOTA_CG=$cg_b; pa=$(start_front "$a" quota); first=$b; second=$a
    fi
    wait_ready "$(port_of "$a")"; wait_ready "$(port_of "$b")"
    sleep 1
    read -r busy0 total0 < <(cpu_busy 0)
    load "$(port_of "$first")" "$work/paired-$first.txt" & w1=$!
    load "$(port_of "$second")" "$work/paired-$second.txt" & w2=$!
    wait $w1 $w2
    read -r busy1 total1 < <(cpu_busy 0)
    ra=$(awk '/Requests\/sec/ {print $2}' "$work/paired-$a.txt"); rb=$(awk '/Requests\/sec/ {print $2}' "$work/paired-$b.txt")
    ratio=$(awk -v a="$ra" -v b="$rb" 'BEGIN { printf "%.3f", a / b }')
    busy=$(awk -v b=$((busy1 - busy0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.0f", 100 * b / t }')
    RATIO[$pair]+=" $ratio"; RPS_A[$pair]+=" $ra"; RPS_B[$pair]+=" $rb"; BUSY0[$pair]+=" $busy"
    log "round $round, $a vs $b at the same time ($first started first): $ra vs $rb req/s, ratio $ratio, CPU 0 busy $busy %"
    kill -9 $(pids_of "$pa") $(pids_of "$pb") 2>/dev/null; wait "$pa" "$pb" 2>/dev/null || true; sleep 1
  done
done
for pair in $pairs; do
  a=${pair%%:*}; b=${pair#*:}
  printf '%s / %s: %s (geometric mean; range %s; rounds:%s); req/s medians %s vs %s; CPU 0 busy %%:%s\n' "$a" "$b" \
    "$(echo "${RATIO[$pair]}" | tr ' ' '\n' | awk 'NF { s += log($1); n++ } END { printf "%.3f", exp(s / n) }')" \
    "$(echo "${RATIO[$pair]}" | tr ' ' '\n' | grep -v '^$' | sort -g | sed -n '1p;$p' | paste -sd-)" \
    "${RATIO[$pair]}" "$(echo "${RPS_A[$pair]}" | median)" "$(echo "${RPS_B[$pair]}" | median)" "${BUSY0[$pair]}"
done
