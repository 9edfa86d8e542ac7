#!/usr/bin/env bash
# TLS passthrough side by side (issue 19): proxyfleet's TCP listener routing by SNI, HAProxy in
# `mode tcp` with req_ssl_sni, and nginx `stream` with ssl_preread (both from Debian), each
# pinned to CPU 1 with FRONT_CPU_PERCENT of it (default 25: a relay is cheap, the front must be
# the limit), the load generator and the TLS upstream (nginx) on CPU 0. Two rows: new
# connections per second (`wrk -H 'Connection: close'`: a ClientHello parsed and a connection
# relayed per request) and bytes per second (keep-alive downloads of a 1 MiB file). Rounds
# interleave the fronts; medians. Writes its section of docs/benchmarks.md.
# Usage: bench/passthrough.sh [SECONDS] [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}; rounds=${2:-3}
export FRONT_CPU_PERCENT=${FRONT_CPU_PERCENT:-25}
source "$root/bench/lib.sh"
[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnginx-mod-stream >/dev/null; }

# The upstream both rows reach: TLS, a small answer and a 1 MiB file.
mkdir -p "$work/static"; head -c 1048576 /dev/urandom > "$work/static/big.bin"
cat > "$work/pt-upstream.conf" <<CONF
worker_processes 1; daemon off; pid $work/pt-upstream.pid; error_log $work/pt-upstream-error.log warn;
events { worker_connections 4096; }
http {
  access_log off; ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:PT:10m;
  server { listen 127.0.0.1:19460 ssl; ssl_certificate $work/certs/tls.crt; ssl_certificate_key $work/certs/tls.key;
           root $work/static; location = / { return 200 "hello\n"; } }
}
CONF
taskset -c 0 nginx -c "$work/pt-upstream.conf" -p "$work" >"$work/pt-upstream.out" 2>&1 & PT_UP=$!
trap 'kill $UP $PT_UP 2>/dev/null || true; remove_quota_cgroup' EXIT

cat > "$work/certs/pt-proxyfleet.yaml" <<CONF
workerThreads: 1
listeners:
  - {name: pass, address: "127.0.0.1:18451", tcp: {routes: [{name: local, serverNames: [localhost], upstream: up}]}}
admin: {address: "127.0.0.1:19911"}
upstreams: [{name: up, endpoints: ["127.0.0.1:19460"]}]
CONF
cat > "$work/pt-nginx.conf" <<CONF
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1; daemon off; pid $work/pt-nginx.pid; error_log $work/pt-nginx-error.log warn;
events { worker_connections 4096; }
stream {
  map \$ssl_preread_server_name \$backend { localhost 127.0.0.1:19460; default 127.0.0.1:1; }
  server { listen 127.0.0.1:18452; ssl_preread on; proxy_pass \$backend; }
}
CONF
cat > "$work/pt-haproxy.cfg" <<CONF
global
  nbthread 1
defaults
  mode tcp
  timeout connect 3s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:18453
  tcp-request inspect-delay 5s
  tcp-request content accept if { req_ssl_hello_type 1 }
  use_backend be if { req_ssl_sni -i localhost }
backend be
  server up 127.0.0.1:19460
CONF

start_pt() { # start_pt FRONT: pinned to CPU 1 in the quota cgroup; prints the pid
  local cmd
  case $1 in
    proxyfleet) cmd=("$PROXY" --config "$work/certs/pt-proxyfleet.yaml" --log-format text) ;;
    nginx) cmd=(nginx -c "$work/pt-nginx.conf" -p "$work") ;;
    haproxy) cmd=(haproxy -db -f "$work/pt-haproxy.cfg") ;;
  esac
  bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec taskset -c 1 "$@"' _ "$QUOTA_CG" "${cmd[@]}" >"$work/pt-$1.out" 2>&1 & echo $!
}
pt_port() { case $1 in proxyfleet) echo 18451;; nginx) echo 18452;; haproxy) echo 18453;; esac; }
# wrk's "Transfer/sec: 412.10MB" as MB/s.
mb_per_s() { awk '/^Transfer\/sec/ { v = $2; u = substr(v, length(v) - 1); v += 0; if (u == "GB") v *= 1024; if (u == "KB") v /= 1024; print v }' "$1"; }

setup_quota_cgroup
fronts="nginx proxyfleet haproxy"
declare -A CONN BYTES CPU
for round in $(seq 1 "$rounds"); do
  for front in $fronts; do
    pid=$(start_pt $front); port=$(pt_port $front); wait_ready "$port"; sleep 1
    curl -sf --cacert "$work/certs/ca.crt" --resolve "localhost:$port:127.0.0.1" "https://localhost:$port/" >/dev/null \
      || log "$front: no answer through the passthrough"
    log "round $round, $front: new connections (wrk -t1 -c32 -H 'Connection: close' ${secs}s)"
    t0=$(cputicks $(pids_of $pid))
    taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Connection: close' "https://localhost:$port/" > "$work/pt-conn-$front.txt" 2>&1 || true
    CPU[$front]+=" $(us_per_request $(( $(cputicks $(pids_of $pid)) - t0 )) "$work/pt-conn-$front.txt")"
    CONN[$front]+=" $(awk '/Requests\/sec/ {print $2}' "$work/pt-conn-$front.txt")"
    log "round $round, $front: bytes (wrk -t1 -c8 keep-alive, 1 MiB responses, ${secs}s)"
    taskset -c 0 wrk -t1 -c8 -d"${secs}s" "https://localhost:$port/big.bin" > "$work/pt-bytes-$front.txt" 2>&1 || true
    BYTES[$front]+=" $(mb_per_s "$work/pt-bytes-$front.txt")"
    kill -9 $(pids_of $pid) 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
  done
done
for front in $fronts; do
  log "$front rounds: connections/s${CONN[$front]}; front CPU µs/connection${CPU[$front]}; MB/s${BYTES[$front]}"
  CONN[$front]=$(echo "${CONN[$front]}" | median); BYTES[$front]=$(echo "${BYTES[$front]}" | median)
  CPU[$front]=$(echo "${CPU[$front]}" | median)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
section=$(cat <<MD
<!-- passthrough.sh begin -->
## TLS passthrough by SNI (\`bench/passthrough.sh $secs $rounds\`, $(date -u +%Y-%m-%d))

Each front on CPU 1 with ${FRONT_CPU_PERCENT} % of it, routing by the ClientHello's SNI without
terminating TLS: proxyfleet's TCP listener, HAProxy 2.6 \`mode tcp\` with \`req_ssl_sni\`, nginx 1.22
\`stream\` with \`ssl_preread\`. wrk and the TLS upstream (nginx) on CPU 0, so the end-to-end
TLS handshakes are the upstream's and wrk's: they cap connections/s at about the same figure
for all three, so the front's own cost is its CPU time per relayed connection (ratios in that
row are inverted so that above 1 means proxyfleet is cheaper). Medians of $rounds interleaved
rounds.

| | nginx | proxyfleet | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy |
|---|---|---|---|---|---|
| new connections/s (\`wrk -t1 -c32 -H 'Connection: close'\`) | ${CONN[nginx]} | ${CONN[proxyfleet]} | ${CONN[haproxy]} | $(ratio "${CONN[proxyfleet]}" "${CONN[nginx]}") | $(ratio "${CONN[proxyfleet]}" "${CONN[haproxy]}") |
| front CPU µs per connection (same run; lower is better) | ${CPU[nginx]} | ${CPU[proxyfleet]} | ${CPU[haproxy]} | $(ratio "${CPU[nginx]}" "${CPU[proxyfleet]}") | $(ratio "${CPU[haproxy]}" "${CPU[proxyfleet]}") |
| MB/s relayed (\`wrk -t1 -c8\`, 1 MiB responses, keep-alive) | ${BYTES[nginx]} | ${BYTES[proxyfleet]} | ${BYTES[haproxy]} | $(ratio "${BYTES[proxyfleet]}" "${BYTES[nginx]}") | $(ratio "${BYTES[proxyfleet]}" "${BYTES[haproxy]}") |
<!-- passthrough.sh end -->
MD
)
doc=$root/docs/benchmarks.md
if grep -q '<!-- passthrough.sh begin -->' "$doc"; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- passthrough.sh begin -->.*?<!-- passthrough.sh end -->", lambda _: section, text, flags=re.S)
open(path, "w").write(text)
PY
else
  printf '\n%s\n' "$section" >> "$doc"
fi
echo "$section"
