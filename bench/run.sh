#!/usr/bin/env bash
# Side-by-side benchmark: proxyfleet-proxy vs nginx vs HAProxy (Debian), configured the same
# way — TLS termination on the front (ECDSA P-256, TLS 1.3), kept-alive TLS to one upstream
# (nginx returning a small body, closing each connection after 100 requests). Everything on
# loopback; the proxy under test is pinned to CPU 1, the load generator and upstream to CPU 0.
# Writes docs/benchmarks.md.   Usage: bench/run.sh [SECONDS_PER_RUN] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
source "$root/bench/lib.sh"
declare -A RPS P99 RSS_IDLE RSS_LOAD FULL RESUMED CPU_US UP_TLS UP_REQ RSS_IDLE_MIB RSS_LOAD_MIB RESUMED_PCT
fronts="nginx proxyfleet haproxy nginx12 proxyfleet12"
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
sleep 1
# Rounds interleave the fronts, so a drift of the machine's speed hits all of them alike; each
# figure is the median of its rounds.
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front); port=$(port_of $front)
    for _ in $(seq 1 50); do curl -sk "https://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -fsS --cacert "$work/certs/ca.crt" --resolve "localhost:$port:127.0.0.1" "https://localhost:$port/" >/dev/null || { log "$front does not answer"; exit 1; }
    sleep 1
    [ "$round" = 1 ] && RSS_IDLE[$front]=$(rss_kb $(pids_of $pid))
    log "round $round, $front: max throughput (wrk -t1 -c32 ${secs}s, pinned to CPU 0)"
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" "https://127.0.0.1:$port/" > "$work/wrk-$front.txt" &
    W=$!; pids=$(pids_of $pid); c0=$(cputicks $pids)
    sleep $(( secs / 2 )); [ "$round" = 1 ] && RSS_LOAD[$front]=$(rss_kb $(pids_of $pid)); wait $W
    c1=$(cputicks $pids)
    RPS[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/wrk-$front.txt")"
    # Front CPU per request: independent of whether the load generator's CPU also saturates.
    CPU_US[$front]+=" $(awk -v c=$((c1 - c0)) -v n="$(awk '/requests in/ {print $1}' "$work/wrk-$front.txt")" -v hz="$(getconf CLK_TCK)" \
      'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
for front in $fronts; do
  log "$front rounds: req/s${RPS[$front]}; CPU µs/request${CPU_US[$front]}"
  RPS[$front]=$(echo "${RPS[$front]}" | median); CPU_US[$front]=$(echo "${CPU_US[$front]}" | median)
done
rate=$(awk -v r="${RPS[nginx]}" 'BEGIN { printf "%d", r / 2 }')
for front in $fronts; do : > "$work/up-$front.log"; done
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front); port=$(port_of $front); sleep 1
    log "round $round, $front: P99 at $rate req/s (half nginx's max; oha -q --latency-correction)"
    taskset -c 0 "$OHA" -z "${secs}s" -q "$rate" -c 32 --latency-correction --no-tui --insecure --output-format json "https://127.0.0.1:$port/" > "$work/oha-$front.json" 2>/dev/null || true
    P99[$front]+=" $(python3 -c "import json,sys; d=json.load(open('$work/oha-$front.json')); print('%.3f' % (d['latencyPercentiles']['p99']*1000))" 2>/dev/null || echo nan)"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 0.5
  done
done
for front in $fronts; do
  log "$front rounds: P99 ms${P99[$front]}"
  P99[$front]=$(echo "${P99[$front]}" | median)
  # Upstream handshakes during the fixed-rate runs: a connection's first request tells whether
  # its TLS session was resumed ("r") or full (".").
  FULL[$front]=$(awk '$1 == 1 && $2 != "r"' "$work/up-$front.log" | wc -l)
  RESUMED[$front]=$(awk '$1 == 1 && $2 == "r"' "$work/up-$front.log" | wc -l)
  UP_TLS[$front]=$(awk '{ print $3 }' "$work/up-$front.log" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
  UP_REQ[$front]=$(awk '{ print $4 }' "$work/up-$front.log" | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
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
  echo "and the upstream share CPU 0. Each figure is the median of $rounds rounds that interleave the fronts."
  echo
  echo "Reproduce: \`bench/run.sh $secs $rounds\` (writes this file)."
  echo
  echo "| metric | proxyfleet | nginx | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy | target | proxyfleet, TLS 1.2 upstream | nginx, TLS 1.2 upstream | ratio |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  row "max req/s (wrk -t1 -c32, ${secs}s)" RPS "≥ 1.2 × nginx, ≥ 1.0 × HAProxy"
  row "front CPU µs per request (same wrk run)" CPU_US ""
  row "P99 ms at $rate req/s (oha -q, latency-corrected)" P99 "≤ nginx"
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
