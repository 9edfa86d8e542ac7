# cert-manager's own controllers against the local cluster, as a process on the host (built
# from the Go module proxy by e2e/lib/build-acme-peers.sh); sourced by e2e tests.
start_cert_manager() {
  bash "$root/e2e/lib/build-acme-peers.sh" || fail "building cert-manager failed"
  . "$root/e2e/lib/versions.sh"
  kubectl apply --server-side -f "$PROXYFLEET_CACHE/cert-manager-$CERT_MANAGER_VERSION-crds.yaml" >/dev/null \
    || fail "installing cert-manager's CRDs failed"
  retry 60 kubectl wait --for=condition=Established crd/certificates.cert-manager.io crd/certificaterequests.cert-manager.io \
    crd/issuers.cert-manager.io --timeout=10s
  kubectl get ns cert-manager >/dev/null 2>&1 || kubectl create ns cert-manager >/dev/null
  if ! pgrep -f "cert-manager-controller --kubeconfig" >/dev/null; then
    "$PROXYFLEET_CACHE/bin/cert-manager-controller" --kubeconfig "$KUBECONFIG" > /tmp/e2e-cert-manager.log 2>&1 &
    CERT_MANAGER_PID=$!
  fi
  say "cert-manager $CERT_MANAGER_VERSION controllers running (log: /tmp/e2e-cert-manager.log)"
}

stop_cert_manager() {
  pkill -f "cert-manager-controller --kubeconfig" 2>/dev/null || true
}
