# Installs the chart (operator + CRD) into the local cluster once; sourced by e2e tests.
install_operator() {
  "$root/e2e/cluster" load-image "$PROXYFLEET_CACHE/images/proxy.tar" "$PROXYFLEET_CACHE/images/operator.tar" >/dev/null
  if ! helm status proxyfleet -n proxyfleet-system >/dev/null 2>&1; then
    say "helm install charts/proxyfleet"
    helm install proxyfleet "$root/charts/proxyfleet" -n proxyfleet-system --create-namespace --wait --timeout 180s >/dev/null \
      || fail "helm install failed"
  fi
  kubectl apply -f "$root/crds/" >/dev/null   # keep the CRD current with the code under test
  retry 120 kubectl rollout status -n proxyfleet-system deploy/proxyfleet-operator --timeout=5s
}

# The example, in namespace $1.
apply_example() {
  local ns=$1
  sed "s/echo.default.svc.cluster.local/echo.$ns.svc.cluster.local/" "$root/examples/basic.yaml" | kubectl apply -n "$ns" -f - >/dev/null
}

# curl through the fleet's Service with the managed CA: https_get NS PXD PATH
https_get() {
  local ns=$1 pxd=$2 path=$3 ip ca
  ip=$(kubectl get svc -n "$ns" "$pxd" -o jsonpath='{.spec.clusterIP}')
  ca=$(mktemp)
  kubectl get secret -n "$ns" "$pxd-tls" -o jsonpath='{.data.ca\.crt}' | base64 -d > "$ca"
  curl -fsS --max-time 5 --cacert "$ca" --resolve "demo.example.com:443:$ip" "https://demo.example.com$path"
  local rc=$?
  rm -f "$ca"
  return $rc
}

leader_pod() {
  kubectl get lease -n proxyfleet-system proxyfleet-operator -o jsonpath='{.spec.holderIdentity}'
}

operator_metric() { # operator_metric NAME_REGEX — summed over the leader's /metrics
  local pod ip
  pod=$(leader_pod)
  ip=$(kubectl get pod -n proxyfleet-system "$pod" -o jsonpath='{.status.podIP}')
  curl -fsS --max-time 5 "http://$ip:8080/metrics" | awk -v re="$1" '$0 !~ /^#/ && $1 ~ re { s += $2 } END { print s + 0 }'
}
