#!/usr/bin/env bash
# JWT validation and CORS through a fleet on the real cluster (issue 19): keys and tokens made
# by real peers (PyJWT and cryptography from PyPI), the key set in a Secret and in a
# ConfigMap; ES256, RS256 and EdDSA tokens admitted with their claim forwarded; missing,
# expired, wrong-audience and unknown-key tokens refused with 401 and WWW-Authenticate; the
# key set rotated in the Secret and picked up by the running pods without a rollout; CORS
# preflights answered by the proxy; bad specs refused at admission naming the field.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

venv=$HOME/.cache/proxyfleet/venv-peers
if ! "$venv/bin/python" -c 'import jwt, cryptography' 2>/dev/null; then
  say "installing the peers (PyJWT, cryptography) from PyPI"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'pyjwt[crypto]' || fail "pip install of PyJWT failed"
fi
peer() { "$venv/bin/python" "$root/e2e/peers/jwt_peers.py" "$@"; }

node_ip=10.244.0.1   # the node's side of the CNI bridge: pods reach it
keys=$(mktemp -d)
"$venv/bin/python" "$root/e2e/peers/jwt_peers.py" serve "$node_ip" 18770 > /tmp/e2e-jwt-echo.log 2>&1 &   # $! is python itself
echo_pid=$!
install_operator
ns=$(test_namespace e2e-jwt)
trap 'kill $echo_pid 2>/dev/null || true; rm -rf "$keys"; kubectl delete ns e2e-jwt --wait=false >/dev/null 2>&1 || true' EXIT
retry 30 grep -q "echo listening" /tmp/e2e-jwt-echo.log

peer keys "$keys" first es-1 rs-1 ed-1
peer keys "$keys" second es-2
peer keys "$keys" public ed-9
kubectl create secret generic -n "$ns" api-keys --save-config --from-file=jwks.json="$keys/first.jwks.json" >/dev/null
kubectl create configmap -n "$ns" public-keys --from-file=jwks.json="$keys/public.jwks.json" >/dev/null

kubectl apply -n "$ns" -f - >/dev/null <<YAML || fail "the ProxyDeployment was refused"
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata:
  name: auth
spec:
  replicas: 2
  listeners:
    - {name: https, port: 8443, servicePort: 443, hostnames: [auth.example.com]}
  routes:
    - name: api
      match: {pathPrefix: /api}
      upstream: echo
      jwt:
        issuer: https://issuer.e2e
        audiences: [shop]
        jwksSecret: api-keys
        claimHeaders: [{claim: sub, header: x-user}, {claim: email, header: x-email}]
      cors:
        allowOrigins: ["https://app.example.com", "https://*.shop.example"]
        allowMethods: [GET, PUT]
        allowHeaders: [authorization, content-type]
        allowCredentials: true
        maxAge: 10m
    - name: partner
      match: {pathPrefix: /partner}
      upstream: echo
      jwt: {issuer: https://issuer.e2e, audiences: [partner], jwksConfigMap: public-keys, forwardToken: true}
    - {name: open, upstream: echo}
  upstreams:
    - {name: echo, endpoints: ["$node_ip:18770"]}
  limits: {escapedSlashes: reject, mergeSlashes: true}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/auth --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" auth -o yaml >&2; fail "auth fleet never Ready"; }

ip=$(kubectl get svc -n "$ns" auth -o jsonpath='{.spec.clusterIP}')
ca=$(mktemp)
kubectl get secret -n "$ns" auth-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"
req() { curl -sS --max-time 5 --cacert "$ca" --resolve "auth.example.com:443:$ip" "$@"; }
code() { req -o /dev/null -w '%{http_code}' "$@"; }
retry 30 req -f https://auth.example.com/open -o /dev/null

say "valid ES256, RS256 and EdDSA tokens pass, with their claims forwarded and the token removed"
for kid in es-1 rs-1 ed-1; do
  body=$(req -f -H "Authorization: Bearer $(peer token "$keys" $kid 300)" -H 'x-user: mallory' https://auth.example.com/api/orders) \
    || fail "a valid $kid token was refused"
  <<<"$body" grep -q '"x-user": "alice"' || fail "$kid: the sub claim was not forwarded: $body"
  <<<"$body" grep -q '"x-email": "alice@example.com"' || fail "$kid: the email claim was not forwarded: $body"
  <<<"$body" grep -qi '"authorization"' && fail "$kid: the token reached the upstream: $body"
done

say "refusals: 401 with WWW-Authenticate, and why"
out=$(req -D - -o /dev/null https://auth.example.com/api/orders)
<<<"$out" head -1 | grep -q ' 401' || fail "no token was not refused: $out"
<<<"$out" grep -qi '^www-authenticate: Bearer realm="api"' || fail "no WWW-Authenticate: $out"
for case in "expired:$(peer token "$keys" es-1 -300)" "wrong audience:$(peer token "$keys" es-1 300 other)" \
            "unknown key:$(peer token "$keys" es-2 300)" "garbage:not.a.token"; do
  name=${case%%:*}; token=${case#*:}
  out=$(req -D - -o /dev/null -H "Authorization: Bearer $token" https://auth.example.com/api/orders)
  <<<"$out" head -1 | grep -q ' 401' || fail "$name token was not refused: $out"
  <<<"$out" grep -qi 'error="invalid_token"' || fail "$name: no invalid_token in the challenge: $out"
done
[ "$(code https://auth.example.com/anything)" = 200 ] || fail "a route without jwt needs no token"

say "paths spelt otherwise are routed as an upstream reads them (so the JWT check holds), or refused"
for path in //api/orders /%61pi/orders '/x/..;/api/orders' /x/%2e%2e/api/orders; do
  [ "$(code --path-as-is "https://auth.example.com$path")" = 401 ] || fail "$path passed the /api route's JWT check"
done
[ "$(code --path-as-is 'https://auth.example.com/open%2F..%2Fapi/orders')" = 400 ] \
  || fail "an escaped slash was not refused (limits.escapedSlashes: reject)"
body=$(req -f --path-as-is 'https://auth.example.com//open//x') || fail "a merged path was refused"
<<<"$body" grep -q '":path": "/open/x"' || fail "the upstream did not get the merged path: $body"

say "a key set from a ConfigMap, token forwarded when asked"
body=$(req -f -H "Authorization: Bearer $(peer token "$keys" ed-9 300 partner)" https://auth.example.com/partner/x) \
  || fail "a valid token for the ConfigMap key set was refused"
<<<"$body" grep -qi '"authorization": "Bearer ' || fail "forwardToken: the token did not reach the upstream: $body"
[ "$(code -H "Authorization: Bearer $(peer token "$keys" es-1 300 partner)" https://auth.example.com/partner/x)" = 401 ] \
  || fail "the Secret's key was accepted on the ConfigMap's route"

say "CORS: preflight answered by the proxy, headers on the answer, other origins refused"
out=$(req -D - -o /dev/null -X OPTIONS -H 'Origin: https://app.example.com' -H 'Access-Control-Request-Method: PUT' \
      -H 'Access-Control-Request-Headers: authorization' https://auth.example.com/api/orders)
<<<"$out" head -1 | grep -q ' 204' || fail "preflight not answered with 204: $out"
for h in 'access-control-allow-origin: https://app.example.com' 'access-control-allow-methods: GET, PUT' \
         'access-control-allow-credentials: true' 'access-control-max-age: 600'; do
  <<<"$out" grep -qi "^$h" || fail "preflight lacks '$h': $out"
done
out=$(req -D - -o /dev/null -X OPTIONS -H 'Origin: https://evil.example' -H 'Access-Control-Request-Method: PUT' https://auth.example.com/api/orders)
<<<"$out" head -1 | grep -q ' 403' || fail "a preflight from another origin was not refused: $out"
out=$(req -D - -o /dev/null -H 'Origin: https://eu.shop.example' -H "Authorization: Bearer $(peer token "$keys" es-1 300)" https://auth.example.com/api/orders)
<<<"$out" grep -qi '^access-control-allow-origin: https://eu.shop.example' || fail "no CORS headers for a wildcard origin: $out"
out=$(req -D - -o /dev/null -H 'Origin: https://evil.example' -H "Authorization: Bearer $(peer token "$keys" es-1 300)" https://auth.example.com/api/orders)
<<<"$out" grep -qi '^access-control-allow-origin' && fail "the upstream's * reached another origin: $out"

say "key rotation: the Secret's key set replaced, picked up without a rollout"
pods_before=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=auth -o jsonpath='{.items[*].metadata.name}')
kubectl create secret generic -n "$ns" api-keys --from-file=jwks.json="$keys/second.jwks.json" --dry-run=client -o yaml \
  | kubectl apply -f - >/dev/null
t0=$(date +%s)
new=$(peer token "$keys" es-2 600)
old=$(peer token "$keys" es-1 300)
# Each pod on its own address: through the Service, six requests could all reach the one pod
# that has reloaded, and the next one the pod that has not (kubelet refreshes each pod's Secret
# volume on its own schedule).
pod_ips=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=auth -o jsonpath='{.items[*].status.podIP}')
at_pod() { local pod_ip=$1; shift
  curl -sS --max-time 5 --cacert "$ca" --resolve "auth.example.com:8443:$pod_ip" -o /dev/null -w '%{http_code}' "$@" https://auth.example.com:8443/api/x; }
rotated() { for p in $pod_ips; do [ "$(at_pod "$p" -H "Authorization: Bearer $new")" = 200 ] || return 1; done; }
retry 120 rotated
say "the new key was accepted by every pod $(( $(date +%s) - t0 ))s after the Secret changed"
for p in $pod_ips; do
  [ "$(at_pod "$p" -H "Authorization: Bearer $old")" = 401 ] || fail "the removed key still works on pod $p"
done
pods_after=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=auth -o jsonpath='{.items[*].metadata.name}')
[ "$pods_before" = "$pods_after" ] || fail "the rotation rolled the pods ($pods_before -> $pods_after)"

say "metrics: denials by reason"
pod=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=auth -o jsonpath='{.items[0].status.podIP}')
# Read whole first: `grep -q` leaves at the first match, and curl, still writing, would fail.
metrics=$(curl -fsS --max-time 5 "http://$pod:9901/metrics") || fail "no metrics from $pod"
<<<"$metrics" grep -q '^proxyfleet_jwt_denied_requests_total{route="api",reason=' || fail "no jwt denial metric"

say "bad specs refused at admission, naming the field"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-jwt}
spec:
  listeners: [{name: https, port: 8443}]
  routes: [{name: r, upstream: u, jwt: {jwksFile: /etc/proxyfleet/tls/tls.key}}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "a jwksFile in a ProxyDeployment was accepted"
<<<"$out" grep -q 'spec.routes\[0\].jwt: Invalid value.*jwksFile is for the standalone proxy' || fail "unexpected refusal: $out"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-cors}
spec:
  listeners: [{name: https, port: 8443}]
  routes: [{name: r, upstream: u, cors: {allowOrigins: ["*"], allowCredentials: true}}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "CORS credentials with * was accepted"
<<<"$out" grep -q 'spec.routes\[0\].cors: Invalid value.*allowCredentials cannot be used with the \* origin' || fail "unexpected refusal: $out"

say "a missing key set is reported in status, naming the field"
kubectl patch -n "$ns" pxd/auth --type=json -p '[{"op":"replace","path":"/spec/routes/1/jwt/jwksConfigMap","value":"nope"}]' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns auth -o jsonpath='{.status.conditions[*].message}' | grep -q 'spec.routes\[1\].jwt.jwksConfigMap: ConfigMap nope not found'"
[ "$(code -H "Authorization: Bearer $new" https://auth.example.com/api/x)" = 200 ] || fail "the fleet stopped serving on a bad spec"
rm -f "$ca"
say "JWT and CORS passed"
