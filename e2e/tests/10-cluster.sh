#!/usr/bin/env bash
# The local cluster works: real versions, a locally built image runs behind a Service that
# answers from the host, a second `up` is idempotent (kube-proxy keeps following endpoints), the
# controller-manager garbage-collects, a member control plane runs.
. "$(dirname "$0")/../lib/testlib.sh"

say "versions"
kubectl version -o json | grep -q "\"gitVersion\": \"$K8S_VERSION\"" || fail "kubectl version does not report $K8S_VERSION"
helm version --short | grep -q "^$HELM_VERSION" || fail "helm version does not report $HELM_VERSION"

say "node Ready"
kubectl get node proxyfleet-node -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -q True || fail "node not Ready"

ns=$(test_namespace e2e-cluster)
trap 'kubectl delete ns e2e-cluster --wait=false >/dev/null 2>&1 || true' EXIT
"$root/e2e/cluster" load-image "$PROXYFLEET_CACHE/images/proxy.tar"
kubectl apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: echo
        image: proxyfleet.local/proxy:$VERSION
        imagePullPolicy: IfNotPresent
        command: ["/bin/proxyfleet-echo"]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
        securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
YAML
say "waiting for the echo pod"
kubectl rollout status -n "$ns" deploy/echo --timeout=120s >/dev/null || fail "echo Deployment not ready"
ip=$(kubectl get svc -n "$ns" echo -o jsonpath='{.spec.clusterIP}')
say "request to ClusterIP $ip from the host"
retry 30 curl -fsS "http://$ip/hello"
out=$(curl -fsS "http://$ip/hello")
<<<"$out" grep -q "GET /hello" || fail "unexpected answer: $out"

say "a second 'up' on the running cluster changes nothing: kube-proxy keeps running, and a Service follows new pods"
kp_pid=$(cat /var/lib/proxyfleet/clusters/main/pids/kube-proxy.pid)
second_up=$("$root/e2e/cluster" up 2>&1) || { <<<"$second_up" tail -15 >&2; fail "a second e2e/cluster up failed"; }
sleep 3
kill -0 "$kp_pid" 2>/dev/null || fail "kube-proxy exited after a second up (its config file was rewritten)"
[ "$(cat /var/lib/proxyfleet/clusters/main/pids/kube-proxy.pid)" = "$kp_pid" ] || fail "kube-proxy was restarted"
kubectl rollout restart -n "$ns" deploy/echo >/dev/null
kubectl rollout status -n "$ns" deploy/echo --timeout=120s >/dev/null || fail "echo Deployment not ready after the restart"
retry 30 curl -fsS "http://$ip/hello" || fail "the Service stopped answering after its pods were replaced"

say "pods reach the API server through the kubernetes Service"
kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes -o jsonpath='{.items[0].endpoints[0].addresses[0]}' | grep -q 10.244.0.1 || fail "kubernetes Service has no endpoint"

say "garbage collection: deleting the Deployment removes its ReplicaSet and pods"
kubectl delete deploy -n "$ns" echo --wait=false >/dev/null
retry 60 bash -c "[ -z \"\$(kubectl get rs,pods -n $ns -l app=echo -o name)\" ]"

say "member control plane beside the main cluster"
"$root/e2e/cluster" up --name member-9 --control-plane-only
kubectl --kubeconfig "$("$root/e2e/cluster" kubeconfig --name member-9)" get ns default >/dev/null || fail "member-9 not reachable"
"$root/e2e/cluster" down --name member-9
[ ! -d /var/lib/proxyfleet/clusters/member-9 ] || fail "member-9 state left behind"
say "ok"
