#!/usr/bin/env bash
# Side-by-side benchmark: proxyfleet-proxy vs nginx vs HAProxy (Debian), configured the same
# way — TLS termination on the front (ECDSA P-256, TLS 1.3), kept-alive TLS to one upstream
# (nginx returning a small body, closing each connection after 100 requests). Everything on
# loopback; the proxy under test is pinned to CPU 1, the load generator and upstream to CPU 0.
# Writes docs/benchmarks.md.   Usage: bench/run.sh [SECONDS_PER_RUN] [ROUNDS] [LATENCY_ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}; p99_rounds=${3:-5}
source "$root/bench/lib.sh"
declare -A RPS RPS_FREE P50 P90 P99 P999 RSS_IDLE RSS_LOAD FULL RESUMED CPU_US CPU_US_FREE UP_TLS UP_REQ RSS_IDLE_MIB RSS_LOAD_MIB RESUMED_PCT
fronts="nginx proxyfleet haproxy nginx12 proxyfleet12"
setup_quota_cgroup
sleep 1
# max_throughput MODE RPS_ARRAY CPU_ARRAY: wrk -t1 -c32 against every front, MODE "quota" (the
# front gets FRONT_CPU_PERCENT of CPU 1: front-bound) or "free" (all of CPU 1: on two cores CPU 0,
# shared by wrk and the upstream, then saturates first). Rounds interleave the fronts, so a drift
# of the machine's speed hits all of them alike; each figure is the median of its rounds.
max_throughput() {
  local mode=$1 round front pid port W pids c0 c1
  local -n rps=$2 cpu=$3
  for round in $(seq 1 "$rounds"); do
    for front in $fronts; do
      pid=$(start_front $front $mode); port=$(port_of $front)
      wait_ready "$port"
      curl -fsS --cacert "$work/certs/ca.crt" --resolve "localhost:$port:127.0.0.1" "https://localhost:$port/" >/dev/null || { log "$front does not answer"; exit 1; }
      sleep 1
      [ "$round" = 1 ] && [ "$mode" = quota ] && RSS_IDLE[$front]=$(rss_kb $(pids_of $pid))
      log "round $round, $front ($mode): max throughput (wrk -t1 -c32 ${secs}s, pinned to CPU 0)"
      taskset -c 0 wrk -t1 -c32 -d"${secs}s" "https://127.0.0.1:$port/" > "$work/wrk-$front.txt" &
      W=$!; pids=$(pids_of $pid); c0=$(cputicks $pids)
      sleep $(( secs / 2 )); [ "$round" = 1 ] && [ "$mode" = quota ] && RSS_LOAD[$front]=$(rss_kb $(pids_of $pid)); wait $W
      c1=$(cputicks $pids)
      rps[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/wrk-$front.txt")"
      cpu[$front]+=" $(us_per_request $((c1 - c0)) "$work/wrk-$front.txt")"
      kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
    done
  done
  for front in $fronts; do
    log "$front ($mode) rounds: req/s${rps[$front]}; CPU µs/request${cpu[$front]}"
    rps[$front]=$(echo "${rps[$front]}" | median); cpu[$front]=$(echo "${cpu[$front]}" | median)
  done
}
max_throughput quota RPS CPU_US
max_throughput free RPS_FREE CPU_US_FREE
# Latency at a fixed rate: half of nginx's front-bound max, every front with all of CPU 1. The
# same load straight to the upstream ("no front") gives the set-up's own floor: on two cores the
# load generator shares CPU 0 with the upstream, and that alone puts tens of milliseconds into
# the tail on this machine (docs/performance.md).
rate=$(awk -v r="${RPS[nginx]}" 'BEGIN { printf "%d", r / 2 }')
oha_at_rate() {   # port, output file
  taskset -c 0 "$OHA" -z "${secs}s" -q "$rate" -c 32 --latency-correction --no-tui --insecure --output-format json "https://127.0.0.1:$1/" > "$2" 2>/dev/null || true
}
percentiles() {   # oha json: "P50 P90 P99 P99.9" in milliseconds
  python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['latencyPercentiles']; print(' '.join('%.3f' % (p[k]*1000) for k in ('p50', 'p90', 'p99', 'p99.9')))" "$1" 2>/dev/null || echo nan nan nan nan
}
FLOOR_P99=
for round in $(seq 1 "$p99_rounds"); do
  for front in $fronts; do
    pid=$(start_front $front); port=$(port_of $front); sleep 1
    # Warm-up: the front opens its upstream connections (full handshakes: a fresh process has no
    # session to resume); only what follows counts, so the resumption row counts reconnects.
    taskset -c 0 wrk -t1 -c32 -d2s "https://127.0.0.1:$port/" >/dev/null 2>&1 || true
    : > "$work/up-$front.log"
    log "round $round, $front: latency at $rate req/s (half nginx's front-bound max; oha -q --latency-correction)"
    oha_at_rate "$port" "$work/oha-$front.json"
    read -r p50 p90 p99 p999 < <(percentiles "$work/oha-$front.json")
    P50[$front]+=" $p50"; P90[$front]+=" $p90"; P99[$front]+=" $p99"; P999[$front]+=" $p999"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 0.5
    cat "$work/up-$front.log" >> "$work/up-$front.measured.log"
  done
  log "round $round, no front: latency at $rate req/s straight to the upstream"
  oha_at_rate 19446 "$work/oha-floor.json"
  read -r _ _ p99 _ < <(percentiles "$work/oha-floor.json")
  FLOOR_P99+=" $p99"
done
log "no front rounds: P99 ms$FLOOR_P99"
FLOOR_P99=$(echo "$FLOOR_P99" | median)
for front in $fronts; do
  log "$front rounds: P99 ms${P99[$front]}"
  P50[$front]=$(echo "${P50[$front]}" | median); P90[$front]=$(echo "${P90[$front]}" | median)
  P99[$front]=$(echo "${P99[$front]}" | median); P999[$front]=$(echo "${P999[$front]}" | median)
  # Upstream handshakes during the fixed-rate runs (after each warm-up): a connection's first
  # request tells whether its TLS session was resumed ("r") or full (".").
  FULL[$front]=$(awk '$1 == 1 && $2 != "r"' "$work/up-$front.measured.log" | wc -l)
  RESUMED[$front]=$(awk '$1 == 1 && $2 == "r"' "$work/up-$front.measured.log" | wc -l)
  UP_TLS[$front]=$(awk '{ print $3 }' "$work/up-$front.measured.log" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
  UP_REQ[$front]=$(awk '{ print $4 }' "$work/up-$front.measured.log" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
done
kill $UP 2>/dev/null || true

ratio() {   # a / b, or nothing when either is not a plain number
  [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]] || return 0
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}
pct() { awk -v r="$1" -v f="$2" 'BEGIN { t = r + f; if (t > 0) printf "%.1f%%", 100 * r / t; else print "n/a" }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
row() {   # metric, the array's name, target; prints one table row with both ratios and the TLS 1.2 reference
  local -n a=$2
  echo "| $1 | ${a[proxyfleet]} | ${a[nginx]} | ${a[haproxy]} | $(ratio "${a[proxyfleet]}" "${a[nginx]}") | $(ratio "${a[proxyfleet]}" "${a[haproxy]}") | $3 | ${a[proxyfleet12]} | ${a[nginx12]} | $(ratio "${a[proxyfleet12]}" "${a[nginx12]}") |"
}
for f in $fronts; do
  RSS_IDLE_MIB[$f]=$(mib "${RSS_IDLE[$f]}"); RSS_LOAD_MIB[$f]=$(mib "${RSS_LOAD[$f]}")
  RESUMED_PCT[$f]="$(pct "${RESUMED[$f]}" "${FULL[$f]}") (${FULL[$f]}/${RESUMED[$f]})"
done
{
  echo "# Benchmarks"
  echo
  echo "proxyfleet-proxy against nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') and HAProxy $(haproxy -v | head -1 | awk '{print $3}') (Debian), in one run on $(date -u +%Y-%m-%d),"
  echo "$(nproc) cores ($cpu). Each front terminates TLS (ECDSA P-256, TLS 1.3) and proxies over kept-alive,"
  echo "verified TLS to one upstream nginx that closes every connection after 100 requests, passing Host"
  echo "and adding X-Forwarded-For/-Proto. Fronts run one worker thread/process pinned to CPU 1; wrk/oha"
  echo "and the upstream share CPU 0. Throughput figures are medians of $rounds rounds, latency figures of"
  echo "$p99_rounds rounds; rounds interleave the fronts."
  echo
  echo "- **Front-bound max req/s** is the headline: every front gets the same CPU quota (${FRONT_CPU_PERCENT} % of CPU 1,"
  echo "  cgroup \`cpu\` controller, 10 ms periods), so the front is the bottleneck and CPU 0 keeps headroom. That"
  echo "  is what \"how fast does it proxy\" means on a host where the proxy has its own cores."
  echo "- **Whole-machine max req/s** lets the front use all of CPU 1; then CPU 0 (wrk + upstream) saturates"
  echo "  first, so it also measures what each front costs its peers."
  echo "- **Latency** is at a fixed rate of half nginx's front-bound max, fronts without quota. Straight"
  echo "  from the load generator to the upstream, with no front at all, the same load has a P99 of"
  echo "  **$FLOOR_P99 ms** here: the set-up's own floor (oha shares CPU 0 with the upstream), so P99 differences"
  echo "  smaller than that floor's spread are noise; P50/P90 show the fronts' own cost."
  echo
  echo "Reproduce: \`bench/run.sh $secs $rounds $p99_rounds\` (writes this file)."
  echo
  echo "This VM's speed changes within seconds, so one front's round can differ by ±15 % from the next"
  echo "front's. \`bench/paired.sh\` runs two fronts at the same time (each with its own 25 % quota of"
  echo "CPU 1, slots swapped every round), so that the drift cancels in their ratio; its figures and the"
  echo "per-round spread of this table are in [performance.md](performance.md)."
  echo
  echo "| metric | proxyfleet | nginx | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy | target | proxyfleet, TLS 1.2 upstream | nginx, TLS 1.2 upstream | ratio |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  row "max req/s, front-bound (front: ${FRONT_CPU_PERCENT} % of CPU 1; wrk -t1 -c32, ${secs}s)" RPS "≥ 1.2 × nginx, ≥ 1.0 × HAProxy"
  row "front CPU µs per request (same wrk run)" CPU_US ""
  row "max req/s, whole machine (front: all of CPU 1; CPU 0 saturates)" RPS_FREE ""
  row "front CPU µs per request (same wrk run)" CPU_US_FREE ""
  row "P50 ms at $rate req/s (oha -q, latency-corrected)" P50 ""
  row "P90 ms at $rate req/s" P90 ""
  row "P99 ms at $rate req/s" P99 "≤ nginx"
  row "P99.9 ms at $rate req/s" P999 ""
  row "RSS idle, MiB" RSS_IDLE_MIB "≤ 16 MiB"
  row "RSS under load, MiB" RSS_LOAD_MIB ""
  row "upstream reconnects resumed (full/resumed)" RESUMED_PCT "≥ 95 %"
  row "upstream TLS version (upstream's log)" UP_TLS ""
  row "request bytes the upstream received" UP_REQ ""
  echo
  echo "nginx's RSS is master + worker. Ratios above 1 are better for req/s, worse for CPU per request, P99 and RSS."
  echo "This machine's speed drifts between runs (the same binary measured 41k and 53k req/s an hour"
  echo "apart): compare the ratios of one run, not absolute figures across runs."
  echo
  echo "**Configured the same way.** nginx 1.22's defaults differ from the other two fronts' in two"
  echo "ways that matter here: \`proxy_ssl_protocols\` stops at TLS 1.2 (nginx ≥ 1.23.4 adds TLS 1.3) and"
  echo "\`proxy_ssl_verify\` is off. The nginx column allows TLS 1.3 and verifies, as proxyfleet and HAProxy"
  echo "do. The last three columns are both with TLS 1.2 to the upstream (nginx 1.22's default;"
  echo "proxyfleet's \`tls.maxVersion: \"1.2\"\`): resuming a TLS 1.2 session needs no key exchange, so it"
  echo "costs the upstream less, which shows on this bench where the upstream shares a CPU with the load"
  echo "generator. The CPU split per process and what was tried: [performance.md](performance.md)."
} > "$root/docs/benchmarks.md"
cat "$root/docs/benchmarks.md"
