#!/usr/bin/env bash
# Side-by-side benchmark: proxyfleet-proxy vs nginx vs HAProxy (Debian), configured the same
# way — TLS termination on the front (ECDSA P-256, TLS 1.3), kept-alive TLS to one upstream
# (nginx returning a small body, closing each connection after 100 requests). Everything on
# loopback; the proxy under test is pinned to CPU 1, the load generator and upstream to CPU 0.
# Writes docs/benchmarks.md.   Usage: bench/run.sh [SECONDS_PER_RUN]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-10}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/proxyfleet/target}
work=/tmp/proxyfleet-bench
rm -rf "$work"; mkdir -p "$work/certs"   # certs apart: the proxy watches their directory, logs churn
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v nginx >/dev/null && command -v haproxy >/dev/null && command -v wrk >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy wrk >/dev/null; }
if ! command -v oha >/dev/null && [ ! -x "$HOME/.cargo/bin/oha" ]; then
  log "installing oha (cargo install, once)"
  cargo install oha --locked -q
fi
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
log "building proxyfleet-proxy (release)"
( cd "$root" && cargo build --release -q -p proxyfleet-proxy --bin proxyfleet-proxy )
PROXY=$CARGO_TARGET_DIR/release/proxyfleet-proxy

# Certificates: one CA, a server certificate for localhost used by all fronts and the upstream.
openssl ecparam -name prime256v1 -genkey -noout -out "$work/certs/ca.key" 2>/dev/null
openssl req -x509 -new -key "$work/certs/ca.key" -days 2 -subj /CN=bench-ca -out "$work/certs/ca.crt" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out "$work/certs/tls.key.ec" 2>/dev/null
openssl pkcs8 -topk8 -nocrypt -in "$work/certs/tls.key.ec" -out "$work/certs/tls.key"
openssl req -new -key "$work/certs/tls.key" -subj /CN=localhost -out "$work/certs/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$work/certs/ext"
openssl x509 -req -in "$work/certs/tls.csr" -CA "$work/certs/ca.crt" -CAkey "$work/certs/ca.key" -CAcreateserial -days 2 -extfile "$work/certs/ext" -out "$work/certs/tls.crt" 2>/dev/null
cat "$work/certs/tls.crt" "$work/certs/tls.key" > "$work/certs/haproxy.pem"

# The upstream: one nginx, a port per front so each front's upstream handshakes are logged apart.
cat > "$work/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $work/upstream.pid; error_log $work/upstream-error.log warn;
events { worker_connections 4096; }
http {
  log_format hs '\$connection_requests \$ssl_session_reused';
  ssl_certificate $work/certs/tls.crt; ssl_certificate_key $work/certs/tls.key; ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_cache shared:UP:10m; ssl_session_tickets on;
  keepalive_requests 100; keepalive_timeout 60s;
  server { listen 127.0.0.1:19441 ssl; access_log $work/up-proxyfleet.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19442 ssl; access_log $work/up-nginx.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19443 ssl; access_log $work/up-haproxy.log hs; location / { return 200 "hello from upstream\n"; } }
}
CONF
taskset -c 0 nginx -c "$work/upstream.conf" -p "$work" >"$work/upstream.out" 2>&1 & UP=$!

cat > "$work/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/nginx.pid; error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream up { server 127.0.0.1:19442; keepalive 64; }
  server {
    listen 127.0.0.1:18442 ssl; http2 on;
    ssl_certificate $work/certs/tls.crt; ssl_certificate_key $work/certs/tls.key; ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:FRONT:10m;
    location / {
      proxy_pass https://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_ssl_session_reuse on; proxy_ssl_server_name on; proxy_ssl_name localhost;
    }
  }
}
CONF
sed -i 's/ http2 on;//' "$work/nginx.conf"   # nginx 1.22 takes http2 on the listen line; h1 clients here anyway

cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  tune.ssl.default-dh-param 2048
defaults
  mode http
  timeout connect 3s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:18443 ssl crt $work/certs/haproxy.pem alpn http/1.1
  default_backend be
backend be
  http-reuse always
  server up 127.0.0.1:19443 ssl verify required ca-file $work/certs/ca.crt sni str(localhost)
CONF

cat > "$work/certs/proxyfleet.yaml" <<CONF
workerThreads: 1
listeners:
  - name: https
    address: 127.0.0.1:18441
    tls: {certificates: [{certFile: $work/certs/tls.crt, keyFile: $work/certs/tls.key, default: true}]}
admin: {address: "127.0.0.1:19901"}
routes: [{name: all, upstream: up}]
upstreams:
  - name: up
    endpoints: ["127.0.0.1:19441"]
    protocol: http1
    tls: {serverName: localhost, caFile: $work/certs/ca.crt}
    pool: {maxIdlePerEndpoint: 64}
CONF

rss_kb() { local total=0 p; for p in "$@"; do total=$(( total + $(awk '/VmRSS/ {print $2}' /proc/$p/status 2>/dev/null || echo 0) )); done; echo $total; }

start_front() {
  case $1 in
    proxyfleet) taskset -c 1 "$PROXY" --config "$work/certs/proxyfleet.yaml" --log-format text >"$work/proxyfleet.log" 2>&1 & echo $! ;;
    nginx) taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" >"$work/nginx.out" 2>&1 & echo $! ;;
    haproxy) taskset -c 1 haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 & echo $! ;;
  esac
}
port_of() { case $1 in proxyfleet) echo 18441;; nginx) echo 18442;; haproxy) echo 18443;; esac; }
pids_of() { echo "$1 $(pgrep -P "$1" | tr '\n' ' ')"; }

# CPU time (user + kernel, clock ticks) of a front's processes, from /proc.
cputicks() { local t=0 p; for p in "$@"; do t=$(( t + $(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0) )); done; echo $t; }
declare -A RPS P99 RSS_IDLE RSS_LOAD FULL RESUMED CPU_US
sleep 1
for front in nginx proxyfleet haproxy; do
  pid=$(start_front $front); port=$(port_of $front)
  for _ in $(seq 1 50); do curl -sk "https://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS --cacert "$work/certs/ca.crt" --resolve "localhost:$port:127.0.0.1" "https://localhost:$port/" >/dev/null || { log "$front does not answer"; exit 1; }
  sleep 1
  RSS_IDLE[$front]=$(rss_kb $(pids_of $pid))
  log "$front: max throughput (wrk -t1 -c32 ${secs}s, pinned to CPU 0)"
  taskset -c 0 wrk -t1 -c32 -d"${secs}s" "https://127.0.0.1:$port/" > "$work/wrk-$front.txt" &
  W=$!; pids=$(pids_of $pid); c0=$(cputicks $pids)
  sleep $(( secs / 2 )); RSS_LOAD[$front]=$(rss_kb $(pids_of $pid)); wait $W
  c1=$(cputicks $pids)
  RPS[$front]=$(awk '/Requests\/sec/ {print $2}' "$work/wrk-$front.txt")
  # Front CPU per request: independent of whether the load generator's CPU also saturates.
  CPU_US[$front]=$(awk -v c=$((c1 - c0)) -v n="$(awk '/requests in/ {print $1}' "$work/wrk-$front.txt")" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')
  kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; sleep 1
done
rate=$(awk -v r="${RPS[nginx]}" 'BEGIN { printf "%d", r / 2 }')
for front in nginx proxyfleet haproxy; do
  : > "$work/up-$front.log"
  pid=$(start_front $front); port=$(port_of $front); sleep 1
  log "$front: P99 at $rate req/s (half nginx's max; oha -q --latency-correction)"
  taskset -c 0 "$OHA" -z "${secs}s" -q "$rate" -c 32 --latency-correction --no-tui --insecure --output-format json "https://127.0.0.1:$port/" > "$work/oha-$front.json" 2>/dev/null || true
  P99[$front]=$(python3 -c "import json,sys; d=json.load(open('$work/oha-$front.json')); print('%.3f' % (d['latencyPercentiles']['p99']*1000))" 2>/dev/null || echo nan)
  kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; sleep 0.5
  # Upstream handshakes during the fixed-rate run: a connection's first request tells whether
  # its TLS session was resumed ("r") or full (".").
  FULL[$front]=$(awk '$1 == 1 && $2 != "r"' "$work/up-$front.log" | wc -l)
  RESUMED[$front]=$(awk '$1 == 1 && $2 == "r"' "$work/up-$front.log" | wc -l)
done
kill $UP 2>/dev/null || true

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
pct() { awk -v r="$1" -v f="$2" 'BEGIN { t = r + f; if (t > 0) printf "%.1f%%", 100 * r / t; else print "n/a" }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
{
  echo "# Benchmarks"
  echo
  echo "proxyfleet-proxy against nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') and HAProxy $(haproxy -v | head -1 | awk '{print $3}') (Debian), in one run on $(date -u +%Y-%m-%d),"
  echo "$(nproc) cores ($cpu). Each front terminates TLS (ECDSA P-256, TLS 1.3) and proxies over kept-alive"
  echo "TLS to one upstream nginx that closes every connection after 100 requests. Fronts run one"
  echo "worker thread/process pinned to CPU 1; wrk/oha and the upstream share CPU 0."
  echo
  echo "Reproduce: \`bench/run.sh $secs\` (writes this file)."
  echo
  echo "| metric | proxyfleet | nginx | HAProxy | proxyfleet / nginx | proxyfleet / HAProxy | target |"
  echo "|---|---|---|---|---|---|---|"
  echo "| max req/s (wrk -t1 -c32, ${secs}s) | ${RPS[proxyfleet]} | ${RPS[nginx]} | ${RPS[haproxy]} | $(ratio "${RPS[proxyfleet]}" "${RPS[nginx]}") | $(ratio "${RPS[proxyfleet]}" "${RPS[haproxy]}") | ≥ 1.2 × nginx, ≥ 1.0 × HAProxy |"
  echo "| front CPU µs per request (same wrk run) | ${CPU_US[proxyfleet]} | ${CPU_US[nginx]} | ${CPU_US[haproxy]} | $(ratio "${CPU_US[proxyfleet]}" "${CPU_US[nginx]}") | $(ratio "${CPU_US[proxyfleet]}" "${CPU_US[haproxy]}") | |"
  echo "| P99 ms at $rate req/s (oha -q, latency-corrected) | ${P99[proxyfleet]} | ${P99[nginx]} | ${P99[haproxy]} | $(ratio "${P99[proxyfleet]}" "${P99[nginx]}") | $(ratio "${P99[proxyfleet]}" "${P99[haproxy]}") | ≤ nginx |"
  echo "| RSS idle, MiB | $(mib "${RSS_IDLE[proxyfleet]}") | $(mib "${RSS_IDLE[nginx]}") | $(mib "${RSS_IDLE[haproxy]}") | $(ratio "${RSS_IDLE[proxyfleet]}" "${RSS_IDLE[nginx]}") | $(ratio "${RSS_IDLE[proxyfleet]}" "${RSS_IDLE[haproxy]}") | ≤ 16 MiB |"
  echo "| RSS under load, MiB | $(mib "${RSS_LOAD[proxyfleet]}") | $(mib "${RSS_LOAD[nginx]}") | $(mib "${RSS_LOAD[haproxy]}") | $(ratio "${RSS_LOAD[proxyfleet]}" "${RSS_LOAD[nginx]}") | $(ratio "${RSS_LOAD[proxyfleet]}" "${RSS_LOAD[haproxy]}") | |"
  echo "| upstream reconnects resumed (full/resumed) | $(pct "${RESUMED[proxyfleet]}" "${FULL[proxyfleet]}") (${FULL[proxyfleet]}/${RESUMED[proxyfleet]}) | $(pct "${RESUMED[nginx]}" "${FULL[nginx]}") (${FULL[nginx]}/${RESUMED[nginx]}) | $(pct "${RESUMED[haproxy]}" "${FULL[haproxy]}") (${FULL[haproxy]}/${RESUMED[haproxy]}) | | | ≥ 95 % |"
  echo
  echo "nginx's RSS is master + worker. Ratios above 1 are better for req/s, worse for CPU per request, P99 and RSS."
  echo "This machine's speed drifts between runs (the same binary measured 41k and 53k req/s an hour"
  echo "apart): compare the ratios of one run, not absolute figures across runs."
  echo
  echo "Where the time goes (CPU split, syscalls per request, what was tried): [performance.md](performance.md)."
} > "$root/docs/benchmarks.md"
cat "$root/docs/benchmarks.md"
