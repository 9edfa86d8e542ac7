# Helpers for e2e test scripts (sourced). Each test script exits non-zero on failure.
set -euo pipefail
# Checks feed a variable to a reader with a here-string (`<<<"$out" grep -q x`), never
# `echo "$out" | grep -q x`: bash's echo writes a line per write, a reader that leaves early
# (grep -q, head) makes it die of SIGPIPE, and pipefail turns that into a failed check (e2e 39
# failed so once under load). Large outputs (curl of /metrics) are read into a variable first.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$root/e2e/lib/versions.sh"
export PATH="$K8S_BIN:$PATH"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/proxyfleet/target}
CARGO_TARGET_DIR_RELEASE=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release
PLUGIN=$CARGO_TARGET_DIR_RELEASE/kubectl-proxyfleet
export KUBECONFIG=${KUBECONFIG:-/var/lib/proxyfleet/clusters/main/admin.kubeconfig}

say() { printf '  [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '  FAIL: %s\n' "$*" >&2; exit 1; }

# retry SECONDS COMMAND... — until the command succeeds. `kubectl wait --for=condition=...` goes
# through it too: on an object just created, whose status.conditions is still null, kubectl
# fails at once ("accessor error: <nil> is of the type <nil>") instead of waiting (e2e 57 once).
retry() {
  local t=$1; shift
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { "$@" >&2 || true; fail "timed out after ${t}s: $*"; }
    sleep 1
  done
}

# A namespace per test, deleted at exit.
test_namespace() {
  local ns=$1
  kubectl delete ns "$ns" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kubectl create ns "$ns" >/dev/null
  retry 30 kubectl get sa default -n "$ns"
  echo "$ns"
}

# announced_once KUBECTL... NAMESPACE NAME — fails when a wave transition that names its revision
# (a rollout started, a wave started, a rollout completed) was announced more than once for the
# same revision: a pass that decided on a status one write behind would repeat it.
announced_once() {
  local name=${*: -1} ns=${*: -2:1}
  local dups
  dups=$("${@:1:$#-2}" get events -n "$ns" --field-selector "involvedObject.name=$name" -o json | jq -r '
    [.items[] | select(.reason == "WaveRolloutStarted" or .reason == "WaveStarted" or .reason == "WaveRolloutCompleted")]
    | group_by(.reason + " " + .message)
    | map(select((map(.series.count // .count // 1) | add) > 1) | "\(.[0].reason): \(.[0].message)")
    | .[]')
  [ -z "$dups" ] || fail "announced more than once: $dups"
}
