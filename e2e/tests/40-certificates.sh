#!/usr/bin/env bash
# Certificates on the real cluster: managed leaf rotation under continuous HTTPS load with zero
# failed requests, new connections see the new serial; existing-Secret source; a missing Secret
# reported with a reason; cert-manager's own controllers: a user's Secret under cert-manager's
# name refused and left as it was, an issuer that does not exist quoted
# in status, a real CA Issuer's certificate served and renewed under load, the switch back to
# the managed CA (the Certificate removed first), the Certificate deleted with the fleet.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"
. "$root/e2e/lib/cert-manager.sh"

install_operator
ns=$(test_namespace e2e-certs)
trap 'pkill -f "proxyfleet-loadgen.*/tmp/certs-" 2>/dev/null || true; stop_cert_manager; kubectl delete ns e2e-certs --wait=false >/dev/null 2>&1 || true' EXIT
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
<<<"$restarts" grep -q '[1-9]' && fail "proxy pods restarted during rotation: $restarts"
say "no proxy restarted"

say "existing Secret source: a missing Secret is reported with a reason"
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"managed":null,"secretName":"does-not-exist"}}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -q SecretNotFound"
https_get "$ns" demo /still | grep -q still || fail "fleet stopped serving while its Secret is missing"
kubectl get secret -n "$ns" demo-tls -o json | jq '.metadata={name:"user-cert"} | .type="kubernetes.io/tls"' | kubectl apply -n "$ns" -f - >/dev/null
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"secretName":"user-cert"}}}' >/dev/null
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -q SecretProvided"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=120s >/dev/null || fail "not Ready on the user's Secret"

say "cert-manager source, with cert-manager's own controllers"
start_cert_manager
cm_reason() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="CertificatesReady")].reason}: {.status.conditions[?(@.type=="CertificatesReady")].message}'; }
# A user's own Secret under the name cert-manager would fill is refused, not overwritten.
kubectl get secret -n "$ns" user-cert -o json | jq '.metadata={name:"demo-cert-manager-tls"}' | kubectl apply -n "$ns" -f - >/dev/null
user_data=$(kubectl get secret -n "$ns" demo-cert-manager-tls -o jsonpath='{.data.tls\.crt}' | sha256sum)
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"secretName":null,"certManager":{"issuerRef":{"name":"nope","kind":"Issuer"}}}}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -qx SecretNotOurs"
say "a user's Secret of that name: $(cm_reason)"
! kubectl get certificates.cert-manager.io -n "$ns" demo >/dev/null 2>&1 || fail "a Certificate was made to fill the user's Secret"
[ "$(kubectl get secret -n "$ns" demo-cert-manager-tls -o jsonpath='{.data.tls\.crt}' | sha256sum)" = "$user_data" ] || fail "the user's Secret was changed"
kubectl delete secret -n "$ns" demo-cert-manager-tls >/dev/null
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].message}' | grep -q 'issuer.cert-manager.io \"nope\" not found'"
say "an issuer that does not exist, in status: $(cm_reason)"
https_get "$ns" demo /still | grep -q still || fail "fleet stopped serving while cert-manager cannot issue"
kubectl get certificates.cert-manager.io -n "$ns" demo -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}' | grep -qx ProxyDeployment/demo \
  || fail "the Certificate is not owned by the fleet"

say "a real CA Issuer (self-signed root from cert-manager); leaves of 3 minutes renewed 2m10s early, under load"
kubectl apply -n "$ns" -f - >/dev/null <<'YAML'
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: selfsigned}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: e2e-root}
spec: {isCA: true, commonName: e2e cert-manager root, secretName: e2e-root, privateKey: {algorithm: ECDSA, size: 256}, issuerRef: {name: selfsigned, kind: Issuer}}
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: e2e-ca}
spec: {ca: {secretName: e2e-root}}
YAML
retry 60 bash -c "kubectl get issuers.cert-manager.io -n $ns e2e-ca -o jsonpath='{.status.conditions[0].status}' | grep -q True"
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"certManager":{"issuerRef":{"name":"e2e-ca","kind":"Issuer"},"duration":"3m","renewBefore":"2m10s"}}}}' >/dev/null
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -qx Issued"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "not Ready on cert-manager's certificate"
kubectl get secret -n "$ns" e2e-root -o jsonpath='{.data.tls\.crt}' | base64 -d > /tmp/certs-ca.crt
# The switch of source is a rollout: until the old pods are gone some connections still get
# the previous source's certificate. Start the load once 20 new connections in a row verify.
kubectl rollout status -n "$ns" deploy/demo --timeout=120s >/dev/null || fail "rollout to cert-manager's Secret did not finish"
all_verify() { for _ in $(seq 20); do curl -fs -o /dev/null --max-time 5 --cacert "$1" --resolve "demo.example.com:443:$ip" https://demo.example.com/ || return 1; done; }
retry 90 all_verify /tmp/certs-ca.crt
say "serving cert-manager's certificate (issuer: e2e cert-manager root); $(cm_reason)"
kubectl get secret -n "$ns" demo-cert-manager-tls -o jsonpath='{.metadata.labels.proxyfleet\.io/proxydeployment}' | grep -qx demo \
  || fail "cert-manager's Secret does not carry the fleet's labels (the Certificate's secretTemplate)"
"$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen" --url https://demo.example.com/ --connect "$ip:443" --ca /tmp/certs-ca.crt \
  --rate 30 --workers 3 --new-conn-every 10 --duration 130s --summary /tmp/certs-cm-load.json >/dev/null 2>/tmp/certs-cm-load.err &
LOAD=$!
serials=(); changes=(); t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt 125 ]; do
  s=$(served_serial)
  if [ -n "$s" ] && { [ ${#serials[@]} = 0 ] || [ "${serials[-1]}" != "$s" ]; }; then
    serials+=("$s"); changes+=("$(( $(date +%s) - t0 ))s"); say "serving serial $s (t=${changes[-1]})"
  fi
  sleep 3
done
wait $LOAD
say "load: $(cat /tmp/certs-cm-load.json); serial changes at: ${changes[*]}"
[ ${#serials[@]} -ge 2 ] || fail "cert-manager's renewal never reached the fleet, serials: ${serials[*]}"
grep -q '"status_5xx": 0, "errors": 0' /tmp/certs-cm-load.json || { tail -5 /tmp/certs-cm-load.err >&2; fail "requests failed while cert-manager renewed"; }

say "back to the managed CA: the fleet's Certificate is removed"
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"certManager":null,"managed":{"duration":"2160h"}}}}' >/dev/null
retry 60 bash -c "! kubectl get certificates.cert-manager.io -n $ns demo >/dev/null 2>&1"
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].message}' | grep -q 'managed CA'"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "not Ready back on the managed CA"
kubectl get secret -n "$ns" demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > /tmp/certs-managed-ca.crt
kubectl rollout status -n "$ns" deploy/demo --timeout=120s >/dev/null || fail "rollout back to the managed Secret did not finish"
retry 90 all_verify /tmp/certs-managed-ca.crt
first=$(curl -s -o /dev/null --max-time 5 --cacert /tmp/certs-managed-ca.crt --resolve "demo.example.com:443:$ip" -w '%{certs}' https://demo.example.com/ | openssl x509 -noout -issuer)
mounted=$(kubectl get deploy -n "$ns" demo -o json | jq -r '.spec.template.spec.volumes[] | select(.secret.secretName // "" | test("tls$")) | .secret.secretName' | sort -u | tr '\n' ' ')
[ "$mounted" = "demo-tls " ] || fail "the fleet mounts $mounted, want demo-tls only"
say "managed again (served by $first; mounts $mounted); cert-manager kept to its own Secret demo-cert-manager-tls"

say "deleting the fleet removes the Certificate it owned"
kubectl patch -n "$ns" pxd/demo --type=merge -p '{"spec":{"tls":{"managed":null,"certManager":{"issuerRef":{"name":"e2e-ca","kind":"Issuer"}}}}}' >/dev/null
retry 60 kubectl get certificates.cert-manager.io -n "$ns" demo
kubectl delete pxd -n "$ns" demo --wait=true --timeout=60s >/dev/null
retry 60 bash -c "! kubectl get certificates.cert-manager.io -n $ns demo >/dev/null 2>&1"
say "ok"
