#!/usr/bin/env bash
# Propagation on real control planes: the main cluster is the hub (its operator is the helm
# release); two member control planes (e2e/cluster up --name member-N --control-plane-only) run
# their own operator as a process. member-1 is registered with our Secret format, member-2 with
# Argo CD's. Checks: exact spec + override in each member, per-cluster status, latency, drift
# revert, a member API server stopped and restarted, selection by label (Delete and Orphan),
# bad overrides applying nothing, and deletion through the finalizer. Tenancy: the fleet is
# created by a ServiceAccount bound to its namespace only (kubectl --as); a cluster whose Secret
# does not admit that namespace gets nothing, and a CA Secret the member already had is never
# overwritten (reported in status.clusters[].message).
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-prop)
members=(member-1 member-2)
mk() { kubectl --kubeconfig "/var/lib/proxyfleet/clusters/$1/admin.kubeconfig" "${@:2}"; }
MEMBER_PIDS=()
cleanup() {
  [ -n "${E2E_KEEP:-}" ] && return 0   # leave everything up for debugging
  # The hub object first, while members still answer (its finalizer cleans them up).
  kubectl delete pxd -n e2e-prop --all --timeout=30s >/dev/null 2>&1 || true
  for p in "${MEMBER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  kubectl delete ns e2e-prop --wait=false >/dev/null 2>&1 || true
  kubectl delete secret -n proxyfleet-system member-1 --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete ns argocd --wait=false >/dev/null 2>&1 || true
  for m in "${members[@]}"; do "$root/e2e/cluster" down --name "$m" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

for i in 1 2; do
  m=member-$i
  "$root/e2e/cluster" up --name "$m" --control-plane-only >/dev/null 2>&1 || fail "could not start $m"
  mk "$m" apply -f "$root/crds/" >/dev/null
  # Established, not just present: an operator started before that exits ("cannot list").
  retry 30 mk "$m" get crd proxydeployments.proxyfleet.io
  retry 60 mk "$m" wait --for=condition=Established crd/proxydeployments.proxyfleet.io --timeout=10s
  KUBECONFIG=/var/lib/proxyfleet/clusters/$m/admin.kubeconfig RUST_LOG=info,kube=warn \
    "$CARGO_TARGET_DIR_RELEASE/proxyfleet-operator" --metrics-addr "127.0.0.1:1809$i" --log-format text \
    --clusters-namespace proxyfleet-system >"/tmp/operator-$m.log" 2>&1 &
  MEMBER_PIDS+=($!)
done
sleep 2
for i in 1 2; do
  kill -0 "${MEMBER_PIDS[$((i - 1))]}" 2>/dev/null || { tail -3 "/tmp/operator-member-$i.log" >&2; fail "member-$i's operator exited"; }
done
say "members up; their operators run as processes (pids ${MEMBER_PIDS[*]})"

# The hub reaches members at the bridge address (its operator runs in a pod).
# Credentials inline (--flatten): kubeconfigs that read files are refused by the operator.
kubeconfig_for_hub() {
  kubectl --kubeconfig "/var/lib/proxyfleet/clusters/$1/admin.kubeconfig" config view --raw --flatten --minify \
    | sed "s#https://127.0.0.1:#https://10.244.0.1:#"
}
kubectl create secret generic member-1 -n proxyfleet-system --from-file=kubeconfig=<(kubeconfig_for_hub member-1) \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label secret -n proxyfleet-system member-1 proxyfleet.io/cluster=true env=e2e region=eu --overwrite >/dev/null
kubectl annotate secret -n proxyfleet-system member-1 proxyfleet.io/allowed-namespaces="other-team, $ns" --overwrite >/dev/null
# member-2 in Argo CD's format. Argo CD import is off by default; this test turns it on.
kubectl create ns argocd --dry-run=client -o yaml | kubectl apply -f - >/dev/null
helm upgrade proxyfleet "$root/charts/proxyfleet" -n proxyfleet-system --reuse-values \
  --set multicluster.argocdNamespace=argocd --wait --timeout 180s >/dev/null || fail "helm upgrade (argocd import) failed"
retry 120 kubectl rollout status -n proxyfleet-system deploy/proxyfleet-operator --timeout=5s
retry 60 bash -c "kubectl get lease -n proxyfleet-system proxyfleet-operator -o jsonpath='{.spec.holderIdentity}' | grep -q ."
m2=$(kubeconfig_for_hub member-2)
field() { <<<"$m2" awk -v k="$1:" '$1 == k {print $2; exit}'; }
argo_config=$(jq -cn --arg ca "$(field certificate-authority-data)" --arg cert "$(field client-certificate-data)" \
  --arg key "$(field client-key-data)" '{tlsClientConfig: {insecure: false, caData: $ca, certData: $cert, keyData: $key}}')
kubectl create secret generic member-2 -n argocd --from-literal=name=member-2 --from-literal=server="$(field server)" \
  --from-literal=config="$argo_config" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label secret -n argocd member-2 argocd.argoproj.io/secret-type=cluster env=e2e region=us --overwrite >/dev/null
# member-2 admits no namespace yet (no annotation: deny by default), and already has a CA of its
# own in the namespace the fleet will use.
mk member-2 create ns "$ns" >/dev/null
mk member-2 create secret generic -n "$ns" proxyfleet-ca --from-literal=ca.crt=members-own-ca >/dev/null

# The fleet's author: a ServiceAccount that may manage ProxyDeployments in $ns and nothing else.
kubectl create serviceaccount -n "$ns" tenant >/dev/null
kubectl create role -n "$ns" pxd-editor --verb=get,list,watch,create,update,patch,delete \
  --resource=proxydeployments.proxyfleet.io >/dev/null
kubectl create rolebinding -n "$ns" tenant-pxd --role=pxd-editor --serviceaccount="$ns:tenant" >/dev/null
tenant=(--as="system:serviceaccount:$ns:tenant")
[ "$(kubectl auth can-i create secrets -n proxyfleet-system "${tenant[@]}")" = no ] || fail "the tenant may write cluster Secrets"

say "a fleet placed on env=e2e clusters (by the tenant), with one override for member-2 (replicas 3)"
placement='{"clusterSelector":{"matchLabels":{"env":"e2e"}},"overrides":[{"clusterName":"member-2","patches":[{"op":"replace","path":"/spec/replicas","value":3}]}]}'
t0=$(date +%s%N)
# The Service/Deployment of the echo upstream are the admin's; the ProxyDeployment the tenant's.
sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/" "$root/examples/basic.yaml" \
  | python3 -c "
import sys, yaml, json
rest = open('/tmp/e2e-prop-rest.json', 'w')
for d in yaml.safe_load_all(sys.stdin):
    if d and d['kind'] == 'ProxyDeployment':
        d['spec']['replicas'] = 1; d['spec']['placement'] = json.loads('$placement')
        open('/tmp/e2e-prop-pxd.json', 'w').write(json.dumps(d))
    elif d:
        rest.write(json.dumps(d) + '\\n')"
kubectl apply -n "$ns" -f /tmp/e2e-prop-rest.json >/dev/null
kubectl apply -n "$ns" -f /tmp/e2e-prop-pxd.json "${tenant[@]}" >/dev/null || fail "the tenant could not create its fleet"
retry 60 mk member-1 get pxd -n "$ns" demo
say "member-1 has the object $(( ($(date +%s%N) - t0) / 1000000 )) ms after kubectl apply on the hub"
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].status}' | grep -q True"
mk member-2 get pxd -n "$ns" demo >/dev/null 2>&1 && fail "placed on member-2, which does not admit $ns"
[ "$(kubectl get pxd -n "$ns" demo -o json | jq -c '[.status.clusters[].name]')" = '["member-1"]' ] \
  || fail "status lists a cluster that does not admit $ns: $(kubectl get pxd -n "$ns" demo -o json | jq -c .status.clusters)"
say "member-2 does not admit $ns: nothing placed there, not listed"

kubectl annotate secret -n argocd member-2 proxyfleet.io/allowed-namespaces="$ns" --overwrite >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '.status.clusters[] | select(.name==\"member-2\") | .message | test(\"not a copy of this hub.s CA\")'"
[ "$(mk member-2 get secret -n "$ns" proxyfleet-ca -o jsonpath='{.data.ca\.crt}' | base64 -d)" = members-own-ca ] \
  || fail "member-2's own CA Secret was overwritten"
mk member-2 get pxd -n "$ns" demo >/dev/null 2>&1 && fail "the fleet was placed beside a CA it could not share"
say "member-2 admits $ns but has its own CA: kept, and reported: $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.clusters[?(@.name=="member-2")].message}')"
mk member-2 delete secret -n "$ns" proxyfleet-ca >/dev/null
t0=$(date +%s%N)
present=(member-1)
until [ ${#present[@]} = 2 ]; do
  for m in "${members[@]}"; do
    [[ " ${present[*]} " == *" $m "* ]] && continue
    if mk "$m" get pxd -n "$ns" demo >/dev/null 2>&1; then
      present+=("$m"); say "$m has the object $(( ($(date +%s%N) - t0) / 1000000 )) ms after its CA Secret was removed"
    fi
  done
  [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 60 ] || fail "not propagated within 60 s: ${present[*]}"
  sleep 0.05
done

hub_spec=$(kubectl get pxd -n "$ns" demo -o json | jq -S '.spec | del(.placement)')
[ "$(mk member-1 get pxd -n "$ns" demo -o json | jq -S .spec)" = "$hub_spec" ] || fail "member-1 spec differs from the hub's"
[ "$(mk member-2 get pxd -n "$ns" demo -o json | jq -S .spec)" = "$(<<<"$hub_spec" jq -S '.replicas = 3')" ] \
  || fail "member-2 spec is not the hub's + replicas 3"
say "each member's spec is exactly the hub's (+ member-2's override)"
[ "$(mk member-1 get secret -n "$ns" proxyfleet-ca -o jsonpath='{.data.ca\.crt}')" = \
  "$(kubectl get secret -n "$ns" proxyfleet-ca -o jsonpath='{.data.ca\.crt}')" ] || fail "member-1 does not share the hub's CA"

clusters_json() { kubectl get pxd -n "$ns" demo -o json | jq -c '[.status.clusters[]? | {name, applied, reachable, phase, observedGeneration}]'; }
retry 60 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '[.status.clusters[] | select(.applied and .reachable and .phase != null and .observedGeneration != null)] | length == 2'"
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].status}' | grep -q True"
say "hub status: $(clusters_json)"
member_phase=$(mk member-1 get pxd -n "$ns" demo -o jsonpath='{.status.phase}')
hub_view=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.clusters[?(@.name=="member-1")].phase}')
[ "$member_phase" = "$hub_view" ] || say "note: member-1 phase $member_phase, hub shows $hub_view (a resync may be pending)"

say "drift: a member-side edit of a managed field is reverted"
mk member-1 patch pxd -n "$ns" demo --type=merge -p '{"spec":{"replicas":5}}' >/dev/null
t1=$(date +%s)
retry 45 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.spec.replicas}' | grep -qx 1"
say "reverted in $(( $(date +%s) - t1 ))s"

say "member-2's API server stopped: hub reports it unreachable, member-1 unaffected, nothing deleted"
apiserver_pid=$(cat /var/lib/proxyfleet/clusters/member-2/pids/kube-apiserver.pid)
kill -KILL "$apiserver_pid"
while kill -0 "$apiserver_pid" 2>/dev/null; do sleep 0.2; done
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"drain":{"deadline":"21s"}}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '.status.clusters[] | select(.name==\"member-2\") | .reachable == false'"
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].reason}' | grep -q ClusterUnreachable"
retry 30 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.spec.drain.deadline}' | grep -qx 21s"
say "hub status: $(clusters_json)"
"$root/e2e/cluster" up --name member-2 --control-plane-only >/tmp/member-2-up.log 2>&1 || { tail -5 /tmp/member-2-up.log >&2; fail "member-2 did not restart"; }
mk member-2 get pxd -n "$ns" demo >/dev/null || fail "member-2 lost its object while unreachable"
retry 60 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-2/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.spec.drain.deadline}' | grep -qx 21s"
retry 60 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '[.status.clusters[] | select(.applied and .reachable)] | length == 2'"
say "member-2 back and converged: $(clusters_json)"

say "bad overrides apply nothing anywhere"
gen1=$(mk member-1 get pxd -n "$ns" demo -o jsonpath='{.metadata.generation}')
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"add","path":"/spec/placement/overrides/-","value":{"clusterName":"member-1","patches":[{"op":"replace","path":"/spec/nonexistent/deep","value":1}]}},{"op":"replace","path":"/spec/replicas","value":2}]' >/dev/null
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].reason}' | grep -q InvalidPlacement"
say "reported: $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="Propagated")].message}')"
sleep 3
[ "$(mk member-1 get pxd -n "$ns" demo -o jsonpath='{.metadata.generation}')" = "$gen1" ] || fail "member-1 changed under an invalid override"
[ "$(mk member-2 get pxd -n "$ns" demo -o jsonpath='{.spec.replicas}')" = 3 ] || fail "member-2 changed under an invalid override"
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"replace","path":"/spec/placement/overrides/1/patches/0/path","value":"/spec/placement/clusters"},{"op":"replace","path":"/spec/placement/overrides/1/patches/0/value","value":[]}]' >/dev/null
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].message}' | grep -q 'may not change the placement'"
# An override may not give a cluster what the platform's policy refuses the fleet itself (the
# chart's default policy allows only its own proxy image): nothing written anywhere.
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"replace","path":"/spec/placement/overrides/1/patches/0/op","value":"add"},{"op":"replace","path":"/spec/placement/overrides/1/patches/0/path","value":"/spec/image"},{"op":"replace","path":"/spec/placement/overrides/1/patches/0/value","value":"docker.io/evil/miner:1"}]' >/dev/null
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].message}' | grep -q 'spec.image: .*docker.io/evil/miner:1.* is not in an allowed repository'"
[ "$(mk member-1 get pxd -n "$ns" demo -o jsonpath='{.metadata.generation}')" = "$gen1" ] || fail "member-1 changed under an override the policy refuses"
say "an override the policy refuses applies nothing: $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="Propagated")].message}')"
out=$(kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"replace","path":"/spec/placement/overrides/1/patches/0/path","value":"/metadata/labels"}]' 2>&1) \
  && fail "a patch outside /spec was admitted"
<<<"$out" grep -q "placement.overrides\[1\].patches\[0\].path" || fail "admission message does not name the field: $out"
say "admission refuses a patch outside /spec, naming the field"
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"remove","path":"/spec/placement/overrides/1"},{"op":"add","path":"/spec/placement/clusters","value":["member-9"]}]' >/dev/null
retry 30 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Propagated\")].reason}' | grep -q ClusterNotFound"
retry 30 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.spec.replicas}' | grep -qx 2"
say "unknown cluster reported (ClusterNotFound), the others still converge"
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"remove","path":"/spec/placement/clusters"}]' >/dev/null

say "selection by label: member-1 leaves (Delete policy) and comes back"
kubectl label secret -n proxyfleet-system member-1 env- >/dev/null
retry 45 bash -c "! kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo"
retry 30 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '[.status.clusters[].name] == [\"member-2\"]'"
kubectl label secret -n proxyfleet-system member-1 env=e2e >/dev/null
retry 45 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo"
say "Orphan policy: member-1 leaves, its copy stays, no longer labelled ours"
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"placement":{"deletionPolicy":"Orphan"}}}' >/dev/null
retry 45 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.metadata.annotations.proxyfleet\.io/deletion-policy}' | grep -qx Orphan"
kubectl label secret -n proxyfleet-system member-1 env- >/dev/null
retry 45 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-1/admin.kubeconfig get pxd -n $ns demo -o json | jq -e '.metadata.labels[\"proxyfleet.io/hub-uid\"] == null'"
sleep 3
mk member-1 get pxd -n "$ns" demo >/dev/null || fail "Orphan policy deleted the member's copy"

say "deleting the hub object: the finalizer removes member-2's copy (Delete), member-1's orphan stays"
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"placement":{"deletionPolicy":"Delete"}}}' >/dev/null
retry 45 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-2/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.metadata.annotations.proxyfleet\.io/deletion-policy}' | grep -qx Delete"
kubectl delete pxd -n "$ns" demo --timeout=60s >/dev/null || fail "hub object not deleted within 60 s"
mk member-2 get pxd -n "$ns" demo >/dev/null 2>&1 && fail "member-2's copy survived the hub's deletion"
mk member-1 get pxd -n "$ns" demo >/dev/null || fail "member-1's orphaned copy was deleted"
say "propagation e2e passed"
