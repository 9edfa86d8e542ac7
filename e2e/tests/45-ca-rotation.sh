#!/usr/bin/env bash
# A full managed-CA rotation on the real cluster, under continuous HTTPS load through the Service
# from clients given the published trust bundle: one client opening a new connection every 10
# requests, one keeping its connections for the whole run. Every phase is observed; zero failed
# requests; at the end new connections verify with the new CA alone and the old CA is dropped. A
# fleet on a user's Secret in the same namespace does not hold the rotation.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-ca)
trap 'pkill -f "proxyfleet-loadgen.*ca-rot" 2>/dev/null || true; kubectl delete ns e2e-ca --wait=false >/dev/null 2>&1 || true' EXIT
sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/" "$root/examples/basic.yaml" | kubectl apply -n "$ns" -f - >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "demo not Ready"
ip=$(kubectl get svc -n "$ns" demo -o jsonpath='{.spec.clusterIP}')
# Pods Ready precedes kube-proxy programming the Service by a moment: wait until it answers.
retry 30 curl -fsS --max-time 3 -k --resolve "demo.example.com:443:$ip" https://demo.example.com/
secret_key() { kubectl get secret -n "$ns" "$1" -o json | jq -r --arg k "$2" '.data[$k] // empty' | base64 -d; }
# A fleet of the same namespace serving a user's Secret (its ca.crt: the old CA alone, never the
# new bundle): its pod loads a trust bundle too, but is not on the managed CA, so the rotation
# must not wait for it.
kubectl get secret -n "$ns" demo-tls -o json | jq '.metadata={name:"own-cert"}' | kubectl apply -n "$ns" -f - >/dev/null
kubectl apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: own}
spec:
  replicas: 1
  listeners: [{name: https, port: 8443, servicePort: 443, hostnames: [own.example.com]}]
  routes: [{name: all, match: {pathPrefix: /}, upstream: echo}]
  upstreams: [{name: echo, dns: {name: echo.$ns.svc.cluster.local, port: 8080}}]
  tls: {secretName: own-cert}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/own --timeout=180s >/dev/null || fail "own not Ready"
old_serial=$(secret_key proxyfleet-ca ca.crt | openssl x509 -noout -serial | cut -d= -f2)
# Every step of the rotation is one write of the CA Secret's phase annotation: a watch sees
# each, however briefly it lasts (sampling the fleet's status once a second missed a
# WaitingForBundle that lasted under a second: the pods had loaded the bundle already).
kubectl get secret -n "$ns" proxyfleet-ca --watch \
  -o jsonpath='{.metadata.annotations.proxyfleet\.io/ca-rotation-phase}{"\n"}' >/tmp/ca-rot-phases.txt 2>/dev/null &
PHASE_WATCH=$!
trap 'kill $PHASE_WATCH 2>/dev/null || true; pkill -f "proxyfleet-loadgen.*ca-rot" 2>/dev/null || true; kubectl delete ns e2e-ca --wait=false >/dev/null 2>&1 || true' EXIT
sleep 1
say "CA serial $old_serial; requesting a rotation (overlap 40s)"
"$PLUGIN" rotate-ca -n "$ns" --overlap 40s >/dev/null || fail "kubectl proxyfleet rotate-ca failed"
t0=$(date +%s)
retry 60 bash -c "kubectl get secret -n $ns demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d | grep -c 'BEGIN CERTIFICATE' | grep -qx 2"
secret_key demo-tls ca.crt > /tmp/ca-rot-bundle.crt
say "bundle with old + new CA published after $(( $(date +%s) - t0 ))s; clients get it now"

run_load() { # NAME NEW_CONN_EVERY RATE WORKERS
  "$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen" --url https://demo.example.com/ --connect "$ip:443" --ca /tmp/ca-rot-bundle.crt \
    --rate "$3" --workers "$4" --new-conn-every "$2" --duration 170s --summary "/tmp/ca-rot-$1.json" >/dev/null 2>"/tmp/ca-rot-$1.err" &
}
run_load churn 10 30 3; CHURN=$!
run_load longlived 1000000 10 2; LONG=$!

phases=(); last=""
while [ $(( $(date +%s) - t0 )) -lt 165 ]; do
  p=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.caRotation.phase}' 2>/dev/null || true)
  if [ -n "$p" ] && [ "$p" != "$last" ]; then
    phases+=("$p@$(( $(date +%s) - t0 ))s"); last=$p
    say "phase $p (t=$(( $(date +%s) - t0 ))s): $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.caRotation.message}')"
  fi
  [ "$p" = Stable ] && [ ${#phases[@]} -gt 1 ] && break
  sleep 1
done
say "phases: ${phases[*]}"
wait $CHURN; wait $LONG
say "churning clients: $(cat /tmp/ca-rot-churn.json)"
say "long-lived clients: $(cat /tmp/ca-rot-longlived.json)"
kill $PHASE_WATCH 2>/dev/null || true
written=$(awk 'NF && $0 != prev {printf "%s ", $0; prev = $0}' /tmp/ca-rot-phases.txt)
say "phases written to the CA Secret: $written"
for p in PublishingBundle WaitingForBundle Reissuing Overlap Stable; do
  [[ " $written " == *" $p "* ]] || fail "phase $p never written (CA Secret: $written; fleet status: ${phases[*]})"
done
[[ "$written" == *"PublishingBundle WaitingForBundle Reissuing Overlap Stable"* ]] || fail "phases out of order: $written"
for p in Overlap Stable; do
  [[ " ${phases[*]} " == *" $p@"* ]] || fail "phase $p not shown in the fleet's status (saw: ${phases[*]})"
done
for f in churn longlived; do
  grep -q '"status_5xx": 0, "errors": 0' "/tmp/ca-rot-$f.json" || { tail -5 "/tmp/ca-rot-$f.err" >&2; fail "$f clients saw failures during the CA rotation"; }
done

secret_key proxyfleet-ca ca.crt > /tmp/ca-rot-new.crt
new_serial=$(openssl x509 -noout -serial -in /tmp/ca-rot-new.crt | cut -d= -f2)
[ "$new_serial" != "$old_serial" ] || fail "the CA did not change"
[ "$(secret_key proxyfleet-ca bundle.crt | grep -c 'BEGIN CERTIFICATE')" = 1 ] || fail "the old CA is still in the bundle"
[ -z "$(secret_key proxyfleet-ca previous.crt)" ] || fail "previous.crt not dropped"
retry 60 curl -fsS --max-time 5 --cacert /tmp/ca-rot-new.crt --resolve "demo.example.com:443:$ip" https://demo.example.com/
say "new connections verify with the new CA ($new_serial) alone; the old CA ($old_serial) is dropped"
