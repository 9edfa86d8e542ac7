#!/usr/bin/env bash
# Certificates on the real cluster: managed leaf rotation under continuous HTTPS load with zero
# failed requests, new connections see the new serial; existing-Secret and cert-manager
# sources; a missing Secret reported with a reason.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-certs)
trap 'pkill -f proxyfleet-loadgen 2>/dev/null || true; kubectl delete ns e2e-certs --wait=false >/dev/null 2>&1 || true' EXIT
# Leaves live 3 minutes and renew 2m10s before expiry: a rotation about every 50 s.
sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/; s/managed: {duration: 2160h}.*/managed: {duration: 3m, renewBefore: 2m10s}/" \
  "$root/examples/basic.yaml" | kubectl apply -n "$ns" -f - >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "demo not Ready"
ip=$(kubectl get svc -n "$ns" demo -o jsonpath='{.spec.clusterIP}')
kubectl get secret -n "$ns" demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > /tmp/certs-ca.crt
served_serial() { # the serial a new connection is served (curl writes out the peer's chain)
  curl -s -o /dev/null --max-time 5 --cacert /tmp/certs-ca.crt --resolve "demo.example.com:443:$ip" -w '%{certs}' https://demo.example.com/ \
    | openssl x509 -noout -serial 2>/dev/null | cut -d= -f2 | tr 'A-F' 'a-f' | sed 's/^0*//' || true
}

# kubectl wait returns when pods are Ready; kube-proxy programs the Service a moment later (until
# then the ClusterIP REJECTs): start the load only once the Service answers.
retry 30 curl -fsS --max-time 3 --cacert /tmp/certs-ca.crt --resolve "demo.example.com:443:$ip" https://demo.example.com/
say "continuous HTTPS load (new connections every 10 requests) while leaves rotate"
"$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen" --url https://demo.example.com/ --connect "$ip:443" --ca /tmp/certs-ca.crt \
  --rate 30 --workers 3 --new-conn-every 10 --duration 170s --summary /tmp/certs-load.json >/dev/null 2>/tmp/certs-load.err &
LOAD=$!
serials=()
t0=$(date +%s)
changes=()
while [ $(( $(date +%s) - t0 )) -lt 165 ]; do
  s=$(served_serial)
  if [ -n "$s" ] && { [ ${#serials[@]} = 0 ] || [ "${serials[-1]}" != "$s" ]; }; then
    serials+=("$s"); changes+=("$(( $(date +%s) - t0 ))s")
    say "serving serial $s (t=${changes[-1]})"
  fi
  sleep 3
done
wait $LOAD
say "load: $(cat /tmp/certs-load.json); serial changes at: ${changes[*]}"
[ ${#serials[@]} -ge 3 ] || fail "expected at least two rotations, saw serials: ${serials[*]}"
grep -q '"status_5xx": 0, "errors": 0' /tmp/certs-load.json || { cat /tmp/certs-load.err | tail -5 >&2; fail "requests failed during rotation"; }
status_serial=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.certificates[?(@.kind=="serving")].serial}' | sed 's/^0*//')
[ "$status_serial" = "${serials[-1]}" ] || say "note: status serial $status_serial, last served ${serials[-1]} (a rotation may be in flight)"
restarts=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=demo -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}')
echo "$restarts" | grep -q '[1-9]' && fail "proxy pods restarted during rotation: $restarts"
say "no proxy restarted"

say "existing Secret source: a missing Secret is reported with a reason"
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"managed":null,"secretName":"does-not-exist"}}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -q SecretNotFound"
https_get "$ns" demo /still | grep -q still || fail "fleet stopped serving while its Secret is missing"
kubectl get secret -n "$ns" demo-tls -o json | jq '.metadata={name:"user-cert"} | .type="kubernetes.io/tls"' | kubectl apply -n "$ns" -f - >/dev/null
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"secretName":"user-cert"}}}' >/dev/null
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -q SecretProvided"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=120s >/dev/null || fail "not Ready on the user's Secret"

say "cert-manager source: the operator creates the Certificate (CRD only, no cert-manager controller)"
kubectl apply -f "$root/e2e/fixtures/cert-manager-certificate-crd.yaml" >/dev/null
retry 30 kubectl get crd certificates.cert-manager.io
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"secretName":null,"certManager":{"issuerRef":{"name":"letsencrypt","kind":"ClusterIssuer"},"duration":"2160h"}}}}' >/dev/null
retry 60 kubectl get certificates.cert-manager.io -n "$ns" demo
cert=$(kubectl get certificates.cert-manager.io -n "$ns" demo -o json)
echo "$cert" | jq -e '.spec.secretName == "demo-tls" and .spec.issuerRef.kind == "ClusterIssuer" and (.spec.dnsNames | index("demo.example.com"))' >/dev/null \
  || fail "Certificate is not what cert-manager needs: $(echo "$cert" | jq -c .spec)"
say "ok"
