#!/usr/bin/env bash
# Issue 16 on the real cluster: a bad revision is never promoted and every failure says why.
# 1. the demo's exact strategy (background analysis only) with a 30 % 5xx canary → Aborted,
#    never Completed, each weight judged; the same fault with a blocking analysis step;
# 2. a Deployment the API server refuses → Degraded/ApplyFailed quoting it, retried with backoff;
# 3. proxy pods that crash → Degraded/ProgressDeadlineExceeded quoting the proxy's own error,
#    and the same as a canary revision → aborted with that reason;
# 4. the operator never restarted.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-safety)
LOADGEN=$CARGO_TARGET_DIR_RELEASE/proxyfleet-loadgen
trap 'pkill -f "proxyfleet-loadgen.*e2e-safety" 2>/dev/null || true; kubectl delete ns e2e-safety --wait=false >/dev/null 2>&1 || true' EXIT
operator_restarts() { echo $(( $(kubectl get pods -n proxyfleet-system -l app.kubernetes.io/name=proxyfleet-operator -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{"+"}{end}0') )); }
restarts_before=$(operator_restarts)
event_total() { # event_total PXD REASON — occurrences (events.k8s.io series counted)
  kubectl get events.events.k8s.io -n "$ns" --field-selector "regarding.name=$1,reason=$2" -o json | jq '[.items[] | (.series.count // 1)] | add // 0'
}

# The demo's fleet and strategy, word for word (scripts/demo.sh).
DEMO_STRATEGY='{"spec":{"replicas":3,"strategy":{"canary":{
  "steps":[{"setWeight":34},{"pause":{"duration":"15s"}},{"setWeight":67},{"pause":{"duration":"15s"}},{"setWeight":100}],
  "analysis":{"interval":"10s","window":"20s","minRequests":10,"metrics":[{"name":"errors","errorRate5xx":{"max":5}},{"name":"p99","p99LatencyMs":{"max":250}}]}}}}}'
apply_example "$ns"
kubectl patch pxd -n "$ns" demo --type=merge -p "$DEMO_STRATEGY" >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/demo --timeout=180s >/dev/null || fail "demo not Ready"
ip=$(kubectl get svc -n "$ns" demo -o jsonpath='{.spec.clusterIP}')
kubectl get secret -n "$ns" demo-tls -o jsonpath='{.data.ca\.crt}' | base64 -d > /tmp/safety-ca.crt
retry 30 curl -fsS --max-time 3 --cacert /tmp/safety-ca.crt --resolve "demo.example.com:443:$ip" https://demo.example.com/

phase() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.phase}'; }
canary_rev() { kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.canaryRevision}'; }
canary_pods() { kubectl get endpointslices -n "$ns" -l kubernetes.io/service-name=demo -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.targetRef.name}{"\n"}{end}' | grep -c '^demo-canary-' || true; }
load() { # load SECONDS SUMMARY — the demo's 20 req/s
  "$LOADGEN" --url https://demo.example.com/e2e-safety --connect "$ip:443" --ca /tmp/safety-ca.crt --rate 20 --workers 2 \
    --duration "${1}s" --summary "$2" >/dev/null 2>>/tmp/safety-load.err &
  LOAD_PID=$!
}
# Follows a bad rollout to its end: never Completed; prints seconds from the first failing
# measurement to no canary pod serving, and the weights the canary reached.
follow_bad_rollout() { # follow_bad_rollout PREVIOUS_CANARY_REVISION LABEL
  local first_bad="" t weights="" w end=$(( $(date +%s) + 240 ))
  retry 60 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.canaryRevision}')\" != '$1' ]"
  while [ "$(date +%s)" -lt "$end" ]; do
    case "$(phase)" in Promoting|Completed) kubectl get pxd -n "$ns" demo -o yaml | sed -n '/^status:/,$p' >&2; fail "$2: a 30 % 5xx canary was promoted";; esac
    w=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.weight}')
    [[ " $weights " == *" $w "* ]] || weights="$weights $w"
    if [ -z "$first_bad" ] && kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.metrics[*].failures}' | grep -q '[1-9]'; then
      first_bad=$(date +%s)
    fi
    if [ "$(phase)" = Aborted ] && [ "$(canary_pods)" = 0 ]; then
      t=$(date +%s); say "$2: aborted; weights seen:$weights; first failing measurement → all traffic on stable: $(( t - ${first_bad:-$t} ))s"
      echo $(( t - ${first_bad:-$t} )); return 0
    fi
    sleep 1
  done
  fail "$2: no abort within 240s (phase $(phase))"
}
fault='{"op":"add","path":"/spec/routes/0/fault","value":{"abort":{"status":503,"percent":30}}}'

say "1a. the demo's strategy (background analysis only) + 30 % 5xx → aborted, never promoted"
load 150 /tmp/safety-bg.json
prev=$(canary_rev)
kubectl patch pxd -n "$ns" demo --type=json -p "[$fault]" >/dev/null
t=$(follow_bad_rollout "$prev" "background analysis")
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID || true
msg=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.message}')
<<<"$msg" grep -q "metric errors failed 2 times" || fail "abort message: $msg"
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.abortReason}')" = AnalysisFailed ] || fail "abortReason"
[ "$t" -le 25 ] || fail "took ${t}s from the first failing measurement to stable (goal ≤ 2 intervals = 20s)"
[ "$(event_total demo StepCompleted)" = 0 ] || fail "a step was completed while every measurement failed"
[ "$(event_total demo RolloutCompleted)" = 0 ] || fail "the bad canary completed"
echo "$t" > /tmp/safety-rollback-background.txt

say "1b. the same fault judged by a blocking analysis step"
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"remove","path":"/spec/routes/0/fault"}]' >/dev/null
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"strategy":{"canary":{"analysis":null,"steps":[{"setWeight":34},
  {"analysis":{"interval":"10s","window":"20s","count":2,"minRequests":10,"metrics":[{"name":"errors","errorRate5xx":{"max":5}}]}},{"setWeight":100}]}}}}' >/dev/null
retry 120 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Idle ] || [ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Completed ]"
load 150 /tmp/safety-step.json
prev=$(canary_rev)
kubectl patch pxd -n "$ns" demo --type=json -p "[$fault]" >/dev/null
t=$(follow_bad_rollout "$prev" "blocking analysis")
kill -TERM $LOAD_PID 2>/dev/null; wait $LOAD_PID || true
[ "$t" -le 25 ] || fail "blocking step took ${t}s from the first failing measurement to stable"
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"remove","path":"/spec/routes/0/fault"}]' >/dev/null

degraded() { # degraded PXD → "reason|message" of its Degraded condition when True
  kubectl get pxd -n "$ns" "$1" -o jsonpath='{range .status.conditions[?(@.type=="Degraded")]}{.status}|{.reason}|{.message}{end}'
}
wait_degraded() { # wait_degraded PXD REASON MESSAGE_PART SECONDS
  local end=$(( $(date +%s) + $4 )) d
  while true; do
    d=$(degraded "$1")
    [[ "$d" == "True|$2|"*"$3"* ]] && { say "$1: Degraded=$d"; return 0; }
    [ "$(date +%s)" -lt "$end" ] || fail "$1: Degraded is '$d', wanted $2 naming '$3'"
    sleep 2
  done
}
small_fleet() { # small_fleet NAME EXTRA_SPEC_YAML [UPSTREAMS_FLOW_YAML]
  local upstreams=${3:-}
  [ -n "$upstreams" ] || upstreams="[{name: echo, dns: {name: echo.$ns.svc.cluster.local, port: 8080}}]"
  kubectl apply -n "$ns" -f - >/dev/null <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: $1}
spec:
  replicas: 1
  progressDeadline: 30s
  listeners: [{name: http, port: 8080, protocol: HTTP}]
  routes: [{name: all, upstream: echo}]
  upstreams: $upstreams
$2
YAML
}

say "2. a Deployment the API server refuses → Degraded/ApplyFailed quoting it; retried with backoff"
small_fleet refused '  pod: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: []}}}}'
wait_degraded refused ApplyFailed "nodeSelectorTerms" 60
logs_since() { kubectl logs -n proxyfleet-system "$(leader_pod)" --since="$1" 2>/dev/null | grep -c "apply refused" || true; }
sleep 60
tries=$(logs_since 60s)
say "apply attempts of the refused fleet in 60 s: $tries (fixed 5 s retries would make 12)"
[ "$tries" -le 4 ] || fail "$tries attempts in 60 s: no backoff"
events=$(event_total refused ApplyFailed)
[ "$events" = 1 ] || fail "$events ApplyFailed events for one distinct failure"
kubectl delete pxd -n "$ns" refused --wait=false >/dev/null

say "2b. an invalid quantity is reported before anything is applied"
small_fleet quantity '  resources: {limits: {cpu: lots}}'
wait_degraded quantity InvalidSpec 'spec.resources.limits.cpu: "lots" is not a quantity' 60
[ -z "$(kubectl get deploy -n "$ns" quantity --ignore-not-found -o name)" ] || fail "a Deployment was created for an invalid spec"
kubectl delete pxd -n "$ns" quantity --wait=false >/dev/null

say "2c. an upstream's CA from a Secret: missing → SecretNotFound naming the field; present → verified TLS"
# From the start: no earlier revision (to echo directly) could answer in its place.
small_fleet front '' "[{name: echo, endpoints: ['demo.$ns.svc.cluster.local:443'], tls: {serverName: demo.example.com, caSecret: no-such-ca}}]"
wait_degraded front SecretNotFound "spec.upstreams[0].tls.caSecret: Secret no-such-ca not found" 60
kubectl patch pxd -n "$ns" front --type=json -p '[{"op":"replace","path":"/spec/upstreams/0/tls/caSecret","value":"demo-tls"}]' >/dev/null
kubectl wait -n "$ns" --for=condition=Ready pxd/front --timeout=120s >/dev/null || fail "front not Ready with the CA Secret"
front_ip=$(kubectl get svc -n "$ns" front -o jsonpath='{.spec.clusterIP}')
[ -z "$(kubectl get pxd -n "$ns" front -o jsonpath='{.status.conditions[?(@.type=="Degraded")].status}' | grep True)" ] || fail "front still Degraded"
retry 30 curl -fsS --max-time 3 "http://$front_ip:8080/through-verified-tls"
say "front → demo over TLS verified by the CA in Secret demo-tls"
kubectl delete pxd -n "$ns" front --wait=false >/dev/null

say "3a. proxy pods that crash → Degraded/ProgressDeadlineExceeded with the proxy's own error"
small_fleet crashing '' >/dev/null
kubectl patch pxd -n "$ns" crashing --type=json -p '[{"op":"add","path":"/spec/upstreams/0/tls","value":{"caFile":"/etc/nope/ca.pem"}}]' >/dev/null
wait_degraded crashing ProgressDeadlineExceeded "/etc/nope/ca.pem" 150
kubectl delete pxd -n "$ns" crashing --wait=false >/dev/null

say "3b. the same fault as a canary revision → aborted at the progress deadline, naming it"
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"progressDeadline":"30s"}}' >/dev/null
retry 120 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Completed ] || [ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Idle ]"
prev=$(canary_rev)
kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"add","path":"/spec/upstreams/0/tls","value":{"caFile":"/etc/nope/ca.pem"}}]' >/dev/null
retry 60 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.canaryRevision}')\" != '$prev' ]"
retry 150 bash -c "[ \"\$(kubectl get pxd -n $ns demo -o jsonpath='{.status.canary.phase}')\" = Aborted ]"
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.abortReason}')" = ProgressDeadlineExceeded ] || fail "abortReason"
msg=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.canary.message}')
say "canary abort: $msg"
<<<"$msg" grep -q "/etc/nope/ca.pem" || fail "the abort does not quote the proxy's error: $msg"
https_get "$ns" demo /still-serving >/dev/null || fail "stable stopped serving"

say "3c. a client CA Secret in another namespace is refused at admission, the field named"
out=$(kubectl patch pxd -n "$ns" demo --type=json -p '[{"op":"add","path":"/spec/listeners/0/clientCaSecret","value":"kube-system/ca"}]' 2>&1 || true)
<<<"$out" grep -q "spec.listeners\[0\].clientCaSecret" || fail "not refused naming the field: $out"

restarts=$(operator_restarts)
[ "$restarts" = "$restarts_before" ] || fail "the operator restarted ($restarts_before → $restarts)"
say "ok"
