#!/usr/bin/env bash
# The operator's integration tests against the real kube-apiserver of the local cluster
# (operator/tests/apiserver.rs): apply / zero-write no-op / revert of an edit, orphan deletion
# sparing what is not ours, admission messages naming the field.
. "$(dirname "$0")/../lib/testlib.sh"
kubectl apply -f "$root/crds/" >/dev/null
retry 30 kubectl get crd proxydeployments.proxyfleet.io
retry 60 kubectl wait --for=condition=Established crd/proxydeployments.proxyfleet.io --timeout=10s
cd "$root"
PROXYFLEET_TEST_KUBECONFIG=$KUBECONFIG cargo test -q -p proxyfleet-operator --test apiserver -- --include-ignored --test-threads 3 2>&1 | tail -5
