#!/usr/bin/env bash
# Canary rollouts on the real cluster with real load and a real Prometheus:
# healthy promotion, rollback on 5xx (Prometheus and direct sources), rollback on latency,
# operator restart mid-step, Prometheus unreachable, undo, `kubectl proxyfleet promote` past an open pause,
# pause/resume/abort/retry by command.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"
. "$root/e2e/lib/prometheus.sh"

install_operator
start_prometheus
ns=$(test_namespace e2e-canary)
LOADGEN=$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen
trap 'stop_prometheus; pkill -f "proxyfleet-loadgen.*/tmp/canary-" 2>/dev/null || true; kubectl delete ns e2e-canary --wait=false >/dev/null 2>&1 || true' EXIT

# The example, with 5 replicas and a canary strategy analysed every 10 s.
strategy() { # strategy SOURCE_YAML
  cat <<YAML
  strategy:
    canary:
      steps:
        - setWeight: 20
        - analysis: {interval: 10s, window: 20s, count: 2, failureLimit: 0, minRequests: 20, source: $1, metrics: [{name: p99, p99LatencyMs: {max: 200}}, {name: errors, errorRate5xx: {max: 5}}]}
        - setWeight: 50
        - analysis: {interval: 10s, window: 20s, count: 1, failureLimit: 0, minRequests: 20, source: $1, metrics: [{name: p99, p99LatencyMs: {max: 200}}, {name: errors, errorRate5xx: {max: 5}}]}
        - setWeight: 100
YAML
}
PROM_SOURCE="{prometheus: {address: 'http://$PROM_ADDR'}}"
sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/; s/^  replicas: 2$/  replicas: 5/" "$root/examples/basic.yaml" > /tmp/canary-base.yaml
{ cat /tmp/canary-base.yaml; strategy "$PROM_SOURCE"; } | kubectl apply -n "$ns" -f - >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "demo not Ready"

ip=$(kubectl get svc -n "$ns" demo -o jsonpath='{.spec.clusterIP}')
kubectl get secret -n "$ns" demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > /tmp/canary-ca.crt
# Pods Ready precedes kube-proxy programming the Service by a moment: wait until it answers.
retry 30 curl -fsS --max-time 3 --cacert /tmp/canary-ca.crt --resolve "demo.example.com:443:$ip" https://demo.example.com/
load() { # load SECONDS SUMMARY_FILE — 40 req/s through the Service, new connections regularly
  "$LOADGEN" --url https://demo.example.com/ --connect "$ip:443" --ca /tmp/canary-ca.crt --rate 40 --workers 4 \
    --new-conn-every 25 --duration "${1}s" --summary "$2" >/dev/null 2>>/tmp/canary-load.err &
  LOAD_PID=$!
}
phase() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.phase}'; }
# Canary pods the Service still sends traffic to (ready endpoints named demo-canary-*).
canary_pods() { kubectl get endpointslices -n "$ns" -l kubernetes.io/service-name=demo -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.targetRef.name}{"\n"}{end}' | grep -c '^demo-canary-' || true; }
route_patch() { kubectl patch -n "$ns" pxd/demo --type=json -p "[{\"op\":\"replace\",\"path\":\"/spec/routes/0\",\"value\":$1}]" >/dev/null; }
wait_phase() { # wait_phase PHASE SECONDS
  local end=$(( $(date +%s) + $2 ))
  while [ "$(phase)" != "$1" ]; do
    [ "$(date +%s)" -lt "$end" ] || { kubectl get pxd -n "$ns" demo -o yaml | sed -n '/^status:/,$p' >&2; fail "phase $(phase), wanted $1"; }
    sleep 1
  done
}
# Seconds from the first failed measurement to no canary pod serving.
# Occurrences of an event reason on pxd/demo (events.k8s.io series are counted).
event_total() {
  kubectl get events.events.k8s.io -n "$ns" --field-selector "regarding.name=demo,reason=$1" -o json \
    | jq '[.items[] | (.series.count // 1)] | add // 0'
}
canary_rev() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.canaryRevision}'; }
time_to_rollback() { # time_to_rollback PREVIOUS_CANARY_REVISION
  local first_bad="" t
  # Wait for the new rollout first: the previous one may still show Aborted.
  retry 60 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.canaryRevision}')\" != '$1' ]"
  local end=$(( $(date +%s) + 180 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    if [ -z "$first_bad" ] && kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.metrics[*].failures}' | grep -q '[1-9]'; then
      first_bad=$(date +%s)
    fi
    if [ "$(phase)" = Aborted ] && [ "$(canary_pods)" = 0 ]; then
      t=$(date +%s); echo $(( t - ${first_bad:-$t} )); return 0
    fi
    sleep 1
  done
  return 1
}

say "1. healthy canary: 20% → analysis → 50% → analysis → 100% → promoted"
load 150 /tmp/canary-healthy.json
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"6s","retries":{"attempts":1}}'
wait_phase Completed 150
kill -TERM $LOAD_PID; wait $LOAD_PID
kubectl get pxd -n "$ns" demo
# 3 weight steps and 2 analysis steps, each completed exactly once.
[ "$(event_total StepCompleted)" = 3 ] || fail "StepCompleted $(event_total StepCompleted) times, want 3"
[ "$(event_total AnalysisPassed)" = 2 ] || fail "AnalysisPassed $(event_total AnalysisPassed) times, want 2"
say "healthy rollout load: $(cat /tmp/canary-healthy.json)"
grep -q '"status_5xx": 0, "errors": 0' /tmp/canary-healthy.json || fail "requests failed during a healthy rollout"
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=120s >/dev/null
# The finished canary's Deployment is collected: the operator finds it through its owner index.
retry 60 bash -c "! kubectl get deploy -n $ns demo-canary"

say "2. canary answering 5xx on 20% (Prometheus source) → automatic rollback"
load 120 /tmp/canary-bad.json
prev=$(canary_rev)
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"6s","fault":{"abort":{"status":503,"percent":20}}}'
t=$(time_to_rollback "$prev") || fail "no rollback after 5xx"
say "first bad measurement → all traffic on stable: ${t}s (analysis interval 10s)"
echo "$t" > /tmp/canary-rollback-5xx-prometheus.txt
kubectl get pxd -n "$ns" demo -o jsonpath='{.status.conditions[?(@.type=="Degraded")].reason}' | grep -q RolloutAborted || fail "not Degraded/RolloutAborted"
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID

say "3. canary adding 300ms (P99) → rollback on latency"
prev=$(canary_rev)
{ cat /tmp/canary-base.yaml; strategy "$PROM_SOURCE"; } | kubectl apply -n "$ns" -f - >/dev/null
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"6s","fault":{"delay":{"duration":"300ms","percent":100}}}'
load 120 /tmp/canary-slow.json
t=$(time_to_rollback "$prev") || fail "no rollback on latency"
# The reason must be latency: every query is scoped to the canary's revision, so the 5xx of
# scenario 2's aborted canary cannot leak into this window.
msg=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.message}')
<<<"$msg" grep -q p99 || fail "abort reason does not name p99: $msg"
say "latency rollback after ${t}s"
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID

say "4. 5xx canary with the direct source, Prometheus stopped"
stop_prometheus
prev=$(canary_rev)
{ cat /tmp/canary-base.yaml; strategy "{}"; } | kubectl apply -n "$ns" -f - >/dev/null
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"5s","fault":{"abort":{"status":503,"percent":20}}}'
load 120 /tmp/canary-direct.json
t=$(time_to_rollback "$prev") || fail "no rollback with the direct source"
say "direct source: first bad measurement → all traffic on stable: ${t}s"
echo "$t" > /tmp/canary-rollback-5xx-direct.txt
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID

say "5. operator killed in the middle of a step → resumes, no step repeated or skipped"
{ cat /tmp/canary-base.yaml; strategy "{}"; } | kubectl apply -n "$ns" -f - >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=120s >/dev/null || true
steps_before=$(event_total StepCompleted); analyses_before=$(event_total AnalysisPassed)
load 150 /tmp/canary-restart.json
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"4s"}'
retry 60 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Analyzing ]"
kubectl delete pod -n proxyfleet-system -l app.kubernetes.io/name=proxyfleet-operator --wait=false >/dev/null
wait_phase Completed 180
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID
steps=$(( $(event_total StepCompleted) - steps_before )); analyses=$(( $(event_total AnalysisPassed) - analyses_before ))
[ "$steps" = 3 ] && [ "$analyses" = 2 ] || fail "across the restart: $steps weight steps (want 3), $analyses analyses (want 2)"
say "every step completed exactly once across the restart"

say "6. Prometheus unreachable → errors, abort by consecutiveErrorLimit, never a pass"
cat /tmp/canary-base.yaml > /tmp/canary-unreach.yaml
cat >> /tmp/canary-unreach.yaml <<YAML
  strategy:
    canary:
      steps:
        - setWeight: 20
        - analysis: {interval: 5s, count: 3, consecutiveErrorLimit: 2, source: {prometheus: {address: 'http://10.244.0.1:9'}}, metrics: [{name: errors, errorRate5xx: {max: 5}}]}
        - setWeight: 100
YAML
kubectl apply -n "$ns" -f /tmp/canary-unreach.yaml >/dev/null
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"3s"}'
wait_phase Aborted 120
kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.message}' | grep -q consecutiveErrorLimit || fail "abort does not cite consecutiveErrorLimit"
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.metrics[0].successes}')" = 0 ] || fail "an unreachable source counted as a success"

say "kubectl proxyfleet status exits non-zero on an aborted rollout"
"$PLUGIN" get pxd demo -n "$ns" >&2
if "$PLUGIN" -n "$ns" status demo --timeout 10 >/dev/null 2>&1; then fail "status exited 0"; fi

say "7. undo: back to the previous stable revision (the one scenario 5 promoted)"
"$PLUGIN" -n "$ns" history demo >&2
[ "$("$PLUGIN" -n "$ns" history demo | tail -n +2 | wc -l)" -ge 2 ] || fail "fewer than 2 stable revisions kept"
"$PLUGIN" -n "$ns" undo demo >&2 || fail "undo failed"
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.spec.routes[0].timeout}')" = 4s ] || fail "undo did not restore the route of scenario 5"
# Stable still runs that revision: the aborted rollout ends at once, nothing to roll out.
"$PLUGIN" -n "$ns" status demo --timeout 60 >/dev/null || fail "not healthy after undo"

say "8. kubectl proxyfleet promote: a rollout held at an open pause goes on when told"
{ cat /tmp/canary-base.yaml; cat <<YAML
  strategy:
    canary:
      steps:
        - setWeight: 20
        - pause: {}
        - setWeight: 100
YAML
} | kubectl apply -n "$ns" -f - >/dev/null
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"8s"}'
wait_phase Paused 150
sleep 5
[ "$(phase)" = Paused ] || fail "an open pause ended on its own: $(phase)"
"$PLUGIN" -n "$ns" promote demo >&2 || fail "kubectl proxyfleet promote failed"
wait_phase Completed 150
[ -z "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.metadata.annotations.proxyfleet\.io/command}')" ] \
  || fail "the command annotation was left on the fleet"
"$PLUGIN" -n "$ns" status demo --timeout 120 >/dev/null || fail "not healthy after the promotion"
say "promoted past the pause; the command is gone"

say "9. kubectl proxyfleet pause, resume, abort and retry, each acted on once"
step() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.currentStepIndex}'; }
command_gone() { [ -z "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.metadata.annotations.proxyfleet\.io/command}')" ]; }
at() { [ "$(phase)/$(step)" = "$1" ]; }
left_pause() { [ "$(phase)" != Paused ]; }
no_canary_pods() { [ "$(canary_pods)" = 0 ]; }
{ cat /tmp/canary-base.yaml; cat <<YAML
  strategy:
    canary:
      steps:
        - setWeight: 20
        - analysis: {interval: 10s, window: 20s, count: 3, failureLimit: 0, minRequests: 20, source: {}, metrics: [{name: errors, errorRate5xx: {max: 5}}]}
        - setWeight: 100
YAML
} | kubectl apply -n "$ns" -f - >/dev/null
load 300 /tmp/canary-commands.json
route_patch '{"name":"all","match":{"pathPrefix":"/"},"upstream":"echo","timeout":"9s"}'
retry 120 at Analyzing/1
"$PLUGIN" -n "$ns" pause demo >&2 || fail "kubectl proxyfleet pause failed"
wait_phase Paused 60
kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.message}' | grep -q 'paused by request' || fail "the pause does not say it was asked for"
retry 30 command_gone
sleep 25 # longer than the analysis would take
at Paused/1 || fail "a paused rollout moved on: $(phase)/$(step)"
"$PLUGIN" -n "$ns" resume demo >&2 || fail "kubectl proxyfleet resume failed"
retry 60 left_pause
retry 30 command_gone
say "paused at the analysis for 25 s and resumed: $(phase) at step $(step)"
"$PLUGIN" -n "$ns" abort demo >&2 || fail "kubectl proxyfleet abort failed"
wait_phase Aborted 60
retry 60 no_canary_pods
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.abortReason}')" = ManualAbort ] \
  || fail "abort reason $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.abortReason}'), want ManualAbort"
retry 30 command_gone
say "aborted by request: no canary pod serving"
"$PLUGIN" -n "$ns" retry demo >&2 || fail "kubectl proxyfleet retry failed"
wait_phase Completed 180
kill -TERM $LOAD_PID 2>/dev/null || true; wait $LOAD_PID
retry 30 command_gone
[ "$(event_total RolloutRetried)" = 1 ] || fail "RolloutRetried $(event_total RolloutRetried) times, want 1"
say "retried from the first step and promoted; load: $(cat /tmp/canary-commands.json)"
grep -q '"status_5xx": 0, "errors": 0' /tmp/canary-commands.json || fail "requests failed across pause, abort and retry"
say "ok"
