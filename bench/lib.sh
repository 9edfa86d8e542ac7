# Shared set-up of the proxy benchmarks (sourced by bench/run.sh and bench/split.sh): installs
# the tools, builds proxyfleet-proxy in release, writes certificates and the three fronts'
# configurations, starts the upstream nginx pinned to CPU 0 (pid in $UP), and defines
# start_front/port_of/pids_of/cputicks/rss_kb. Expects $root; honours $PROXY_BIN (a prebuilt
# proxy binary, to compare builds), $PROXY_EXTRA_YAML (lines appended to its config) and
# $FRONT_WORKERS (every front's workers: nginx processes, HAProxy threads, ours; default 1).
# $UPSTREAM_PROTOCOL=h2 makes proxyfleet's upstream HTTP/2 (see below).
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/proxyfleet/target}
work=/tmp/proxyfleet-bench
front_workers=${FRONT_WORKERS:-1}
# Leftovers of an interrupted run (an nginx worker outlives a killed master) hold the ports.
for stale in $(ss -Hltnp 2>/dev/null | awk '$4 ~ /:(1844[1-9]|1944[1-6]|1990[1-6])$/' | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
  kill -9 "$stale" 2>/dev/null || true
done
rm -rf "$work"; mkdir -p "$work/certs"   # certs apart: the proxy watches their directory, logs churn
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v nginx >/dev/null && command -v haproxy >/dev/null && command -v wrk >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy wrk >/dev/null; }
if ! command -v oha >/dev/null && [ ! -x "$HOME/.cargo/bin/oha" ]; then
  log "installing oha (cargo install, once)"
  cargo install oha --locked -q
fi
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
if [ -n "${PROXY_BIN:-}" ]; then
  PROXY=$PROXY_BIN
else
  log "building proxyfleet-proxy (release)"
  ( cd "$root" && cargo build --release -q -p proxyfleet-proxy --bin proxyfleet-proxy )
  PROXY=$CARGO_TARGET_DIR/release/proxyfleet-proxy
fi

# Certificates: one CA, a server certificate for localhost used by all fronts and the upstream.
openssl ecparam -name prime256v1 -genkey -noout -out "$work/certs/ca.key" 2>/dev/null
openssl req -x509 -new -key "$work/certs/ca.key" -days 2 -subj /CN=bench-ca -out "$work/certs/ca.crt" 2>/dev/null
# BENCH_KEY=rsa: the fronts' certificate has an RSA-2048 key instead (bench/handshakes.sh).
if [ "${BENCH_KEY:-ec}" = rsa ]; then
  openssl genrsa -out "$work/certs/tls.key.ec" 2048 2>/dev/null
else
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/certs/tls.key.ec" 2>/dev/null
fi
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
  log_format hs '\$connection_requests \$ssl_session_reused \$ssl_protocol \$request_length';
  ssl_certificate $work/certs/tls.crt; ssl_certificate_key $work/certs/tls.key; ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_cache shared:UP:10m; ssl_session_tickets on;
  keepalive_requests 100; keepalive_timeout 60s;
  server { listen 127.0.0.1:19441 ssl; access_log $work/up-proxyfleet.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19442 ssl; access_log $work/up-nginx.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19443 ssl; access_log $work/up-haproxy.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19444 ssl; access_log $work/up-nginx12.log hs; location / { return 200 "hello from upstream\n"; } }
  server { listen 127.0.0.1:19445 ssl; access_log $work/up-proxyfleet12.log hs; location / { return 200 "hello from upstream\n"; } }
  # No front: the load generator straight to the upstream, for the latency floor of the set-up.
  server { listen 127.0.0.1:19446 ssl; access_log off; location / { return 200 "hello from upstream\n"; } }
}
CONF
# UPSTREAM_PROTOCOL=h2: proxyfleet's upstream speaks HTTP/2 (`protocol: h2`, as a gRPC service's
# would), on one connection per worker; its requests per connection are not capped.
upstream_protocol=${UPSTREAM_PROTOCOL:-http1}
if [ "$upstream_protocol" = h2 ]; then
  sed -i 's/listen 127.0.0.1:19441 ssl;/listen 127.0.0.1:19441 ssl http2; keepalive_requests 1000000;/' "$work/upstream.conf"
fi
taskset -c 0 nginx -c "$work/upstream.conf" -p "$work" >"$work/upstream.out" 2>&1 & UP=$!
trap 'kill $UP 2>/dev/null || true; remove_quota_cgroup' EXIT

cat > "$work/nginx.conf" <<CONF
worker_processes $front_workers; daemon off; pid $work/nginx.pid; error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream up { server 127.0.0.1:19442; keepalive 1024; }  # idle pools alike: HAProxy keeps every idle one
  server {
    listen 127.0.0.1:18442 ssl; http2 on;
    ssl_certificate $work/certs/tls.crt; ssl_certificate_key $work/certs/tls.key; ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:FRONT:10m;
    location / {
      proxy_pass https://up; proxy_http_version 1.1; proxy_set_header Connection "";
      # What proxyfleet does by default: pass Host, add X-Forwarded-For/-Proto.
      proxy_set_header Host \$http_host; proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      # Verify the upstream and allow TLS 1.3 to it, as proxyfleet and HAProxy do (nginx 1.22's
      # default proxy_ssl_protocols stops at TLS 1.2 and proxy_ssl_verify is off).
      proxy_ssl_protocols TLSv1.2 TLSv1.3; proxy_ssl_verify on; proxy_ssl_trusted_certificate $work/certs/ca.crt;
      proxy_ssl_session_reuse on; proxy_ssl_server_name on; proxy_ssl_name localhost;
    }
  }
}
CONF
sed -i 's/ http2 on;//' "$work/nginx.conf"   # nginx 1.22 takes http2 on the listen line; h1 clients here anyway
# For reference: nginx 1.22's own default to upstreams, TLS 1.2 only (cheaper resumption: no key
# exchange), as front "nginx12".
sed -e 's/18442/18444/; s/19442/19444/; s/FRONT:10m/FRONT12:10m/; s/nginx.pid/nginx12.pid/; s/nginx-error.log/nginx12-error.log/' \
    -e 's/proxy_ssl_protocols TLSv1.2 TLSv1.3;/proxy_ssl_protocols TLSv1.2;/' "$work/nginx.conf" > "$work/nginx12.conf"

cat > "$work/haproxy.cfg" <<CONF
global
  nbthread $front_workers
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
  option forwardfor
  http-request set-header X-Forwarded-Proto https
  server up 127.0.0.1:19443 ssl verify required ca-file $work/certs/ca.crt sni str(localhost)
CONF

cat > "$work/certs/proxyfleet.yaml" <<CONF
workerThreads: $front_workers
listeners:
  - name: https
    address: 127.0.0.1:18441
    tls: {certificates: [{certFile: $work/certs/tls.crt, keyFile: $work/certs/tls.key, default: true}]}
admin: {address: "127.0.0.1:19901"}
routes: [{name: all, upstream: up}]
upstreams:
  - name: up
    endpoints: ["127.0.0.1:19441"]
    protocol: $upstream_protocol
    tls: {serverName: localhost, caFile: $work/certs/ca.crt}
    pool: {maxIdlePerEndpoint: 1024}
${PROXY_EXTRA_YAML:-}
CONF
# The same with TLS 1.2 to the upstream (maxVersion), to compare with nginx12.
sed -e 's/18441/18445/; s/19441/19445/; s/19901/19902/' -e 's/caFile: \([^}]*\)}/caFile: \1, maxVersion: "1.2"}/' \
    "$work/certs/proxyfleet.yaml" > "$work/certs/proxyfleet12.yaml"
# "proxyfleetB": the same configuration on ports of its own, run with $PROXY_B (bench/paired.sh's
# A/B of two builds).
sed -e 's/18441/18446/; s/19901/19903/' "$work/certs/proxyfleet.yaml" > "$work/certs/proxyfleetB.yaml"
# "proxyfleetSplit": the route split 50/50 between two upstreams to the same server (issue 17's
# weighted backends), to price the split against one upstream (PAIRS=proxyfleetSplit:proxyfleet).
sed -e 's/18441/18447/; s/19901/19904/' \
    -e 's/routes: \[{name: all, upstream: up}\]/routes: [{name: all, backends: [{upstream: up, weight: 50}, {upstream: up2, weight: 50}]}]/' \
    "$work/certs/proxyfleet.yaml" > "$work/certs/proxyfleetSplit.yaml"
sed -n '/^  - name: up$/,/^    pool:/p' "$work/certs/proxyfleet.yaml" | sed 's/name: up$/name: up2/' >> "$work/certs/proxyfleetSplit.yaml"

# "proxyfleetLog": access logs on, every request, JSON lines to a file (issue 18: the price of
# logging; PAIRS=proxyfleetLog:proxyfleet).
sed -e 's/18441/18448/; s/19901/19905/' \
    -e "s#^\(    tls: {certificates.*\)\$#\1\n    accessLog: {path: $work/access.log}#" \
    "$work/certs/proxyfleet.yaml" > "$work/certs/proxyfleetLog.yaml"

# "nginxLog": nginx with its default combined access log to a file, the peer of proxyfleetLog
# (PAIRS=nginxLog:nginx).
sed -e 's/18442/18449/; s/FRONT:10m/FRONTLOG:10m/; s/nginx.pid/nginxLog.pid/; s/nginx-error.log/nginxLog-error.log/' \
    -e "s#access_log off;#access_log $work/nginx-access.log;#" "$work/nginx.conf" > "$work/nginxLog.conf"

rss_kb() { local total=0 p; for p in "$@"; do total=$(( total + $(awk '/VmRSS/ {print $2}' /proc/$p/status 2>/dev/null || echo 0) )); done; echo $total; }

# The front-bound runs give the front a CPU quota (FRONT_CPU_PERCENT of CPU 1, in 10 ms periods),
# so that the front, not the load generator or the upstream on CPU 0, sets the pace: on two
# cores that is the only way to measure what a front itself can do (docs/decisions.md).
FRONT_CPU_PERCENT=${FRONT_CPU_PERCENT:-50}
QUOTA_CG=
# quota_cgroup NAME PERCENT: a cgroup (v1 or v2 cpu controller) holding PERCENT of one CPU in
# 10 ms periods; prints its path. Names start with proxyfleet-bench, so the exit trap removes them.
quota_cgroup() {
  local cg
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then            # cgroup v1
    cg=/sys/fs/cgroup/cpu/$1; mkdir -p "$cg"
    echo 10000 > "$cg/cpu.cfs_period_us"; echo $(($2 * 100)) > "$cg/cpu.cfs_quota_us"
  elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then             # cgroup v2
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    cg=/sys/fs/cgroup/$1; mkdir -p "$cg"; echo "$(($2 * 100)) 10000" > "$cg/cpu.max"
  else
    log "no cgroup cpu controller: cannot run front-bound measurements"; return 1
  fi
  echo "$cg"
}
setup_quota_cgroup() { QUOTA_CG=$(quota_cgroup proxyfleet-bench "$FRONT_CPU_PERCENT"); }
remove_quota_cgroup() {   # every quota cgroup, once the fronts in them have exited
  sleep 0.5; rmdir /sys/fs/cgroup/cpu/proxyfleet-bench* /sys/fs/cgroup/proxyfleet-bench* 2>/dev/null || true
}

# The CPUs fronts are pinned to (bench/workers.sh gives two-worker fronts both CPUs).
FRONT_CPUS=${FRONT_CPUS:-1}
# start_front NAME [quota]: starts a front pinned to $FRONT_CPUS (in the quota cgroup with "quota",
# entered before exec so that forked workers inherit it); prints its pid.
start_front() {
  local cmd
  case $1 in
    proxyfleet|proxyfleet12|proxyfleetSplit|proxyfleetLog) cmd=("$PROXY" --config "$work/certs/$1.yaml" --log-format text) ;;
    proxyfleetB) cmd=("${PROXY_B:?PROXY_B names the second proxy build}" --config "$work/certs/$1.yaml" --log-format text) ;;
    nginx|nginx12|nginxLog) cmd=(nginx -c "$work/$1.conf" -p "$work") ;;
    haproxy) cmd=(haproxy -db -f "$work/haproxy.cfg") ;;
  esac
  if [ "${2:-}" = quota ]; then
    bash -c 'echo $$ > "$1/cgroup.procs" && cpus=$2 && shift 2 && exec taskset -c "$cpus" "$@"' _ "$QUOTA_CG" "$FRONT_CPUS" "${cmd[@]}" >"$work/$1.out" 2>&1 & echo $!
  else
    taskset -c "$FRONT_CPUS" "${cmd[@]}" >"$work/$1.out" 2>&1 & echo $!
  fi
}
port_of() { case $1 in proxyfleet) echo 18441;; nginx) echo 18442;; haproxy) echo 18443;; nginx12) echo 18444;; proxyfleet12) echo 18445;; proxyfleetB) echo 18446;; proxyfleetSplit) echo 18447;; proxyfleetLog) echo 18448;; nginxLog) echo 18449;; esac; }
pids_of() { echo "$1 $(pgrep -P "$1" | tr '\n' ' ')"; }

# CPU time (user + kernel, clock ticks) of a front's processes, from /proc.
cputicks() { local t=0 p; for p in "$@"; do t=$(( t + $(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0) )); done; echo $t; }

# Waits (up to 5 s) until the front on PORT answers.
wait_ready() { local _; for _ in $(seq 1 50); do curl -sk "https://127.0.0.1:$1/" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 0; }
# us_per_request TICKS WRK_OUTPUT: a front's CPU µs per request over one wrk run.
us_per_request() {
  awk -v c="$1" -v n="$(awk '/requests in/ {print $1}' "$2")" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }'
}
# The median of numbers on stdin (separated by spaces or newlines); "nan" when there are none.
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
