#!/usr/bin/env bash
# Issue 17 on the real cluster: a team's app gray-released through the fleet's proxies.
# 1. an AppRollout takes over the app (Deployment `shop`, replicas 0) → shop-stable serves it;
# 2. v1 → v2 under load: weights 5 → 30 → 100 → promoted, 0 failed requests, the client-side
#    share of v2 printed per step; sticky users never leave the canary as its weight grows;
#    `x-canary: always` reaches the canary; the operator restarted mid-rollout repeats no step;
# 3. v3 answering 20 % 500 → rolled back; the time from the first failing measurement to
#    weight 0 on every proxy pod printed (goal ≤ one interval + 2 s).
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-app)
LOADGEN=$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen
trap 'pkill -f "proxyfleet-loadgen.*e2e-app" 2>/dev/null || true; kubectl delete ns e2e-app --wait=false >/dev/null 2>&1 || true' EXIT

kubectl apply -n "$ns" -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: shop, labels: {app: shop}}
spec:
  replicas: 0                 # the AppRollout runs the pods
  selector: {matchLabels: {app: shop}}
  template:
    metadata: {labels: {app: shop}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 5
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: shop
          image: proxyfleet.local/proxy:0.1.0
          imagePullPolicy: IfNotPresent
          command: ["/bin/proxyfleet-echo"]
          env: [{name: ECHO_VERSION, value: v1}]
          ports: [{containerPort: 8080, name: http}]
          readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1}
          securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: edge}
spec:
  replicas: 2
  listeners: [{name: https, port: 8443, servicePort: 443, hostnames: [shop.example.com]}]
  routes: [{name: shop, match: {pathPrefix: /}, upstream: shop, timeout: 5s, retries: {attempts: 1}}]
  upstreams: [{name: shop, endpoints: ["shop.e2e-app.svc:8080"], pool: {maxIdlePerEndpoint: 32, idleTimeout: 30s}}]
  tls: {managed: {duration: 2160h}}
---
apiVersion: proxyfleet.io/v1alpha1
kind: AppRollout
metadata: {name: shop}
spec:
  workloadRef: {name: shop}
  replicas: 2
  port: 8080
  route: {proxyDeployment: edge, name: shop}
  sticky: {header: x-user}
  canaryMatch: [{header: {name: x-canary, value: always}}]
  strategy:
    steps: [{setWeight: 5}, {pause: {duration: 20s}}, {setWeight: 30}, {pause: {duration: 20s}}, {setWeight: 100}]
    analysis: {interval: 5s, window: 10s, minRequests: 10, metrics: [{name: errors, errorRate5xx: {max: 5}}, {name: p99, p99LatencyMs: {max: 250}}]}
YAML

ar() { kubectl get approllout -n "$ns" shop -o jsonpath="{$1}"; }
phase() { ar .status.canary.phase; }
say "1. the AppRollout takes the app over; the fleet's route splits"
retry 120 bash -c "[ \"\$(kubectl get approllout -n $ns shop -o jsonpath='{.status.conditions[0].reason}')\" = Stable ]"
kubectl wait -n "$ns" --for=condition=Ready pxd/edge --timeout=180s >/dev/null || fail "edge not Ready"
retry 60 kubectl rollout status -n "$ns" deploy/shop-stable --timeout=5s
ip=$(kubectl get svc -n "$ns" edge -o jsonpath='{.spec.clusterIP}')
ca=/tmp/app-ca.crt
kubectl get secret -n "$ns" edge-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"
get() { curl -fsS --max-time 5 --cacert "$ca" --resolve "shop.example.com:443:$ip" "$@"; }
retry 60 bash -c "curl -fsS --max-time 3 --cacert $ca --resolve shop.example.com:443:$ip https://shop.example.com/ | grep -q @v1"
# The share of answers from VERSION among N, on one keep-alive connection.
share() { # share VERSION N
  local urls=() i
  for ((i = 0; i < $2; i++)); do urls+=(https://shop.example.com/share); done
  get "${urls[@]}" | awk -v n="$2" -v v="@$1 " 'index($0, v) {c++} END {printf "%.1f", 100 * c / n}'
}
proxy_ips() { kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=edge --field-selector=status.phase=Running -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}'; }
# The canary weight each proxy pod has in force (its admin /config report).
pod_weights() {
  local p
  for p in $(proxy_ips); do
    curl -fsS --max-time 3 "http://$p:9901/config" | jq -r '[.liveWeights[] | select(.route == "shop") | .weights["shop-canary"]] | first // "none"'
  done | tr '\n' ' '
}
# The tracks' endpoints are their Services' ClusterIPs once those exist (no DNS on the connect
# path); wait until both proxy pods run that configuration and confirmed the weights.
fleet_settled() {
  local p n=0
  for p in $(proxy_ips); do
    curl -fsS --max-time 3 "http://$p:9901/config" \
      | jq -e '.config.upstreams[] | select(.name == "shop-canary") | .endpoints[0] | test("^[0-9.]+:8080$")' >/dev/null || return 1
    n=$((n + 1))
  done
  [ "$n" = 2 ] && [ "$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=edge -o name | wc -l)" = 2 ] \
    && [ "$(ar .status.weightsApplied)" = 2/2 ]
}
retry 180 fleet_settled
[ "$(share v1 50)" = 100.0 ] || fail "not every answer came from v1 before the rollout"

say "2. v1 → v2 under 50 req/s"
"$LOADGEN" --url https://shop.example.com/e2e-app --connect "$ip:443" --ca "$ca" --rate 50 --workers 2 \
  --duration 600s --summary /tmp/app-load.json >/dev/null 2>/tmp/app-load.err &
LOAD_PID=$!
sleep 3
kubectl set env -n "$ns" deploy/shop ECHO_VERSION=v2 >/dev/null
retry 60 bash -c "[ \"\$(kubectl get approllout -n $ns shop -o jsonpath='{.status.canary.phase}')\" = Progressing ]"
seen=""; sticky_users=""; restarted=""; end=$(( $(date +%s) + 300 ))
while [ "$(phase)" != Completed ]; do
  [ "$(date +%s)" -lt "$end" ] || { kubectl get approllout -n "$ns" shop -o yaml >&2; fail "v2 not promoted within 300s"; }
  case "$(phase)" in Aborted) kubectl get approllout -n "$ns" shop -o yaml >&2; fail "the healthy v2 was aborted";; esac
  w=$(ar .status.weight)
  if [ "$w" -gt 0 ] && [[ " $seen " != *" $w "* ]] && [ "$(ar .status.weightsApplied)" = 2/2 ]; then
    seen="$seen $w"
    say "weight $w% (pods: $(pod_weights)): client-side share of v2 over 400 requests: $(share v2 400)%"
    if [ "$w" = 5 ]; then
      for u in $(seq 1 200); do get -H "x-user: u$u" https://shop.example.com/ | grep -q @v2 && sticky_users="$sticky_users u$u"; done
      say "users on v2 at 5%:$sticky_users"
      [ -n "$sticky_users" ] || fail "no sticky user landed on the canary at 5%"
      for u in $sticky_users; do get -H "x-user: $u" https://shop.example.com/ | grep -q @v2 || fail "$u left v2 within one step"; done
      get -H 'x-canary: always' https://shop.example.com/ | grep -q @v2 || fail "x-canary: always did not reach the canary"
    fi
    if [ "$w" = 30 ]; then
      for u in $sticky_users; do get -H "x-user: $u" https://shop.example.com/ | grep -q @v2 || fail "$u moved back to v1 as the weight grew"; done
      say "every user on v2 at 5% is still on v2 at 30%"
      say "restarting the operator mid-rollout"
      kubectl delete pod -n proxyfleet-system -l app.kubernetes.io/name=proxyfleet-operator --wait=false >/dev/null
      restarted=1
    fi
  fi
  sleep 1
done
[ -n "$restarted" ] || fail "the rollout finished before the operator could be restarted (weights seen:$seen)"
say "v2 promoted (weights seen:$seen)"
retry 60 bash -c "curl -fsS --max-time 3 --cacert $ca --resolve shop.example.com:443:$ip https://shop.example.com/ | grep -q @v2"
all_v2() { [ "$(share v2 100)" = 100.0 ]; }
retry 20 all_v2   # the old version's pods are gone before traffic returns to stable
# Each of the 5 steps completes exactly once, across the operator restart (the recorder folds
# events of one reason into series, so count occurrences).
events=$(kubectl get events.events.k8s.io -n "$ns" --field-selector regarding.name=shop,reason=StepCompleted -o json)
steps=$(<<<"$events" jq '[.items[] | (.series.count // 1)] | add // 0')
say "StepCompleted events: $steps for 5 steps"
[ "$steps" = 5 ] || fail "$steps StepCompleted events for 5 steps: a step was repeated or skipped"
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID || true
cat /tmp/app-load.json >&2
failed=$(jq '.status_5xx + .errors' /tmp/app-load.json)
ok=$(jq '.ok' /tmp/app-load.json)
[ "$ok" -gt 1000 ] || fail "only $ok requests under load"
[ "$failed" = 0 ] || fail "$failed failed requests during the healthy rollout"
say "healthy rollout: $ok requests, 0 failed"
# The plugin's verbs take approllout/NAME.
apr=$("$PLUGIN" -n "$ns" get apr shop) || fail "kubectl proxyfleet get apr failed"
grep -q "approllout/shop .*weight=0%" <<<"$apr" || fail "kubectl proxyfleet get apr: $apr"
"$PLUGIN" -n "$ns" status approllout/shop --timeout 30 >/dev/null || fail "kubectl proxyfleet status approllout/shop"

say "3. v3 answering 20 % 500 → rolled back"
# 200 req/s puts ~100 requests on the 5 % canary per 10 s window, so every window of a version
# failing 20 % fails (more than 5 errors among 100: P ≈ 1 − 1e-5). At 40 req/s a window held ~20
# canary requests, one in fifteen of which had ≤ 1 error (≤ 5 %) and passed, and a pass between
# the two failures failureLimit 1 needs delays the abort by an interval (15.97 s seen once).
"$LOADGEN" --url https://shop.example.com/e2e-app --connect "$ip:443" --ca "$ca" --rate 200 --workers 2 \
  --duration 300s --summary /tmp/app-load-bad.json >/dev/null 2>>/tmp/app-load.err &
LOAD_PID=$!
kubectl set env -n "$ns" deploy/shop ECHO_VERSION=v3 ECHO_ERROR_PERCENT=20 >/dev/null
first_bad=""; end=$(( $(date +%s) + 240 ))
while :; do
  [ "$(date +%s)" -lt "$end" ] || { kubectl get approllout -n "$ns" shop -o yaml >&2; fail "v3 not rolled back within 240s"; }
  case "$(phase)" in Promoting|Completed) [ "$(ar .status.canary.canaryRevision)" != "$(ar .status.stableRevision)" ] || fail "the bad v3 was promoted";; esac
  if [ -z "$first_bad" ] && ar '.status.canary.metrics[*].failures' | grep -q '[1-9]'; then first_bad=$(date +%s.%N); fi
  if [ "$(phase)" = Aborted ]; then
    w=$(pod_weights)
    if [ -n "$w" ] && ! <<<"$w" grep -qv '^\(0 \)*$'; then break; fi
  fi
  sleep 0.5
done
t=$(echo "$(date +%s.%N) - ${first_bad:-$(date +%s.%N)}" | bc)
say "aborted: $(ar .status.canary.message)"
say "first failing measurement → canary weight 0 on every proxy pod ($(pod_weights)): ${t}s"
echo "$t" > /tmp/app-rollback-seconds.txt
# The goal is one interval + 2 s (7 s); the bound that fails the test leaves room for a busy
# 2-core machine (two intervals + 2 s).
awk -v t="$t" 'BEGIN { exit !(t <= 12) }' || {
  ar '.status.canary.metrics' >&2; echo >&2
  kubectl logs -n proxyfleet-system -l app.kubernetes.io/name=proxyfleet-operator --tail=200 2>&1 \
    | grep -E 'approllout="?shop|shop' | tail -60 >&2
  fail "rollback took ${t}s (goal ≤ one 5 s interval + 2 s)"
}
retry 60 bash -c "[ \"\$(kubectl get deploy -n $ns shop-canary -o jsonpath='{.status.replicas}')\" = '' ] || [ \"\$(kubectl get deploy -n $ns shop-canary -o jsonpath='{.status.replicas}')\" = 0 ]"
retry 20 all_v2
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID || true
say "app rollout: ok"
