#!/usr/bin/env bash
# HTTP/3 through a fleet on the real cluster (issue 19). The client is a real peer (aioquic
# from PyPI, not our code): GETs and a POST over QUIC through the Service's UDP port, 0-RTT
# early data on a resumed connection (a GET served from it and marked Early-Data: 1, a POST
# held back until the handshake completed), Alt-Svc advertised on the TCP listener with the
# Service port, the UDP port on the Service, and bad specs refused at admission naming the
# field. The upstream is an HTTP/1.1 echo on the node's bridge address.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

venv=$HOME/.cache/proxyfleet/venv-peers
if ! "$venv/bin/python" -c 'import aioquic' 2>/dev/null; then
  say "installing the peer (aioquic) from PyPI"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check aioquic || fail "pip install of aioquic failed"
fi
peer() { "$venv/bin/python" "$root/e2e/peers/h3_peers.py" "$@"; }

node_ip=10.244.0.1   # the node's side of the CNI bridge: pods reach it
"$venv/bin/python" "$root/e2e/peers/h3_peers.py" serve "$node_ip" 18775 > /tmp/e2e-h3-echo.log 2>&1 &
echo_pid=$!
install_operator
ns=$(test_namespace e2e-h3)
ca=$(mktemp)
trap 'kill $echo_pid 2>/dev/null || true; rm -f "$ca"; kubectl delete ns e2e-h3 --wait=false >/dev/null 2>&1 || true' EXIT
retry 30 grep -q "echo listening" /tmp/e2e-h3-echo.log

kubectl apply -n "$ns" -f - >/dev/null <<YAML || fail "the ProxyDeployment was refused"
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata:
  name: quic
spec:
  replicas: 2
  listeners:
    - name: https
      port: 8443
      servicePort: 443
      hostnames: [h3.example.com]
      http3: {zeroRtt: true, idleTimeout: 20s}
  routes:
    - {name: all, upstream: echo}
  upstreams:
    - {name: echo, endpoints: ["$node_ip:18775"]}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/quic --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" quic -o yaml >&2; fail "quic fleet never Ready"; }
ip=$(kubectl get svc -n "$ns" quic -o jsonpath='{.spec.clusterIP}')
kubectl get secret -n "$ns" quic-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"

say "the Service has the listener's port over UDP too"
ports=$(kubectl get svc -n "$ns" quic -o jsonpath='{range .spec.ports[*]}{.name}/{.protocol}/{.port} {end}')
<<<"$ports" grep -q 'https-h3/UDP/443' || fail "no UDP port on the Service: $ports"

say "the TCP listener advertises HTTP/3 on the Service port (Alt-Svc)"
req() { curl -sS --max-time 5 --cacert "$ca" --resolve "h3.example.com:443:$ip" "$@"; }
retry 30 req -f -o /dev/null https://h3.example.com/
alt=$(req -D - -o /dev/null https://h3.example.com/ | tr -d '\r' | grep -i '^alt-svc:')
[ "$alt" = 'alt-svc: h3=":443"; ma=86400' ] || fail "unexpected Alt-Svc: '$alt'"

say "GETs and a POST over HTTP/3 through the Service (aioquic)"
h3get() { peer get h3.example.com "$ip" 443 "$ca" /one /two > /tmp/e2e-h3-get.out 2>&1; }
retry 30 h3get || fail "no HTTP/3 answer: $(tail -3 /tmp/e2e-h3-get.out)"
out=$(cat /tmp/e2e-h3-get.out)
[ "$(<<<"$out" grep -c '"status": 200')" = 3 ] || fail "not three 200s over HTTP/3: $out"
<<<"$out" grep -q '"path": "/two"' || fail "the second GET did not reach the upstream: $out"
<<<"$out" grep -q '"method": "POST", "path": "/post", "body": 1000' || fail "the POST body did not arrive whole: $out"
<<<"$out" grep -q '"x-forwarded-proto": "https"' || fail "no X-Forwarded-Proto: $out"

say "0-RTT on a resumed connection to one pod: a GET served from early data, a POST only after the handshake"
# Session tickets are per pod (single-use entries of its session cache): the client resumes
# with the pod that issued its ticket, as a client behind a QUIC-aware balancer would.
pod=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=quic -o jsonpath='{.items[0].status.podIP}')
early_seen=
for attempt in 1 2 3; do
  out=$(peer zero-rtt h3.example.com "$pod" 8443 "$ca") || fail "0-RTT exchange failed: $out"
  post=$(<<<"$out" grep '"path": "/early-post"')
  <<<"$post" grep -q '"early_data_accepted": true' || fail "the proxy refused 0-RTT data: $out"
  <<<"$post" grep -q '"early-data"' && fail "a POST was forwarded as early data: $post"
  <<<"$post" grep -q '"body": 10' || fail "the POST body did not arrive: $post"
  if <<<"$out" grep '"path": "/early"' | grep -q '"early-data": "1"'; then early_seen=$attempt; break; fi
done
[ -n "$early_seen" ] || fail "no GET was served from early data in 3 resumed connections: $out"
metrics=$(curl -fsS --max-time 5 "http://$pod:9901/metrics")
<<<"$metrics" grep -q '^proxyfleet_quic_early_requests_total{listener="https",kind="waited"} [1-9]' \
  || fail "the held-back POST was not counted: $(<<<"$metrics" grep quic)"
<<<"$metrics" grep -q '^proxyfleet_quic_connections_total{listener="https",kind="accepted"} [1-9]' \
  || fail "no accepted QUIC connections counted: $(<<<"$metrics" grep quic)"

say "bad specs refused at admission, naming the field"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-h3}
spec:
  listeners: [{name: web, port: 8080, protocol: HTTP, http3: {}}]
  routes: [{name: r, upstream: u}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "http3 on an HTTP listener was accepted"
<<<"$out" grep -q 'spec.listeners: Invalid value.*http3 is for HTTPS listeners' || fail "unexpected refusal: $out"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-h3}
spec:
  listeners: [{name: https, port: 8443, http3: {maxConcurrentStreams: 0}}]
  routes: [{name: r, upstream: u}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "maxConcurrentStreams 0 was accepted"
<<<"$out" grep -q 'spec.listeners\[0\].http3.maxConcurrentStreams' || fail "unexpected refusal: $out"
say "HTTP/3 passed"
