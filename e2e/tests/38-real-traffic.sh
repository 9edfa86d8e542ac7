#!/usr/bin/env bash
# Real application traffic through a fleet on the real cluster (issue 18): a WebSocket echo,
# gRPC unary and server-streaming calls, and server-sent events, with real peers (Python
# websockets and grpcio from PyPI) on both sides: the servers on the node's bridge address,
# the clients through the fleet's Service. Also: the access log lines in `kubectl logs`, the
# X-Request-Id and header rules, a local rate limit.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

venv=$HOME/.cache/proxyfleet/venv-peers
if ! "$venv/bin/python" -c 'import grpc, grpc_health.v1, websockets' 2>/dev/null; then
  say "installing the peers (grpcio, grpcio-health-checking, websockets) from PyPI"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio grpcio-health-checking 'websockets>=13' \
    || fail "pip install of the peers failed"
fi
"$venv/bin/python" -c 'import grpc, websockets; print("  peers: grpcio", grpc.__version__, "websockets", websockets.__version__)' >&2

node_ip=10.244.0.1   # the node's side of the CNI bridge (e2e/cluster NODE_IP): pods reach it
"$venv/bin/python" "$root/e2e/peers/traffic_peers.py" serve "$node_ip" 18765 18766 18767 > /tmp/e2e-peers.log 2>&1 &
peers=$!
install_operator
ns=$(test_namespace e2e-traffic)
trap 'kill $peers 2>/dev/null || true; kubectl delete ns e2e-traffic --wait=false >/dev/null 2>&1 || true' EXIT
retry 30 grep -q "peers listening" /tmp/e2e-peers.log

kubectl apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata:
  name: traffic
spec:
  replicas: 2
  listeners:
    - name: https
      port: 8443
      servicePort: 443
      hostnames: [traffic.example.com]
      accessLog: {samplePercent: 100}
  routes:
    - {name: ws, match: {pathPrefix: /ws}, upstream: ws, upgradeIdleTimeout: 5m}
    - {name: grpc, match: {pathPrefix: /grpc.health.v1.Health}, upstream: grpc, timeout: 30s}
    - {name: limited, match: {pathPrefix: /limited}, upstream: sse, timeout: 30s,
       rateLimit: {requestsPerSecond: 0.01, burst: 2}}
    - {name: events, match: {pathPrefix: /events}, upstream: sse, timeout: 30s,
       headers: {response: {set: [{name: x-served-by, value: proxyfleet}]}}}
  upstreams:
    - {name: ws, endpoints: ["$node_ip:18765"]}
    - {name: grpc, endpoints: ["$node_ip:18766"], protocol: h2}
    - {name: sse, endpoints: ["$node_ip:18767"]}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/traffic --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" traffic -o yaml >&2; fail "traffic fleet never Ready"; }

ip=$(kubectl get svc -n "$ns" traffic -o jsonpath='{.spec.clusterIP}')
ca=$(mktemp)
kubectl get secret -n "$ns" traffic-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"
retry 30 curl -fsS --max-time 5 --cacert "$ca" --resolve "traffic.example.com:443:$ip" https://traffic.example.com/events -o /dev/null

say "WebSocket, gRPC and SSE through the fleet"
if ! "$venv/bin/python" "$root/e2e/peers/traffic_peers.py" check "$ip" "$ca" traffic.example.com > /tmp/e2e-traffic-check.log 2>&1; then
  sed 's/^/  /' /tmp/e2e-traffic-check.log >&2
  ws_headers=(-H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==')
  say "diagnosis: a WebSocket handshake by curl, direct and through the fleet"
  curl -sS -i --http1.1 --max-time 5 "${ws_headers[@]}" "http://$node_ip:18765/ws" 2>&1 | head -5 >&2 || true
  curl -sS -i --http1.1 --max-time 15 "${ws_headers[@]}" --cacert "$ca" --resolve "traffic.example.com:443:$ip" https://traffic.example.com/ws 2>&1 | head -5 >&2 || true
  for pod in $(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=traffic -o name); do
    kubectl logs -n "$ns" "$pod" >&2 || true
  done
  date >&2; grep -v '^ ' /tmp/e2e-peers.log >&2
  fail "a real-traffic check failed"
fi
sed 's/^/  /' /tmp/e2e-traffic-check.log >&2

say "response header rule and X-Request-Id"
headers=$(curl -sS -D - -o /dev/null --max-time 10 --cacert "$ca" --resolve "traffic.example.com:443:$ip" https://traffic.example.com/events)
<<<"$headers" grep -qi '^x-served-by: proxyfleet' || fail "the response header rule was not applied: $headers"
<<<"$headers" grep -qiE '^x-request-id: [0-9a-f]{32}' || fail "no generated X-Request-Id: $headers"

say "a local rate limit through the fleet: 429 with Retry-After"
limited=0
for _ in $(seq 12); do
  out=$(curl -sS -D - -o /dev/null --max-time 10 --cacert "$ca" --resolve "traffic.example.com:443:$ip" https://traffic.example.com/limited)
  if <<<"$out" head -1 | grep -q ' 429'; then
    <<<"$out" grep -qiE '^retry-after: [0-9]+' || fail "a 429 without Retry-After: $out"
    limited=$((limited + 1))
  fi
done
# 2 pods × burst 2 at most succeed (a token comes back per 100 s); the rest are limited.
[ "$limited" -ge 6 ] || fail "only $limited of 12 requests over the limit were answered 429"
say "rate limit: $limited of 12 requests answered 429 with Retry-After"

say "access log lines in kubectl logs"
lines=""
for pod in $(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=traffic -o name); do
  lines+=$(kubectl logs -n "$ns" "$pod" | grep '^{"time"' || true)$'\n'
done
<<<"$lines" grep -q '"route":"ws"' || fail "no access log line for the WebSocket route"
<<<"$lines" grep -q '"route":"grpc"' || fail "no access log line for the gRPC route"
<<<"$lines" grep '"route":"events"' | grep -q '"bytes_sent":[1-9]' || fail "no access log line with bytes for the SSE route"
say "access log sample: $(<<<"$lines" grep '"route":"events"' | head -1)"
rm -f "$ca"
say "real traffic passed"
