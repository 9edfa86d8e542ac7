#!/usr/bin/env bash
# Outside suites against the standalone release proxy on loopback (no cluster needed):
# h2spec (built from the Go module proxy) over TLS in full, then slow and hostile clients —
# 500 half-preface and 500 idle HTTP/2 connections — with the proxy's RSS and the time a
# normal request takes meanwhile printed (bench/hostile_clients.py); 64 HTTP/2 streams never
# given a flow-control window against a real HTTP/2 upstream (nginx), which must neither freeze
# the shared upstream connection for another client nor outlive `limits.sendTimeout` upstream
# (bench/stalled_streams.py), and 16 such streams against nginx over HTTP/1.1, whose upstream
# connections must be released though nginx would hold them; and spans exported over
# OTLP to a real Jaeger (built from the Go module proxy), found by its query API with the
# caller's span as parent.
. "$(dirname "$0")/../lib/testlib.sh"
export PATH="$PATH:/usr/local/go/bin"
h2spec=$PROXYFLEET_CACHE/bin/h2spec
if ! [ -x "$h2spec" ]; then
  say "building h2spec $H2SPEC_VERSION from the Go module proxy"
  GOBIN=$PROXYFLEET_CACHE/bin CGO_ENABLED=0 go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION" || fail "go install h2spec failed"
fi
jaeger=$PROXYFLEET_CACHE/bin/jaeger
if ! [ -x "$jaeger" ]; then
  say "building Jaeger $JAEGER_VERSION from the Go module proxy (once, about 6 minutes)"
  jdir=$(mktemp -d)
  ( cd "$jdir" && printf 'module proxyfleet.local/jaeger-build\n\ngo 1.26\n' > go.mod \
    && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" \
    && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$jaeger" github.com/jaegertracing/jaeger/cmd/jaeger ) >/dev/null 2>&1 \
    || fail "building Jaeger failed"
  rm -rf "$jdir"
fi
bin=$CARGO_TARGET_DIR_RELEASE
[ -x "$bin/proxyfleet-proxy" ] || fail "no release proxy at $bin (e2e/images/build builds it)"
dir=$(mktemp -d)
pids=()
# nginx is stopped by TERM to its master, which ends its worker: a worker outlives a master
# killed with -9 and would hold the port (serving a deleted directory) for the next run.
nginx_pid=
trap '[ -z "$nginx_pid" ] || kill -TERM "$nginx_pid" 2>/dev/null; kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -subj /CN=conformance-ca -days 1 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls.key -out tls.csr -subj /CN=conformance.example.com 2>/dev/null
printf 'subjectAltName=DNS:conformance.example.com\n' > ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 -extfile ext 2>/dev/null
cat > proxy.yaml <<YAML
listeners:
  - name: https
    address: "127.0.0.1:18443"
    tls: {certificates: [{certFile: $dir/tls.crt, keyFile: $dir/tls.key, default: true}]}
admin: {address: "127.0.0.1:18901"}
# One worker, so the stalled streams and the other client share one upstream connection.
workerThreads: 1
limits: {headerReadTimeout: 10s, sendTimeout: 10s}
routes:
  # h2spec's requests wait 100 ms before going upstream: a few cases (6.9.1/3) send frames
  # right after HEADERS and expect the stream still open, which a loopback upstream's answer
  # races (1 run in 10 without the delay).
  - {name: h2spec, match: {pathPrefix: /h2spec}, upstream: echo, fault: {delay: {duration: 100ms, percent: 100}}}
  - {name: big, match: {pathPrefix: /big/}, upstream: h2up}
  - {name: big1, match: {pathPrefix: /big1/}, upstream: h1up}
  - {name: all, upstream: echo}
upstreams:
  - {name: echo, endpoints: ["127.0.0.1:18080"]}
  - {name: h2up, endpoints: ["127.0.0.1:18082"], protocol: h2}
  - {name: h1up, endpoints: ["127.0.0.1:18083"], protocol: http1}
tracing: {samplePercent: 100, otlpEndpoint: "http://127.0.0.1:4318", serviceName: proxyfleet-conformance}
YAML
"$jaeger" > jaeger.log 2>&1 & pids+=($!)
ECHO_ADDR=127.0.0.1:18080 "$bin/proxyfleet-echo" > echo.log 2>&1 & pids+=($!)
# The HTTP/2 upstream: nginx (h2c), an 8 MiB file, each request logged with the bytes it sent.
command -v nginx >/dev/null || fail "nginx is not installed (scripts/setup.sh installs it)"
chmod 711 "$dir"; mkdir -m 755 www www/big www/big1
truncate -s 8M www/big/8m www/big1/8m; chmod 644 www/big/8m www/big1/8m
cat > nginx.conf <<CONF
worker_processes 1; daemon off; pid $dir/nginx.pid; error_log $dir/nginx-error.log warn;
events { worker_connections 1024; }
http {
  log_format sent '\$request_uri \$status \$body_bytes_sent';
  access_log $dir/up.log sent;
  server { listen 127.0.0.1:18082 http2; root $dir/www; }
  # The same files over HTTP/1.1, with a send timeout longer than the test: nginx itself never
  # gives up on a reader that stopped.
  server { listen 127.0.0.1:18083; root $dir/www; send_timeout 300s; }
}
CONF
nginx -c "$dir/nginx.conf" -p "$dir" > nginx.out 2>&1 & nginx_pid=$!
retry 20 curl -fsS --http2-prior-knowledge -o /dev/null http://127.0.0.1:18082/big/8m
"$bin/proxyfleet-proxy" --config proxy.yaml > proxy.log 2>&1 & proxy=$!; pids+=($proxy)
retry 20 curl -fsS --cacert ca.crt --resolve conformance.example.com:18443:127.0.0.1 https://conformance.example.com:18443/ready

say "h2spec $H2SPEC_VERSION over TLS (every case)"
out=$("$h2spec" -h 127.0.0.1 -p 18443 -P /h2spec -t -k -o 5 2>&1) || true
summary=$(<<<"$out" grep -E '^[0-9]+ tests, ' || true)
say "h2spec: $summary"
<<<"$summary" grep -qE '^([0-9]+) tests, \1 passed, 0 skipped, 0 failed' || { <<<"$out" grep -B2 -A6 '×' >&2; fail "h2spec: not every case passed"; }

say "500 half-preface + 500 idle h2 connections"
python3 "$root/bench/hostile_clients.py" 127.0.0.1 18443 ca.crt conformance.example.com "$proxy" 500 > hostile.txt 2>&1 || { cat hostile.txt >&2; fail "hostile clients run failed"; }
sed 's/^/  /' hostile.txt >&2
grep -q 'a normal request took .* (HTTP/1.1 200 OK)' hostile.txt || fail "no normal answer while the hostile connections were open"
grep -q 'half-preface connections all closed after: [0-9]' hostile.txt || fail "half-preface connections were not closed"
grep -q 'idle h2 connections (PINGs unanswered) all closed after: [0-9]' hostile.txt || fail "idle h2 connections were not closed"
grep -q 'a normal request afterwards: .* (HTTP/1.1 200 OK)' hostile.txt || fail "the proxy stopped serving"

say "64 HTTP/2 streams never given a window, against an HTTP/2 upstream (nginx)"
size=$((8 << 20))
python3 "$root/bench/stalled_streams.py" 127.0.0.1 18443 ca.crt conformance.example.com /big/8m 64 40 > stalled.txt 2>&1 & stalled=$!; pids+=($stalled)
sleep 3
# Each stalled stream leaves at most a stream window (256 KiB) unread of the upstream
# connection's 32 MiB: another client's download on that connection goes through at once,
# long before the send timeout (10 s) could free anything. hyper's own windows (2 MiB, 5 MiB)
# froze it after three.
t0=$(date +%s.%N)
curl -fsS -m 5 --http2 --cacert ca.crt --resolve conformance.example.com:18443:127.0.0.1 \
  https://conformance.example.com:18443/big/8m -o big.out || fail "a download waited behind the stalled streams"
[ "$(stat -c %s big.out)" = "$size" ] || fail "the download was cut short"
say "another client's 8 MiB download beside them took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s"
# At the send timeout the stalled streams are reset upstream, while their client still holds
# its connection: nginx logs each one, cut short.
# How many answers to PATH nginx logged cut short, once WANT are or after TRIES seconds.
cut_short() {
  local path=$1 want=$2 tries=$3 n=0
  for _ in $(seq "$tries"); do
    n=$(awk -v s="$size" -v p="$path" '$1 == p && $3 < s' up.log | wc -l)
    [ "$n" -ge "$want" ] && break
    sleep 1
  done
  echo "$n"
}
# The stalled client PID is stopped and its report OUT shown; N of its streams were cut (CUT)
# and it saw N heads, no data, its connection open — else fail with WHAT.
end_stalled() {
  local pid=$1 out=$2 n=$3 cut=$4 what=$5
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  sed 's/^/  /' "$out" >&2
  [ "$cut" -ge "$n" ] || { sort up.log | uniq -c >&2; fail "only $cut of the $n $what"; }
  grep -q "response heads: $n, data bytes: 0, .* connection open" "$out" || fail "the stalled client saw something else"
}
cut=$(cut_short /big/8m 64 25)
end_stalled "$stalled" stalled.txt 64 "$cut" "stalled streams were reset upstream"
say "all 64 stalled streams were reset upstream at the send timeout; the proxy still serves"
curl -fsS --cacert ca.crt --resolve conformance.example.com:18443:127.0.0.1 https://conformance.example.com:18443/ready >/dev/null

say "16 HTTP/2 streams never given a window, against an HTTP/1.1 upstream (nginx)"
# Each holds an upstream connection of its own, which nothing on nginx's side would ever
# release: the proxy reads ahead, and closes each connection once its client has taken less
# than 64 KiB in a send timeout (10 s; judged at the end of the second period at the latest).
python3 "$root/bench/stalled_streams.py" 127.0.0.1 18443 ca.crt conformance.example.com /big1/8m 16 45 > stalled1.txt 2>&1 & stalled=$!; pids+=($stalled)
t0=$(date +%s)
cut=$(cut_short /big1/8m 16 35)
released=$(( $(date +%s) - t0 ))
end_stalled "$stalled" stalled1.txt 16 "$cut" "stalled streams' upstream connections were released"
say "all 16 upstream connections released, cut short, within ${released}s while their client held its connection"

say "tracing: a span exported over OTLP to Jaeger, child of the caller's span"
retry 30 curl -fsS http://127.0.0.1:13133/status
trace=4bf92f3577b34da6a3ce929d0e0e4736
curl -fsS --cacert ca.crt --resolve conformance.example.com:18443:127.0.0.1 \
  -H "traceparent: 00-$trace-00f067aa0ba902b7-01" https://conformance.example.com:18443/traced -o /dev/null
found=""
for _ in $(seq 30); do
  found=$(curl -fsS "http://127.0.0.1:16686/api/traces/$trace" 2>/dev/null || true)
  <<<"$found" grep -q '"operationName":"GET all"' && break
  sleep 1
done
<<<"$found" grep -q '"operationName":"GET all"' || fail "Jaeger has no span of trace $trace: $(tail -3 jaeger.log)"
<<<"$found" grep -q '"refType":"CHILD_OF","traceID":"'"$trace"'","spanID":"00f067aa0ba902b7"' || fail "the span is not the caller's child: $found"
<<<"$found" grep -q '"serviceName":"proxyfleet-conformance"' || fail "wrong service name: $found"
say "Jaeger: trace $trace holds the proxy's span \"GET all\", child of 00f067aa0ba902b7"
