#!/usr/bin/env bash
# Operator footprint at scale on the real local cluster: RSS idle, then with N ProxyDeployments
# (replicas 0, managed TLS: every one gets its ConfigMap, Deployment, Services, leaf Secret),
# time until all have reported status, and API writes of a quiet resync (should be 0).
# The operator runs as a process (release build) against the cluster's kubeconfig.
#   Usage: bench/operator-scale.sh [N]    (default 200; prints a Markdown table)
#   PROXYFLEET_OPERATOR=path runs that binary instead of the release build.
#   OPERATOR_LATE=1 creates the fleets first, then starts the operator over them.
#   CREATORS=K creates the fleets with K kubectl processes at once (default 4).
#   LATER=SECONDS also reports RSS that long after the quiet figure (caches that age out, such
#   as the event recorder's six-minute window).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/e2e/lib/testlib.sh"
n=${1:-200}
"$root/e2e/cluster" up >/dev/null
[ -x "$CARGO_TARGET_DIR_RELEASE/proxyfleet-operator" ] || "$root/e2e/images/build" >/dev/null
kubectl apply -f "$root/crds/" >/dev/null
kubectl -n proxyfleet-system scale deploy/proxyfleet-operator --replicas=0 >/dev/null 2>&1 || true
if kubectl get ns pf-scale >/dev/null 2>&1; then
  kubectl delete ns pf-scale --wait=true >/dev/null
  # The API server looks a namespace up in etcd on every request in it for 30 s after a delete
  # of that name (NamespaceLifecycle's forceLiveLookupTTL): 8 631 extra reads in one run.
  sleep 31
fi
kubectl create ns pf-scale >/dev/null
OP=
start_operator() {
  "${PROXYFLEET_OPERATOR:-$CARGO_TARGET_DIR_RELEASE/proxyfleet-operator}" --metrics-addr 127.0.0.1:18099 --log-format text >/tmp/operator-scale.log 2>&1 &
  OP=$!
}
# KEEP=1 leaves the fleets in place (to measure an operator restarted over them).
trap '[ -z "$OP" ] || kill $OP 2>/dev/null || true; [ "${KEEP:-0}" = 1 ] || kubectl delete ns pf-scale --wait=false >/dev/null 2>&1 || true' EXIT
rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' /proc/$OP/status; }
# CPU while statuses are written: the machine's busy share (/proc/stat) and each party's
# seconds (/proc/PID/stat), to tell the operator's latency from the API server's throughput.
machine_ticks() { awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }
party_ticks() { # party_ticks: "name ticks" per control-plane process and the operator
  local p
  for p in $(pgrep -x kube-apiserver) $(pgrep -x etcd) $(pgrep -x kube-controller) ${OP:-}; do
    awk -v n="$(cat /proc/$p/comm)" -v p="$p" '{print n "/" p, $14 + $15}' /proc/$p/stat 2>/dev/null || true
  done
}
mark() { # the start of the measured time
  t0=$(date +%s.%N)
  read -r busy0 idle0 < <(machine_ticks)
  parties0=$(party_ticks)
}
writes() { curl -s 127.0.0.1:18099/metrics | awk '/^proxyfleet_operator_api_writes_total/ {s += $2} END {print s + 0}'; }
# OPERATOR_LATE=1: the fleets are created first and the operator started over them, so the
# status time is the operator's own (no API server work for kubectl's creations beside it).
late=${OPERATOR_LATE:-0}
idle="–"
if [ "$late" = 0 ]; then
  start_operator
  sleep 5
  idle="$(rss) MiB"
fi
fleet() {
  cat <<YAML
---
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: fleet-$1}
spec:
  replicas: 0
  listeners: [{name: https, port: 8443, servicePort: 443, hostnames: [fleet-$1.example.com]}]
  routes: [{name: all, match: {pathPrefix: /}, upstream: app}]
  upstreams: [{name: app, dns: {name: app.pf-scale.svc.cluster.local, port: 8080}}]
YAML
}
# One kubectl creates about 25 objects a second (its client-side limit of 50 requests a second,
# a GET and a POST per object), which alone took 40 s for 1 000: the fleets are created by
# CREATORS kubectl processes at once (default 4), as a CD tool syncing many apps would.
creators=${CREATORS:-4}
# Status is noticed by a watch (a list of all 1 000 every second loaded the API server, the
# measured party, with ~3 MB of JSON each time): done when every fleet has reported status for
# its generation.
rm -f /tmp/operator-scale.converged
timeout 900 kubectl get pxd -n pf-scale --watch -o jsonpath='{.metadata.name} {.metadata.generation} {.status.observedGeneration}{"\n"}' |
  { declare -A seen=(); count=0; while read -r name gen observed; do
      if [ "$gen" = "$observed" ] && [ -z "${seen[$name]:-}" ]; then seen[$name]=1; count=$((count + 1)); fi
      if [ "$count" -ge "$n" ]; then date +%s.%N > /tmp/operator-scale.converged; break; fi
    done; } &
watching=$!
mark
creating=()
for c in $(seq 0 $((creators - 1))); do
  seq $((c + 1)) "$creators" "$n" | while read -r i; do fleet "$i"; done | kubectl apply -n pf-scale -f - >/dev/null &
  creating+=($!)
done
for pid in "${creating[@]}"; do wait "$pid"; done
applied=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
status_from="kubectl's first creation"
if [ "$late" = 1 ]; then
  start_operator
  mark
  status_from="the operator's start, all created before"
fi
until [ -s /tmp/operator-scale.converged ]; do
  [ "$(echo "$(date +%s) - $t0 < 600" | bc)" = 1 ] || { echo "not all reconciled in 600 s" >&2; exit 1; }
  sleep 0.2
done
kill "$watching" 2>/dev/null || true
converged=$(printf %.1f "$(echo "$(cat /tmp/operator-scale.converged) - $t0" | bc)")
read -r busy1 idle1 < <(machine_ticks)
busy_share=$(( 100 * (busy1 - busy0) / (busy1 - busy0 + idle1 - idle0) ))
hz=$(getconf CLK_TCK)
cpu_split=$(join <(sort <<<"$parties0") <(party_ticks | sort) | awk -v hz="$hz" '{printf "%s%s %.1f s", sep, $1, ($3 - $2) / hz; sep = ", "}')
loaded=$(rss)
# Quiet means every fleet is Ready (the controller-manager has processed every Deployment).
until [ "$(kubectl get pxd -n pf-scale -o json | jq '[.items[] | select(.status.phase == "Ready")] | length')" = "$n" ]; do
  [ "$(echo "$(date +%s) - $t0 < 900" | bc)" = 1 ] || { echo "not all Ready in 900 s" >&2; exit 1; }
  sleep 2
done
ready=$(printf %.0f "$(echo "$(date +%s) - $t0" | bc)")
sleep 20
curl -s 127.0.0.1:18099/metrics | grep '^proxyfleet_operator_api_writes_total' > /tmp/operator-scale-writes.0
w0=$(writes); sleep 60; w1=$(writes)
curl -s 127.0.0.1:18099/metrics | grep '^proxyfleet_operator_api_writes_total' > /tmp/operator-scale-writes.1
diff /tmp/operator-scale-writes.0 /tmp/operator-scale-writes.1 >&2 || true
steady=$(rss)
objects=$(kubectl get deploy,svc,cm,secret -n pf-scale --no-headers | wc -l)
cat <<MD
| measure | value |
|---|---|
| operator RSS idle (no ProxyDeployments) | $idle |
| ProxyDeployments | $n ($objects owned objects) |
| time kubectl took to create all $n | ${applied} s |
| time until all $n reported status (from $status_from) | ${converged} s |
| machine CPU busy in that time (both cores) | ${busy_share} % |
| CPU seconds in that time | ${cpu_split} |
| operator RSS right after | $loaded MiB |
| time until all $n Ready | ${ready} s |
| operator RSS when quiet | $steady MiB |
| API writes in 60 s of quiet resync | $(( w1 - w0 )) |
MD
if [ -n "${LATER:-}" ]; then
  sleep "$LATER"
  echo "| operator RSS ${LATER} s after that | $(rss) MiB |"
fi
