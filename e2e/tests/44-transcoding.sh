#!/usr/bin/env bash
# REST/JSON ↔ gRPC transcoding through a fleet on the real cluster (issue 19). The gRPC server
# is a real peer (grpcio's standard health service from PyPI, not our code) on the node's
# bridge address; the descriptor set (grpc.health.v1 with google.api.http rules,
# proxy/tests/data/health_http.pb) is a ConfigMap the pods mount. curl sends HTTP/JSON: a GET
# with a path variable, a query parameter and a POST body become Check calls answered in
# canonical JSON; the server's NOT_FOUND becomes 404 with a google.rpc.Status body; a Watch
# stream arrives as JSON lines while it runs; unknown fields get 400; calls are counted per
# method; a file path in the spec is refused at admission; a missing ConfigMap is reported in
# status naming the field.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

venv=$HOME/.cache/proxyfleet/venv-peers
if ! "$venv/bin/python" -c 'import grpc, grpc_health.v1, websockets' 2>/dev/null; then
  say "installing the peers (grpcio, grpcio-health-checking, websockets) from PyPI"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio grpcio-health-checking 'websockets>=13' \
    || fail "pip install of the peers failed"
fi
node_ip=10.244.0.1   # the node's side of the CNI bridge: pods reach it
"$venv/bin/python" "$root/e2e/peers/traffic_peers.py" serve "$node_ip" 18785 18786 18787 > /tmp/e2e-transcode-peers.log 2>&1 &
peers=$!
install_operator
ns=$(test_namespace e2e-transcode)
ca=$(mktemp)
trap 'kill $peers 2>/dev/null || true; rm -f "$ca"; kubectl delete ns e2e-transcode --wait=false >/dev/null 2>&1 || true' EXIT
retry 30 grep -q "peers listening" /tmp/e2e-transcode-peers.log

kubectl create configmap -n "$ns" health-api --from-file=descriptors.pb="$root/proxy/tests/data/health_http.pb" >/dev/null
kubectl apply -n "$ns" -f - >/dev/null <<YAML || fail "the ProxyDeployment was refused"
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata:
  name: api
spec:
  replicas: 2
  listeners:
    - {name: https, port: 8443, servicePort: 443, hostnames: [api.example.com]}
  routes:
    - name: health
      upstream: grpc
      timeout: 30s
      grpcTranscoding: {descriptorSetConfigMap: health-api}
  upstreams:
    - {name: grpc, endpoints: ["$node_ip:18786"], protocol: h2}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/api --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" api -o yaml >&2; fail "api fleet never Ready"; }
ip=$(kubectl get svc -n "$ns" api -o jsonpath='{.spec.clusterIP}')
kubectl get secret -n "$ns" api-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"
req() { curl -sS --max-time 5 --cacert "$ca" --resolve "api.example.com:443:$ip" "$@"; }
retry 30 req -f -o /dev/null https://api.example.com/v1/health

say "GET with a query parameter, GET with a path variable, POST with a body: Check calls in JSON"
[ "$(req -f https://api.example.com/v1/health)" = '{"status":"SERVING"}' ] || fail "GET /v1/health: $(req https://api.example.com/v1/health)"
[ "$(req -f 'https://api.example.com/v1/health?service=')" = '{"status":"SERVING"}' ] || fail "a query parameter was not mapped"
out=$(req -f https://api.example.com/v1/health/e2e) || fail "GET with a path variable failed: $out"
<<<"$out" grep -Eq '^\{"status":"(SERVING|NOT_SERVING)"\}$' || fail "unexpected answer: $out"
out=$(req -f -X POST -H 'content-type: application/json' -d '{"service": ""}' https://api.example.com/v1/health:check) \
  || fail "POST with a body failed: $out"
[ "$out" = '{"status":"SERVING"}' ] || fail "unexpected answer to the POST: $out"

say "the server's NOT_FOUND is a 404 with a google.rpc.Status body; a bad field is a 400"
out=$(req -w ' %{http_code}' https://api.example.com/v1/health/nope | tr -d '\n')
<<<"$out" grep -q '"code":5.* 404$' || fail "unexpected answer for an unknown service: $out"
out=$(req -w ' %{http_code}' -X POST -d '{"servce": "x"}' https://api.example.com/v1/health:check | tr -d '\n')
<<<"$out" grep -q 'servce.* 400$' || fail "an unknown field was not refused naming it: $out"

say "a server stream (Watch) arrives as JSON lines while it runs"
lines=$(req -N --max-time 3 https://api.example.com/v1/health/e2e:watch 2>/dev/null || true)
n=$(<<<"$lines" grep -c '^{"result":{"status":"\(NOT_\)\?SERVING"}}$' || true)
[ "$n" -ge 3 ] || fail "expected several JSON lines from the stream, got: $lines"

say "calls are counted per gRPC method"
pod=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=api -o jsonpath='{.items[*].status.podIP}')
total=0
for p in $pod; do
  c=$(curl -fsS --max-time 5 "http://$p:9901/metrics" | awk '/^proxyfleet_grpc_transcoded_requests_total\{route="health",method="grpc.health.v1.Health.Check",code="OK"\}/ { s += $2 } END { print s + 0 }')
  total=$((total + c))
done
[ "$total" -ge 4 ] || fail "Check calls counted: $total"

say "bad specs: a file path refused at admission, a missing ConfigMap reported in status"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-transcode}
spec:
  listeners: [{name: https, port: 8443}]
  routes: [{name: r, upstream: u, grpcTranscoding: {descriptorSetFile: /etc/proxyfleet/tls/tls.key}}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"], protocol: h2}]
YAML
) && fail "a descriptorSetFile in a ProxyDeployment was accepted"
<<<"$out" grep -q 'descriptorSetFile is for the standalone proxy' || fail "unexpected refusal: $out"
kubectl patch -n "$ns" pxd/api --type=json -p '[{"op":"replace","path":"/spec/routes/0/grpcTranscoding/descriptorSetConfigMap","value":"nope"}]' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns api -o jsonpath='{.status.conditions[*].message}' | grep -q 'spec.routes\[0\].grpcTranscoding.descriptorSetConfigMap: ConfigMap nope not found'"
[ "$(req -f https://api.example.com/v1/health)" = '{"status":"SERVING"}' ] || fail "the fleet stopped serving on a bad spec"
say "transcoding passed"
