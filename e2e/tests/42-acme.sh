#!/usr/bin/env bash
# ACME built into the fleet, against Pebble (Let's Encrypt's test server, built from the Go
# module proxy and run on this machine): a fleet with spec.tls.acme gets its certificate over
# HTTP-01 answered by its own proxies through its own Service, serves it (verified against
# Pebble's root), renews it under load with zero failed requests; a hostname Pebble cannot
# validate ends in CertificatesReady=False with Pebble's error quoted while the old
# certificate keeps serving.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"
. "$root/e2e/lib/versions.sh"
. "$root/e2e/lib/pebble.sh"

install_operator
ns=$(test_namespace e2e-acme)
trap 'pkill -f "proxyfleet-loadgen.*/tmp/acme-" 2>/dev/null || true; stop_pebble; kubectl delete ns e2e-acme --wait=false >/dev/null 2>&1 || true' EXIT
# Leaves of 3 minutes: renewed at two thirds, about every 2 minutes.
start_pebble 180
kubectl create secret generic -n "$ns" pebble-https --from-file=ca.crt="$PEBBLE_DIR/ca.crt" >/dev/null
awk '/^kind: ProxyDeployment/{exit} {print}' "$root/examples/basic.yaml" | sed '$d' | kubectl apply -n "$ns" -f - >/dev/null
kubectl apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: shop}
spec:
  replicas: 2
  listeners:
    - {name: https, port: 8443, servicePort: 443, hostnames: [shop.example.com]}
    - {name: http, port: 8080, servicePort: 80, protocol: HTTP, hostnames: [shop.example.com]}
  routes:
    - {name: all, match: {pathPrefix: /}, upstream: echo, timeout: 5s}
  upstreams:
    - name: echo
      dns: {name: echo.$ns.svc.cluster.local, port: 8080, refreshInterval: 2s}
  tls:
    acme:
      directory: https://$PEBBLE_NODE_IP:14000/dir
      email: platform@example.com
      directoryCaSecret: pebble-https
YAML
retry 60 kubectl get svc -n "$ns" shop
ip=$(kubectl get svc -n "$ns" shop -o jsonpath='{.spec.clusterIP}')
pebble_point "$ip"
t0=$(date +%s)
cond() { kubectl get pxd -n "$ns" shop -o jsonpath='{.status.conditions[?(@.type=="CertificatesReady")].reason}: {.status.conditions[?(@.type=="CertificatesReady")].message}'; }
retry 240 bash -c "kubectl get pxd -n $ns shop -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -qx Issued" \
  || { cond >&2; fail "no ACME certificate"; }
say "issued over HTTP-01 in $(( $(date +%s) - t0 ))s from the fleet's creation: $(cond)"
kubectl get events -n "$ns" --field-selector involvedObject.name=shop -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | grep -E "Acme|CertificateIssued" | sed 's/^/    /' >&2
root_ca=$PEBBLE_DIR/root.pem
all_verify() { for _ in $(seq 20); do curl -fs -o /dev/null --max-time 5 --cacert "$root_ca" --resolve "shop.example.com:443:$ip" https://shop.example.com/ || return 1; done; }
retry 150 all_verify
served() { curl -s -o /dev/null --max-time 5 --cacert "$root_ca" --resolve "shop.example.com:443:$ip" -w '%{certs}' https://shop.example.com/ | openssl x509 -noout "$@" 2>/dev/null || true; }
say "serving $(served -issuer) (verified against Pebble's root)"
served -ext subjectAltName | grep -q "DNS:shop.example.com" || fail "the served certificate does not name shop.example.com"

say "renewal under load (new connections every 10 requests)"
"$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen" --url https://shop.example.com/ --connect "$ip:443" --ca "$root_ca" \
  --rate 30 --workers 3 --new-conn-every 10 --duration 200s --summary /tmp/acme-load.json >/dev/null 2>/tmp/acme-load.err &
LOAD=$!
serials=(); changes=(); t1=$(date +%s)
while [ $(( $(date +%s) - t1 )) -lt 195 ]; do
  s=$(served -serial | cut -d= -f2)
  if [ -n "$s" ] && { [ ${#serials[@]} = 0 ] || [ "${serials[-1]}" != "$s" ]; }; then
    serials+=("$s"); changes+=("$(( $(date +%s) - t1 ))s"); say "serving serial $s (t=${changes[-1]})"
  fi
  sleep 3
done
wait $LOAD
say "load: $(cat /tmp/acme-load.json); serial changes at: ${changes[*]}"
[ ${#serials[@]} -ge 2 ] || fail "expected a renewal, saw serials: ${serials[*]}"
grep -q '"status_5xx": 0, "errors": 0' /tmp/acme-load.json || { tail -5 /tmp/acme-load.err >&2; fail "requests failed during the ACME renewal"; }
restarts=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=shop -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}')
<<<"$restarts" grep -q '[1-9]' && fail "proxy pods restarted during renewal: $restarts"

say "a hostname Pebble cannot validate (it resolves to an address where nothing answers)"
pebble_point_name nowhere.example.com 127.0.0.1
before=$(served -serial)
kubectl patch -n "$ns" pxd/shop --type=json -p '[{"op":"add","path":"/spec/listeners/0/hostnames/-","value":"nowhere.example.com"}]' >/dev/null
retry 180 bash -c "kubectl get pxd -n $ns shop -o jsonpath='{.status.conditions[?(@.type==\"CertificatesReady\")].reason}' | grep -qx AcmeOrderFailed" \
  || { cond >&2; fail "the failed order is not reported"; }
msg=$(cond)
say "in status: $msg"
<<<"$msg" grep -q "nowhere.example.com" || fail "the failure does not name the hostname"
<<<"$msg" grep -qiE "connection refused|connect" || fail "Pebble's error is not quoted"
kubectl get pxd -n "$ns" shop -o jsonpath='{.status.acme.nextAttemptTime}' | grep -q T || fail "no backoff recorded in status.acme"
retry 60 all_verify
[ "$(served -serial)" = "$before" ] || say "note: serial changed from $before to $(served -serial) (a renewal was already due)"
say "the previous certificate keeps serving ($(served -serial)); backoff until $(kubectl get pxd -n "$ns" shop -o jsonpath='{.status.acme.nextAttemptTime}')"
kubectl get secret -n "$ns" shop-acme-account >/dev/null || fail "the ACME account is not kept in shop-acme-account"
kubectl get secret -n "$ns" shop-acme-account -o jsonpath='{.metadata.ownerReferences[0].name}' | grep -qx shop || fail "the account Secret is not owned by the fleet"
say "ok"
