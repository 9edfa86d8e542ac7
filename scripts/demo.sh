#!/usr/bin/env bash
# make demo: a local Kubernetes cluster, the operator installed with helm, the example
# ProxyDeployment serving HTTPS, then a canary rollout you can watch step by step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/e2e/lib/versions.sh"
export PATH="$K8S_BIN:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/proxyfleet/target}
release=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release
t0=$(date +%s)
step() { printf '\n\033[1m==> [%4ss] %s\033[0m\n' "$(( $(date +%s) - t0 ))" "$*"; }

step "local cluster (first run builds Kubernetes $K8S_VERSION from source: ~7 min; later ~10 s)"
"$root/e2e/cluster" up
export KUBECONFIG=$("$root/e2e/cluster" kubeconfig)

step "building proxyfleet images (cargo build --release, static; first run ~5 min on 2 cores)"
"$root/e2e/images/build" 2>&1 | grep -E '^\S+\.tar:|Finished' || true
"$root/e2e/cluster" load-image "$PROXYFLEET_CACHE/images/proxy.tar" "$PROXYFLEET_CACHE/images/operator.tar"

step "helm install the operator (charts/proxyfleet)"
helm upgrade --install proxyfleet "$root/charts/proxyfleet" -n proxyfleet-system --create-namespace --wait --timeout 180s
kubectl get pods -n proxyfleet-system

step "kubectl apply -f examples/basic.yaml (echo upstream + ProxyDeployment with managed TLS)"
kubectl apply -f "$root/examples/basic.yaml"
kubectl wait --for=condition=Ready pxd/demo --timeout=180s
kubectl get pxd

step "sending traffic through the Service, verified against the managed CA"
ip=$(kubectl get svc demo -o jsonpath='{.spec.clusterIP}')
kubectl get secret demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > /tmp/proxyfleet-demo-ca.crt
# Pods Ready precedes kube-proxy programming the Service by a moment.
for _ in $(seq 1 30); do
  curl -s -o /dev/null --max-time 2 --cacert /tmp/proxyfleet-demo-ca.crt --resolve "demo.example.com:443:$ip" https://demo.example.com/ && break
  sleep 1
done
for i in 1 2 3; do
  curl -sS --cacert /tmp/proxyfleet-demo-ca.crt --resolve "demo.example.com:443:$ip" "https://demo.example.com/hello/$i"
done

# watch_rollout TITLE — the plugin's tree until the canary ends (Completed or Aborted).
watch_rollout() {
  local end=$(( $(date +%s) + 300 )) phase
  while [ "$(date +%s)" -lt "$end" ]; do
    clear 2>/dev/null || true
    printf '%s (%ss)\n\n' "$1" "$(( $(date +%s) - t0 ))"
    "$release/kubectl-proxyfleet" get pxd demo || true
    phase=$(kubectl get pxd demo -o jsonpath='{.status.canary.phase}')
    [ "$phase" = Completed ] || [ "$phase" = Aborted ] && break
    sleep 3
  done
}
# load SUMMARY — 20 req/s through the Service until stopped (every weight is judged on it).
load() {
  "$release/proxyfleet-loadgen" --url https://demo.example.com/ --connect "$ip:443" --ca /tmp/proxyfleet-demo-ca.crt \
    --rate 20 --workers 2 --duration 330s >"$1" 2>/dev/null &
  LOAD_PID=$!
}
stop_load() { kill -TERM "$LOAD_PID" 2>/dev/null || true; wait "$LOAD_PID" 2>/dev/null || true; }

step "starting a canary: new config, steps 34% → pause → 67% → pause → 100%, each weight judged on 5xx and P99"
load /tmp/proxyfleet-demo-load.json
kubectl patch pxd demo --type=merge -p '{"spec":{"replicas":3,"strategy":{"canary":{
  "steps":[{"setWeight":34},{"pause":{"duration":"15s"}},{"setWeight":67},{"pause":{"duration":"15s"}},{"setWeight":100}],
  "analysis":{"interval":"10s","window":"20s","minRequests":10,"metrics":[{"name":"errors","errorRate5xx":{"max":5}},{"name":"p99","p99LatencyMs":{"max":250}}]}}}}}'
kubectl wait --for=condition=Ready pxd/demo --timeout=120s >/dev/null
kubectl patch pxd demo --type=json -p '[{"op":"replace","path":"/spec/routes/0/timeout","value":"4s"}]'
watch_rollout "canary rollout"
stop_load
echo "load during the rollout: $(cat /tmp/proxyfleet-demo-load.json 2>/dev/null)"
kubectl get pxd

step "a bad canary: the route answers 503 on 30 % of requests; the analysis must roll it back"
load /tmp/proxyfleet-demo-bad.json
kubectl patch pxd demo --type=json -p '[{"op":"add","path":"/spec/routes/0/fault","value":{"abort":{"status":503,"percent":30}}}]'
watch_rollout "bad canary"
stop_load
echo "bad canary: $(kubectl get pxd demo -o jsonpath='{.status.canary.phase}: {.status.canary.message}')"
# Back to what stable runs: nothing to roll out.
kubectl patch pxd demo --type=json -p '[{"op":"remove","path":"/spec/routes/0/fault"}]'

step "done in $(( $(date +%s) - t0 ))s. Next:"
cat <<TXT
  export KUBECONFIG=$KUBECONFIG
  export PATH=$K8S_BIN:$release:\$PATH        # kubectl, helm, kubectl-proxyfleet
  kubectl proxyfleet get pxd demo --watch      # steps, weights, analysis, pods
  curl --cacert /tmp/proxyfleet-demo-ca.crt --resolve demo.example.com:443:$ip https://demo.example.com/
  kubectl patch pxd demo --type=json -p '[{"op":"add","path":"/spec/routes/0/fault","value":{"abort":{"status":503,"percent":30}}}]'
                                               # a bad canary again: watch it roll back
  e2e/cluster down --all                       # tear everything down
TXT
