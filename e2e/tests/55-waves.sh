#!/usr/bin/env bash
# Rollouts across clusters in waves, on real control planes: the main cluster is the hub, three
# member control planes (member-4..6, --control-plane-only) run their own operator as a process.
# Waves: "first" = member-4, "second" = tier=prod (member-5, member-6, one at a time), soak 8 s.
# Checks: a healthy change walks first → second in order (timings printed); a change that breaks
# the fleet in wave 1 aborts there and never reaches wave 2 (their specs compared before and
# after); a member the hub cannot reach (an iptables partition) holds its wave, shown in status;
# a hub operator restart mid-wave repeats no transition. Members have no node, so their fleets
# run 0 replicas: each member's own operator still judges its own fleet (Ready, canary phase)
# and the hub reads only that.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

install_operator
ns=$(test_namespace e2e-waves)
members=(member-4 member-5 member-6)
mk() { kubectl --kubeconfig "/var/lib/proxyfleet/clusters/$1/admin.kubeconfig" "${@:2}"; }
MEMBER_PIDS=()
PARTITIONED=""
cleanup() {
  [ -n "$PARTITIONED" ] && partition -D
  [ -n "${E2E_KEEP:-}" ] && return 0
  kubectl delete pxd -n "$ns" --all --timeout=30s >/dev/null 2>&1 || true
  for p in "${MEMBER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  kubectl delete ns "$ns" --wait=false >/dev/null 2>&1 || true
  for m in "${members[@]}"; do
    kubectl delete secret -n proxyfleet-system "$m" --ignore-not-found >/dev/null 2>&1 || true
    "$root/e2e/cluster" down --name "$m" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

start_member() { # start_member N
  local m=member-$1
  KUBECONFIG=/var/lib/proxyfleet/clusters/$m/admin.kubeconfig RUST_LOG=info,kube=warn \
    "$CARGO_TARGET_DIR_RELEASE/proxyfleet-operator" --metrics-addr "127.0.0.1:1819$1" --log-format text \
    --clusters-namespace proxyfleet-system >>"/tmp/operator-$m.log" 2>&1 &
  MEMBER_PIDS+=($!)
}
kubeconfig_for_hub() {
  kubectl --kubeconfig "/var/lib/proxyfleet/clusters/$1/admin.kubeconfig" config view --raw --flatten --minify \
    | sed "s#https://127.0.0.1:#https://10.244.0.1:#"
}
for i in 4 5 6; do
  m=member-$i
  "$root/e2e/cluster" up --name "$m" --control-plane-only >/dev/null 2>&1 || fail "could not start $m"
  mk "$m" apply -f "$root/crds/" >/dev/null
  retry 30 mk "$m" get crd proxydeployments.proxyfleet.io
  retry 60 mk "$m" wait --for=condition=Established crd/proxydeployments.proxyfleet.io --timeout=10s
  : >"/tmp/operator-$m.log"
  start_member "$i"
  kubectl create secret generic "$m" -n proxyfleet-system --from-file=kubeconfig=<(kubeconfig_for_hub "$m") \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  tier=prod; [ "$m" = member-4 ] && tier=canary
  kubectl label secret -n proxyfleet-system "$m" proxyfleet.io/cluster=true e2e=waves tier=$tier --overwrite >/dev/null
  kubectl annotate secret -n proxyfleet-system "$m" proxyfleet.io/allowed-namespaces="$ns" --overwrite >/dev/null
done
say "members up, their operators run as processes (pids ${MEMBER_PIDS[*]})"

cat >/tmp/e2e-waves.yaml <<EOF
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: demo}
spec:
  replicas: 0
  listeners: [{name: https, port: 8443, servicePort: 443, hostnames: [demo.example.com]}]
  routes: [{name: all, match: {pathPrefix: /}, upstream: echo, timeout: 5s}]
  upstreams: [{name: echo, endpoints: ["10.244.0.1:9"]}]
  placement:
    clusterSelector: {matchLabels: {e2e: waves}}
    waves:
      - {name: first, clusters: [member-4]}
      - {name: second, clusterSelector: {matchLabels: {tier: prod}}, maxUnavailableClusters: 1}
    soakTime: 8s
    waveTimeout: 45s
EOF
kubectl apply -n "$ns" -f /tmp/e2e-waves.yaml >/dev/null
waves() { kubectl get pxd -n "$ns" demo -o json | jq -c '.status.waves | {phase, currentWave, revision, message}'; }
rev_of() { mk "$1" get pxd -n "$ns" demo -o jsonpath='{.metadata.annotations.proxyfleet\.io/hub-revision}' 2>/dev/null; }
retry 180 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.waves.phase}' | grep -qx Completed" \
  || fail "the first rollout did not complete: $(waves)"
r1=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.waves.revision}')
for m in "${members[@]}"; do [ "$(rev_of "$m")" = "$r1" ] || fail "$m is not on $r1 after the first rollout"; done
say "first rollout completed in every wave: $(waves)"

say "a healthy change: wave first (member-4), soak, then wave second one cluster at a time"
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"drain":{"deadline":"21s"}}}' >/dev/null
t0=$(date +%s%N)
r2=""; until [ -n "$r2" ] && [ "$r2" != "$r1" ]; do r2=$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.waves.revision}'); sleep 0.2; done
declare -A got=()
while [ ${#got[@]} -lt 3 ]; do
  for m in "${members[@]}"; do
    [ -n "${got[$m]:-}" ] && continue
    if [ "$(rev_of "$m")" = "$r2" ]; then
      got[$m]=$(( ($(date +%s%N) - t0) / 1000000 ))
      say "$m has $r2 at ${got[$m]} ms ($(waves))"
      if [ "$m" != member-4 ]; then
        [ -n "${got[member-4]:-}" ] || fail "$m got $r2 before wave first"
        [ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.waves.currentWave}')" = 1 ] || fail "$m got $r2 outside wave second"
      fi
    fi
  done
  [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 150 ] || fail "not rolled within 150 s: $(waves)"
  sleep 0.2
done
g4=${got[member-4]}; g5=${got[member-5]}; g6=${got[member-6]}
first2=$(( g5 < g6 ? g5 : g6 )); second2=$(( g5 < g6 ? g6 : g5 ))
gap=$(( first2 - g4 ))
[ "$gap" -ge 8000 ] || fail "wave second started ${gap} ms after wave first: before the 8 s soak"
[ $(( second2 - first2 )) -gt 0 ] || fail "member-5 and member-6 got it at once despite maxUnavailableClusters: 1"
retry 120 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.waves.phase}' | grep -qx Completed" || fail "not completed: $(waves)"
say "completed: wave first at $g4 ms, wave second at $first2 ms and $second2 ms (soak 8 s, one cluster at a time)"
kubectl get events -n "$ns" --field-selector involvedObject.name=demo -o json \
  | jq -r '.items[] | select(.reason | startswith("Wave")) | "\(.lastTimestamp // .eventTime) \(.reason): \(.message)"' | tail -6 >&2
announced_once kubectl "$ns" demo
say "every wave transition of both rollouts announced once"

say "a change that breaks the fleet in wave first: aborts there, wave second never gets it"
before5=$(mk member-5 get pxd -n "$ns" demo -o json | jq -S .spec); before6=$(mk member-6 get pxd -n "$ns" demo -o json | jq -S .spec)
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"tls":{"managed":null,"secretName":"no-such-secret"}}}' >/dev/null
retry 30 bash -c "[ \"\$(kubectl --kubeconfig /var/lib/proxyfleet/clusters/member-4/admin.kubeconfig get pxd -n $ns demo -o jsonpath='{.spec.tls.secretName}')\" = no-such-secret ]" \
  || fail "wave first did not get the bad change"
retry 90 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.waves.phase}' | grep -qx Aborted" || fail "did not abort: $(waves)"
say "aborted: $(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.waves.abortReason}')"
sleep 5
[ "$(mk member-5 get pxd -n "$ns" demo -o json | jq -S .spec)" = "$before5" ] || fail "member-5's spec changed after the abort"
[ "$(mk member-6 get pxd -n "$ns" demo -o json | jq -S .spec)" = "$before6" ] || fail "member-6's spec changed after the abort"
say "member-5 and member-6 still run $r2's spec, unchanged"

say "the fix (back to the previous spec) rolls out; the hub is cut off from member-5: its wave holds"
# A real partition: the pod network (the hub operator) gets resets from member-5's API server
# port; member-5 itself and its own operator (on loopback) carry on.
port5=$(mk member-5 config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's#.*:##')
partition() { iptables "$1" INPUT -p tcp -s 10.244.0.0/16 --dport "$port5" -j REJECT --reject-with tcp-reset; }
partition -I
PARTITIONED=1
kubectl patch pxd -n "$ns" demo --type=merge -p '{"spec":{"tls":{"managed":{},"secretName":null},"drain":{"deadline":"22s"},"placement":{"waveTimeout":"10m"}}}' >/dev/null
retry 90 bash -c "kubectl get pxd -n $ns demo -o json | jq -e '.status.waves.currentWave == 1 and (.status.waves.message // \"\" | test(\"member-5 \\\\(unreachable\\\\)\"))'" \
  || fail "the hold is not shown: $(waves)"
say "held and shown: $(waves)"

say "the hub operator restarts mid-wave: no transition is repeated"
count() { kubectl get events -n "$ns" --field-selector involvedObject.name=demo -o json | jq "[.items[] | select(.reason | startswith(\"Wave\")) | (.series.count // .count // 1)] | add"; }
n0=$(count)
kubectl rollout restart -n proxyfleet-system deploy/proxyfleet-operator >/dev/null
retry 120 kubectl rollout status -n proxyfleet-system deploy/proxyfleet-operator --timeout=5s
sleep 10
[ "$(kubectl get pxd -n "$ns" demo -o jsonpath='{.status.waves.currentWave}')" = 1 ] || fail "the wave moved back: $(waves)"
[ "$(count)" = "$n0" ] || fail "events repeated after the restart: $n0 -> $(count)"
say "no event repeated ($n0 wave events), still holding wave second"
partition -D; PARTITIONED=""
retry 120 bash -c "kubectl get pxd -n $ns demo -o jsonpath='{.status.waves.phase}' | grep -qx Completed" || fail "not completed after member-5 came back: $(waves)"
say "member-5 reachable again: completed in every wave: $(waves)"
"$PLUGIN" -n "$ns" get pxd demo | grep -A8 "├─ waves" >&2 || fail "kubectl proxyfleet get shows no waves"
say "waves e2e passed"
