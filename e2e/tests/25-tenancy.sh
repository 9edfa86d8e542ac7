#!/usr/bin/env bash
# Tenancy on real API servers: what the operator's account may and may not do (kubectl auth
# can-i against the installed chart), a namespace-bound ServiceAccount (kubectl --as) refused at
# admission by the ProxyFleetPolicy (the chart's ValidatingAdmissionPolicy), the operator holding
# a fleet that a tightened policy no longer allows (Degraded/PolicyViolation, nothing deleted),
# and the chart's namespaced mode (Roles only) reconciling a fleet on a separate control plane
# with the operator authenticated as that ServiceAccount.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-tenant)
MEMBER_PID=
cleanup() {
  [ -n "${E2E_KEEP:-}" ] && return 0
  kubectl delete pxd -n e2e-tenant --all --timeout=30s >/dev/null 2>&1 || true
  kubectl delete proxyfleetpolicy e2e-tenants --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete ns e2e-tenant --wait=false >/dev/null 2>&1 || true
  [ -n "$MEMBER_PID" ] && kill "$MEMBER_PID" 2>/dev/null
  "$root/e2e/cluster" down --name member-3 >/dev/null 2>&1 || true
}
trap cleanup EXIT

# can ACCOUNT VERB RESOURCE [ARGS...] — yes or no, as the API server's authorizer says.
can() { kubectl auth can-i --as="$1" "${@:2}" 2>/dev/null || true; }
expect() { # expect yes|no ACCOUNT VERB RESOURCE [ARGS...]
  local want=$1 got; got=$(can "${@:2}")
  [ "$got" = "$want" ] || fail "can-i ${*:3} as ${2##*:}: $got, want $want"
}

say "the operator's account (cluster-wide install): what it needs, and nothing that makes it cluster-admin"
op=system:serviceaccount:proxyfleet-system:proxyfleet-operator
for check in "create deployments.apps -n $ns" "patch proxydeployments.proxyfleet.io --subresource=status -n $ns" \
  "list proxyfleetpolicies.proxyfleet.io" "watch namespaces" "update leases.coordination.k8s.io -n proxyfleet-system" \
  "update proxydeployments.proxyfleet.io --subresource=finalizers -n $ns"; do
  # shellcheck disable=SC2086
  expect yes "$op" $check
done
for check in "create pods -n $ns" "create pods --subresource=exec -n $ns" "create serviceaccounts --subresource=token -n $ns" \
  "create clusterrolebindings" "escalate clusterroles" "bind clusterroles" "impersonate users" \
  "delete namespaces" "update proxyfleetpolicies.proxyfleet.io" "create validatingadmissionpolicies.admissionregistration.k8s.io" \
  "update nodes" "update leases.coordination.k8s.io -n kube-system" "update secrets -n $ns" \
  "create certificaterequests.cert-manager.io -n $ns" "create issuers.cert-manager.io -n $ns" "patch clusterissuers.cert-manager.io" \
  "delete secrets -n $ns" "delete serviceaccounts -n $ns" "delete networkpolicies.networking.k8s.io -n $ns" \
  "update proxydeployments.proxyfleet.io -n $ns" "watch pods -n $ns" \
  "watch certificates.cert-manager.io -n $ns" "get certificaterequests.cert-manager.io -n $ns"; do
  # shellcheck disable=SC2086
  expect no "$op" $check
done
say "operator account: 6 needed rights granted, 23 dangerous or unneeded ones refused"

say "a tenant bound to $ns (a ServiceAccount with a Role on ProxyDeployments only)"
kubectl label ns "$ns" proxyfleet.io/e2e-tenant=true >/dev/null
kubectl create serviceaccount -n "$ns" tenant >/dev/null
kubectl create role -n "$ns" pxd-editor --verb=get,list,watch,create,update,patch,delete \
  --resource=proxydeployments.proxyfleet.io,proxydeployments.proxyfleet.io/scale,approllouts.proxyfleet.io >/dev/null
kubectl create rolebinding -n "$ns" tenant-pxd --role=pxd-editor --serviceaccount="$ns:tenant" >/dev/null
tenant=system:serviceaccount:$ns:tenant
expect no "$tenant" get secrets -n "$ns"
expect no "$tenant" create deployments.apps -n "$ns"
kubectl apply -f - >/dev/null <<EOF
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyFleetPolicy
metadata: {name: e2e-tenants}
spec:
  namespaceSelector: {matchLabels: {proxyfleet.io/e2e-tenant: "true"}}
  allowedServiceTypes: [ClusterIP]
  allowPodOverrides: false
  allowSecretReferences: false
  allowedAcmeDirectories: [https://acme.example.com/directory]
  allowedClusterIssuers: [public]
  allowedPrometheusAddresses: [http://prometheus.monitoring:9090]
  dnsNameSuffixes: [.example.com]
  maxReplicas: 2
  # Trailing slashes are dropped; the miner is here so that the default policy alone refuses it.
  allowedImageRepositories: [proxyfleet.local/proxy/, docker.io/evil/miner//]
EOF
kubectl get proxyfleetpolicy default -o jsonpath='{.spec.allowedImageRepositories}' | grep -q proxyfleet.local/proxy \
  || fail "the chart's default policy is missing"
# The example's objects (the echo upstream) are the admin's; the fleet is the tenant's.
sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/" "$root/examples/basic.yaml" \
  | python3 -c "
import sys, yaml, json
for d in yaml.safe_load_all(sys.stdin):
    if not d: continue
    path = '/tmp/e2e-tenant-pxd.json' if d['kind'] == 'ProxyDeployment' else None
    if path: d['spec']['replicas'] = 1; open(path, 'w').write(json.dumps(d))
    else: print(json.dumps(d))" | kubectl apply -n "$ns" -f - >/dev/null
refused() { # refused FIELD POLICY JQ-EDIT — the tenant's fleet, edited, is refused naming both
  local out
  out=$(jq "$3" /tmp/e2e-tenant-pxd.json | kubectl apply -n "$ns" --as="$tenant" -f - 2>&1) \
    && fail "admitted: $3"
  <<<"$out" grep -q "$1" && <<<"$out" grep -q "ProxyFleetPolicy $2" \
    || fail "refusal of $3 does not name $1 and ProxyFleetPolicy $2: $out"
  say "refused at admission: $(<<<"$out" grep -o "$1[^)]*)" | head -1)"
}
refused spec.image default '.spec.image = "docker.io/evil/miner:1"'
# A repository written with a trailing slash is the same repository, at admission as in the
# operator: another tag of it passes both policies.
out=$(jq '.spec.image = "proxyfleet.local/proxy:another-tag"' /tmp/e2e-tenant-pxd.json \
  | kubectl apply --dry-run=server -n "$ns" --as="$tenant" -f - 2>&1) \
  || fail "another tag of an allowed repository written with a trailing slash was refused: $out"
say "admitted: another tag of proxyfleet.local/proxy, allowed as proxyfleet.local/proxy/"
refused spec.service.type e2e-tenants '.spec.service = {type: "NodePort"}'
refused spec.pod e2e-tenants '.spec.pod = {priorityClassName: "system-cluster-critical"}'
refused spec.replicas e2e-tenants '.spec.replicas = 5'
refused "naming Secrets" e2e-tenants '.spec.tls = {secretName: "someone-elses-certificate"}'
refused spec.tls.acme.directory e2e-tenants '.spec.tls = {acme: {directory: "https://acme.elsewhere.example.net/dir"}} | .spec.listeners += [{name: "http", port: 8080, servicePort: 80, protocol: "HTTP"}]'
# An allowed ClusterIssuer's name in another API group (an external issuer) is another issuer.
issuer() { echo ".spec.tls = {certManager: {issuerRef: {name: \"public\", kind: \"ClusterIssuer\"$1}}, dnsNames: [\"a.example.com\"]}"; }
refused spec.tls.certManager.issuerRef e2e-tenants "$(issuer ', group: "issuers.example.com"')"
out=$(jq "$(issuer '')" /tmp/e2e-tenant-pxd.json | kubectl apply --dry-run=server -n "$ns" --as="$tenant" -f - 2>&1) \
  || fail "cert-manager's allowed ClusterIssuer was refused: $out"
# The operator would query it from its own namespace, which every fleet's NetworkPolicy admits
# to the admin port: another team's proxy is not the tenant's to ask.
# A passthrough route claims its SNI names as a hostname does.
refused serverNames e2e-tenants '.spec.listeners += [{name: "db", port: 5432, protocol: "TCP", tcp: {routes: [{name: "db", serverNames: ["db.elsewhere.net"], upstream: "echo"}]}}]'
refused spec.strategy.canary e2e-tenants '.spec.strategy = {canary: {steps: [{setWeight: 10}], analysis: {interval: "10s", metrics: [{name: "theirs", prometheus: {address: "http://other.team-b:9901", query: "up", successCondition: "result > 0"}}]}}}'
# The same address in an AppRollout's analysis (the operator queries it the same way).
out=$(kubectl apply -n "$ns" --as="$tenant" -f - 2>&1 <<EOF
apiVersion: proxyfleet.io/v1alpha1
kind: AppRollout
metadata: {name: theirs}
spec:
  workloadRef: {name: shop}
  port: 8080
  route: {proxyDeployment: demo, name: default}
  strategy:
    steps: [{setWeight: 10}]
    analysis: {interval: 10s, metrics: [{name: theirs, prometheus: {address: "http://other.team-b:9901", query: up, successCondition: "result > 0"}}]}
EOF
) && fail "an AppRollout querying another team's address was admitted"
<<<"$out" grep -q "spec.strategy: an analysis queries a Prometheus address not in allowedPrometheusAddresses (ProxyFleetPolicy e2e-tenants)" \
  || fail "the AppRollout's refusal does not name the field and policy: $out"
say "refused at admission: an AppRollout's spec.strategy querying http://other.team-b:9901"
kubectl apply -n "$ns" --as="$tenant" -f /tmp/e2e-tenant-pxd.json >/dev/null || fail "an allowed fleet was refused"
kubectl wait -n "$ns" pxd/demo --for=condition=Ready --timeout=180s >/dev/null || fail "the tenant's fleet did not become Ready"
retry 60 https_get "$ns" demo /   # the echo upstream starts beside it
say "the allowed fleet is Ready and serving"
out=$(kubectl scale -n "$ns" --as="$tenant" pxd/demo --replicas=5 2>&1) && fail "scaled past maxReplicas: $out"
<<<"$out" grep -q "spec.replicas: 5 is more than the 2 allowed (ProxyFleetPolicy e2e-tenants)" \
  || fail "the scale refusal does not name the field and policy: $out"
say "refused at admission: kubectl scale past maxReplicas"

say "the platform tightens the policy: the operator holds the fleet, deletes nothing, says why"
deployment_uid=$(kubectl get deploy -n "$ns" demo -o jsonpath='{.metadata.uid}')
kubectl patch proxyfleetpolicy e2e-tenants --type=merge -p '{"spec":{"maxReplicas":0}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Degraded\")].reason}' | grep -qx PolicyViolation"
message=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="Degraded")].message}')
<<<"$message" grep -q "spec.replicas: 1 is more than the 0 allowed (ProxyFleetPolicy e2e-tenants)" \
  || fail "the status does not name the field and policy: $message"
[ "$(kubectl get deploy -n "$ns" demo -o jsonpath='{.metadata.uid}')" = "$deployment_uid" ] || fail "the running Deployment was replaced"
https_get "$ns" demo / >/dev/null || fail "the held fleet stopped serving"
say "held: $message; still serving"
# A command for a held fleet (abort is how its canary is stopped) is metadata only: admitted.
kubectl annotate -n "$ns" --as="$tenant" pxd/demo e2e.proxyfleet.io/note=held >/dev/null \
  || fail "an annotation on the held fleet was refused at admission"
say "an annotation on the held fleet is admitted (the spec is what the policy judges)"
kubectl patch proxyfleetpolicy e2e-tenants --type=merge -p '{"spec":{"maxReplicas":2}}' >/dev/null
retry 60 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.conditions[?(@.type==\"Degraded\")].status}' | grep -qx False"
say "policy relaxed: Degraded cleared"

say "a fleet named after objects it does not own: they are neither taken over nor deleted"
# The admin's own Secret and Service, named as a tenant's new fleets would name theirs.
kubectl create secret generic -n "$ns" shop-tls --from-literal=tls.crt=the-admins >/dev/null
kubectl create service clusterip -n "$ns" blog --tcp=80:8080 >/dev/null
for fleet in shop blog; do
  jq --arg n "$fleet" '.metadata.name = $n' /tmp/e2e-tenant-pxd.json | kubectl apply -n "$ns" --as="$tenant" -f - >/dev/null \
    || fail "fleet $fleet was refused at admission"
done
clash() { # clash FLEET KIND/NAME — the fleet's status names the object it may not write
  kubectl get pxd -n "$ns" "$1" -o json | jq -r '.status.conditions[]?.message' \
    | grep -q "$2 exists and is not this ProxyDeployment's"
}
retry 90 clash shop "Secret $ns/shop-tls"
retry 90 clash blog "Service $ns/blog"
[ "$(kubectl get secret -n "$ns" shop-tls -o jsonpath='{.data.tls\.crt}' | base64 -d)" = the-admins ] \
  || fail "the admin's Secret was overwritten"
[ -z "$(kubectl get secret -n "$ns" shop-tls -o jsonpath='{.metadata.ownerReferences}')$(kubectl get svc -n "$ns" blog -o jsonpath='{.metadata.ownerReferences}')" ] \
  || fail "an owner reference was added to the admin's objects"
[ "$(kubectl get svc -n "$ns" blog -o jsonpath='{.spec.selector.app}')" = blog ] || fail "the admin's Service was rewritten"
say "reported: $(kubectl get pxd -n "$ns" blog -o json | jq -r '.status.conditions[]?.message' | grep -m1 'exists and is not')"
kubectl delete pxd -n "$ns" shop blog --wait=true >/dev/null
retry 30 kubectl get secret -n "$ns" shop-tls
kubectl get svc -n "$ns" blog >/dev/null 2>&1 || fail "deleting the fleet deleted the admin's Service"
say "the admin's Secret and Service are untouched and outlive the fleets"

say "namespaced mode: the chart's Roles only, on a control plane of its own (member-3)"
"$root/e2e/cluster" up --name member-3 --control-plane-only >/dev/null 2>&1 || fail "could not start member-3"
m3() { kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-3/admin.kubeconfig "$@"; }
retry 30 m3 get ns default
m3 apply -f "$root/crds/" >/dev/null
retry 60 m3 wait --for=condition=Established crd --all --timeout=10s
for n in proxyfleet-system team-x team-y; do m3 create ns "$n" >/dev/null; done
# Everything of the chart but the operator's own pod (a control plane has no kubelet): it runs
# here as a process, authenticated as the chart's ServiceAccount.
helm template proxyfleet "$root/charts/proxyfleet" -n proxyfleet-system --kube-version "${K8S_VERSION#v}" --set 'watchNamespaces={team-x}' \
  --set policy.admission=false | python3 -c "
import sys, yaml
keep = {'ServiceAccount', 'Role', 'RoleBinding', 'ClusterRole', 'ClusterRoleBinding', 'ProxyFleetPolicy'}
docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d['kind'] in keep]
print(yaml.safe_dump_all(docs))" | m3 apply -f - >/dev/null
m3 get clusterrolebinding proxyfleet-operator >/dev/null 2>&1 && fail "namespaced mode created the cluster-wide binding"
expect_m3() { local got; got=$(m3 auth can-i --as="$op" "${@:2}" 2>/dev/null || true); [ "$got" = "$1" ] || fail "member-3 can-i ${*:2}: $got, want $1"; }
expect_m3 yes create deployments.apps -n team-x
expect_m3 yes list secrets -n team-x
expect_m3 yes get namespaces/team-x
expect_m3 no create deployments.apps -n team-y
expect_m3 no list secrets -n team-y
expect_m3 no list secrets -n kube-system
expect_m3 no get namespaces/team-y
expect_m3 no list proxydeployments.proxyfleet.io -A
say "namespaced RBAC: team-x only; no Secret outside it, no other namespace visible"
token=$(m3 create token proxyfleet-operator -n proxyfleet-system --duration=1h)
server=$(m3 config view --minify -o jsonpath='{.clusters[0].cluster.server}')
m3 config view --raw --flatten --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >/tmp/member-3-ca.crt
[ -s /tmp/member-3-ca.crt ] || fail "no CA certificate for member-3's API server"
cat >/tmp/member-3-operator.kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters: [{name: m3, cluster: {server: "$server", certificate-authority: /tmp/member-3-ca.crt}}]
users: [{name: op, user: {token: "$token"}}]
contexts: [{name: op, context: {cluster: m3, user: op, namespace: proxyfleet-system}}]
current-context: op
EOF
KUBECONFIG=/tmp/member-3-operator.kubeconfig RUST_LOG=info,kube=warn "$CARGO_TARGET_DIR_RELEASE/proxyfleet-operator" \
  --metrics-addr 127.0.0.1:18093 --log-format text --watch-namespaces team-x --clusters-namespace proxyfleet-system \
  >/tmp/operator-member-3.log 2>&1 &
MEMBER_PID=$!
for n in team-x team-y; do
  sed "s/echo.default.svc.cluster.local/echo.$n.svc.cluster.local/" "$root/examples/basic.yaml" | m3 apply -n "$n" -f - >/dev/null
done
retry 60 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-3/admin.kubeconfig get deploy -n team-x demo"
retry 30 bash -c "kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-3/admin.kubeconfig get pxd -n team-x demo -o jsonpath='{.status.observedGeneration}' | grep -q ."
m3 get deploy -n team-y demo >/dev/null 2>&1 && fail "the namespaced operator acted in team-y"
[ -z "$(m3 get pxd -n team-y demo -o jsonpath='{.status}')" ] || fail "the namespaced operator wrote team-y's status"
kill -0 "$MEMBER_PID" 2>/dev/null || { tail -5 /tmp/operator-member-3.log >&2; fail "the namespaced operator exited"; }
! grep -i "forbidden" /tmp/operator-member-3.log >&2 || fail "the namespaced operator hit RBAC refusals (above)"
say "namespaced operator reconciled team-x ($(m3 get pxd -n team-x demo -o jsonpath='{.status.phase}')), left team-y alone, no RBAC refusal"
say "tenancy e2e passed"
