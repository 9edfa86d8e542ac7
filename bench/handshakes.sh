#!/usr/bin/env bash
# TLS handshakes per second (issue 24): full and resumed handshakes, TLS 1.3 and TLS 1.2, for
# the three fronts side by side — proxyfleet, nginx 1.22 and HAProxy 2.6 (Debian's), the same
# ECDSA P-256 certificate (bench/lib.sh), each on CPU 1 with FRONT_CPU_PERCENT of it (default
# 25, so the front and not the client sets the pace). The client is `openssl s_time` on CPU 0:
# `-new` (a full handshake per connection) or `-reuse` (resuming the first connection's
# session), each connection fetching `/` through the front (HTTP/1.0, so the front closes it).
# Also the share of resumption attempts each front accepted (s_time prints `r` per resumed
# connection) and the front's CPU µs per connection. Rounds interleave the fronts; medians.
# Writes its section of docs/benchmarks.md.
# Usage: bench/handshakes.sh [SECONDS] [ROUNDS]   (BENCH_KEY=rsa: an RSA-2048 certificate, its own section)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
export FRONT_CPU_PERCENT=${FRONT_CPU_PERCENT:-25}
source "$root/bench/lib.sh"
setup_quota_cgroup
# s_time's request has no Host (HTTP/1.0). nginx's `$http_host` (and `$host`, with no
# server_name) is then empty, so nginx sends its HTTP/1.1 upstream request without one: the
# upstream answers 400 and closes, and every connection paid an upstream handshake too. Here
# nginx names the upstream's host itself; proxyfleet sends the endpoint's authority.
sed -i 's/proxy_set_header Host \$http_host;/proxy_set_header Host localhost;/' "$work/nginx.conf"
fronts="nginx proxyfleet haproxy"
modes="tls1_3-new tls1_3-reuse tls1_2-new tls1_2-reuse"
declare -A RATE CPU SHARE
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_front $front quota); port=$(port_of $front); wait_ready "$port"; sleep 1
    for mode in $modes; do
      ver=${mode%-*}; kind=${mode#*-}
      t0=$(cputicks $(pids_of $pid))
      out=$(taskset -c 0 openssl s_time -connect "127.0.0.1:$port" "-$ver" "-$kind" -time "$secs" -www / 2>&1 || true)
      ticks=$(( $(cputicks $(pids_of $pid)) - t0 ))
      n=$(echo "$out" | awk '/connections in .* real seconds/ { print $1; exit }')
      rate=$(awk -v n="${n:-0}" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')
      RATE[$front.$mode]+=" $rate"
      CPU[$front.$mode]+=" $(awk -v c="$ticks" -v n="${n:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')"
      if [ "$kind" = reuse ]; then
        # One character per connection: r resumed, anything else a full handshake.
        marks=$(echo "$out" | grep -v 'connections\|bytes\|Collecting\|^$' | tr -cd 'r*t123456789' || true)
        total=${#marks}; resumed=$(echo -n "$marks" | tr -cd 'r' | wc -c)
        SHARE[$front.$ver]+=" $(awk -v r="$resumed" -v t="$total" 'BEGIN { if (t > 0) printf "%.2f", r / t; else print "nan" }')"
      fi
      log "round $round, $front, $mode: $rate connections/s"
    done
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
# Upstream requests that arrived as the first on a new connection (the upstream's log): the
# fronts' upstream pools must keep their connections, or the figures measure upstream
# handshakes too.
declare -A NEWUP
for front in $fronts; do
  NEWUP[$front]=$(awk '$1 == 1 { n++ } END { printf "%.1f %%", 100 * n / (NR ? NR : 1) }' "$work/up-$front.log")
done
for k in "${!RATE[@]}"; do RATE[$k]=$(echo "${RATE[$k]}" | median); CPU[$k]=$(echo "${CPU[$k]}" | median); done
for k in "${!SHARE[@]}"; do SHARE[$k]=$(echo "${SHARE[$k]}" | median); done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
row() { # row LABEL MODE
  local m=$2
  echo "| $1 | ${RATE[nginx.$m]} | ${RATE[proxyfleet.$m]} | ${RATE[haproxy.$m]} | $(ratio "${RATE[proxyfleet.$m]}" "${RATE[nginx.$m]}") | $(ratio "${RATE[proxyfleet.$m]}" "${RATE[haproxy.$m]}") | ${CPU[nginx.$m]} / ${CPU[proxyfleet.$m]} / ${CPU[haproxy.$m]} |"
}
if [ "${BENCH_KEY:-ec}" = rsa ]; then mark=handshakes-rsa; key="RSA-2048"; how="BENCH_KEY=rsa bench/handshakes.sh"
else mark=handshakes.sh; key="ECDSA P-256"; how="bench/handshakes.sh"; fi
section=$(cat <<MD
<!-- $mark begin -->
## TLS handshakes per second, $key (\`$how $secs $rounds\`, $(date -u +%Y-%m-%d))

Each front on CPU 1 with ${FRONT_CPU_PERCENT} % of it (one worker), the same $key
certificate; \`openssl s_time\` on CPU 0 opens connections one after another, each fetching \`/\`
through the front (HTTP/1.0, proxied to the keep-alive TLS upstream) — \`-new\`: a full
handshake each, \`-reuse\`: resuming the first connection's session. Medians of $rounds
interleaved rounds. CPU is the front's µs per connection (nginx / proxyfleet / HAProxy).

| connections/s | nginx | proxyfleet | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy | front CPU µs per connection |
|---|---|---|---|---|---|---|
$(row "TLS 1.3 full" tls1_3-new)
$(row "TLS 1.3 resumed" tls1_3-reuse)
$(row "TLS 1.2 full" tls1_2-new)
$(row "TLS 1.2 resumed" tls1_2-reuse)

Upstream requests on a new upstream connection: nginx ${NEWUP[nginx]}, proxyfleet ${NEWUP[proxyfleet]}, HAProxy ${NEWUP[haproxy]}.
Share of resumption attempts accepted (TLS 1.3 / TLS 1.2): nginx ${SHARE[nginx.tls1_3]} / ${SHARE[nginx.tls1_2]}, proxyfleet ${SHARE[proxyfleet.tls1_3]} / ${SHARE[proxyfleet.tls1_2]}, HAProxy ${SHARE[haproxy.tls1_3]} / ${SHARE[haproxy.tls1_2]}.
<!-- $mark end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q "<!-- $mark begin -->" "$doc"; then
  python3 - "$doc" "$section" "$mark" <<'PY'
import re, sys
path, section, mark = sys.argv[1], sys.argv[2], re.escape(sys.argv[3])
text = open(path).read()
text = re.sub(rf"<!-- {mark} begin -->.*?<!-- {mark} end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
