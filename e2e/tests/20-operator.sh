#!/usr/bin/env bash
# The operator core on the real cluster: helm install, a ProxyDeployment serving HTTPS,
# scale and route changes rolled out, zero writes on a no-op resync, bad input refused or
# reported, leader failover, deletion garbage-collects everything owned.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
kubectl apply --dry-run=server -f "$root/examples/" >/dev/null || fail "an example in examples/ is refused by the API server"
# The README's annotated ProxyDeployment (its first yaml block) must be accepted as written.
awk '/^```yaml$/ {on = 1; next} on && /^```$/ {exit} on' "$root/README.md" > /tmp/readme-pxd.yaml
grep -q '^kind: ProxyDeployment' /tmp/readme-pxd.yaml || fail "no ProxyDeployment yaml block in README.md"
kubectl apply --dry-run=server -n default -f /tmp/readme-pxd.yaml >/dev/null || fail "the README's ProxyDeployment is refused by the API server"
say "every example in examples/ passes server-side validation"
ns=$(test_namespace e2e-operator)
trap 'kubectl delete ns e2e-operator --wait=false >/dev/null 2>&1 || true' EXIT

t0=$(date +%s%N)
apply_example "$ns"
retry 60 kubectl get deploy -n "$ns" demo
t1=$(date +%s%N)
say "reconcile latency apply → Deployment created: $(( (t1 - t0) / 1000000 )) ms"
say "waiting for pxd/demo Ready"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" demo -o yaml >&2; fail "demo never Ready"; }
kubectl get pxd -n "$ns"

say "HTTPS through the Service, verified against the managed CA"
retry 30 https_get "$ns" demo /hello
https_get "$ns" demo /hello | grep -q "GET /hello" || fail "unexpected answer"

say "pods are locked down"
pod=pod/$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=demo -o jsonpath="{.items[0].metadata.name}")
kubectl get -n "$ns" "$pod" -o jsonpath='{.spec.containers[0].securityContext.readOnlyRootFilesystem} {.spec.securityContext.runAsNonRoot} {.spec.securityContext.seccompProfile.type}' | grep -q "true true RuntimeDefault" || fail "pod security settings missing"

say "zero writes on a no-op resync"
sleep 5
before=$(operator_metric '^proxyfleet_operator_api_writes_total')
kubectl annotate -n "$ns" pxd/demo e2e/nudge="$(date +%s)" --overwrite >/dev/null   # a reconcile with nothing to do
sleep 8
after=$(operator_metric '^proxyfleet_operator_api_writes_total')
say "API writes during a no-op reconcile: $((after - before))"
[ "$((after - before))" = 0 ] || fail "no-op reconcile wrote $((after - before)) times"

say "kubectl scale pxd (scale subresource)"
kubectl scale -n "$ns" pxd/demo --replicas=3 >/dev/null
retry 120 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.readyReplicas}')\" = 3 ]"

say "a route change rolls the pods to a new ConfigMap"
old_hash=$(kubectl get deploy -n "$ns" demo -o jsonpath='{.spec.template.metadata.annotations.proxyfleet\.io/config-hash}')
kubectl patch -n "$ns" pxd/demo --type=json -p '[{"op":"replace","path":"/spec/routes/0/timeout","value":"7s"}]' >/dev/null
retry 60 bash -c "[ \"\$(kubectl get deploy -n $ns demo -o jsonpath='{.spec.template.metadata.annotations.proxyfleet\.io/config-hash}')\" != $old_hash ]"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "not Ready after the route change"
retry 60 bash -c "[ \$(kubectl get cm -n $ns -l proxyfleet.io/proxydeployment=demo -o name | wc -l) = 1 ]"
https_get "$ns" demo /after-change | grep -q "GET /after-change" || fail "not serving after the change"

say "bad input refused at admission, naming the field"
bad=0
while IFS=$'\t' read -r f want; do
  out=$(kubectl apply -n "$ns" -f "$root/e2e/bad-input/$f.yaml" 2>&1) && { bad=1; say "accepted: $f"; continue; }
  <<<"$out" grep -qF -- "$want" || { bad=1; say "$f: message lacks '$want': $out"; }
done < "$root/e2e/bad-input/expected.txt"
[ "$bad" = 0 ] || fail "some malformed manifests were not refused as expected"
say "$(wc -l < "$root/e2e/bad-input/expected.txt") malformed manifests refused"

say "a spec admission cannot judge ends Degraded with a reason, and loses nothing"
kubectl patch -n "$ns" pxd/demo --type=json -p '[{"op":"replace","path":"/spec/upstreams/0","value":{"name":"echo","endpoints":["not a host port"]}}]' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Degraded\")].reason}' | grep -q InvalidSpec"
kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="Degraded")].message}' | grep -q 'spec.upstreams\[0\].endpoints\[0\]' || fail "Degraded message does not name the field"
https_get "$ns" demo /still-serving | grep -q still-serving || fail "fleet stopped serving after a bad spec"
kubectl get pods -n proxyfleet-system -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}' | grep -qv '[1-9]' || fail "operator restarted"
kubectl patch -n "$ns" pxd/demo --type=json -p '[{"op":"replace","path":"/spec/upstreams/0","value":{"name":"echo","dns":{"name":"echo.'"$ns"'.svc.cluster.local","port":8080}}}]' >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=120s >/dev/null || fail "not Ready after the fix"

say "leader failover"
leader=$(leader_pod)
kubectl delete pod -n proxyfleet-system "$leader" --wait=false >/dev/null
t0=$(date +%s)
retry 60 bash -c "l=\$(kubectl get lease -n proxyfleet-system proxyfleet-operator -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$l\" ] && [ \"\$l\" != $leader ]"
kubectl scale -n "$ns" pxd/demo --replicas=2 >/dev/null
retry 60 bash -c "[ \"\$(kubectl get deploy -n $ns demo -o jsonpath='{.spec.replicas}')\" = 2 ]"
say "new leader reconciled a change $(( $(date +%s) - t0 ))s after the old one was killed"
# The lease lasts 15 s: a successor this soon means the old leader gave it up on SIGTERM.
[ $(( $(date +%s) - t0 )) -le 12 ] || fail "failover took over 12s: the old leader did not give its lease up"

say "deleting the ProxyDeployment removes everything it owned"
kubectl delete -n "$ns" pxd/demo --wait=true >/dev/null
retry 90 bash -c "[ -z \"\$(kubectl get deploy,svc,cm,sa,pdb,secret -n $ns -l proxyfleet.io/proxydeployment=demo -o name)\" ]"
kubectl get deploy -n "$ns" echo >/dev/null || fail "the user's own echo Deployment was deleted"
say "ok"
