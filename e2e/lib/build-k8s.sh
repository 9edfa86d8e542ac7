#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl, etcd and helm from the Go module proxy, once per version, into
# $PROXYFLEET_CACHE/k8s/<version>/bin. A second call is a no-op.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"

k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
all=("${k8s_cmds[@]}" etcd helm crictl coredns)
missing=0
for b in "${all[@]}"; do [ -x "$K8S_BIN/$b" ] || missing=1; done
[ "$missing" = 0 ] && exit 0

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
start=$(date +%s)
mkdir -p "$K8S_BIN"
src=$PROXYFLEET_CACHE/k8s/$K8S_VERSION/src
mkdir -p "$src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local

need_k8s=0
for b in "${k8s_cmds[@]}"; do [ -x "$K8S_BIN/$b" ] || need_k8s=1; done
if [ "$need_k8s" = 1 ]; then
  log "building Kubernetes $K8S_VERSION (cold: ~7 min on 2 cores, measured)"
  modfile=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  # k8s.io/kubernetes replaces its staging modules with local paths; point them at the
  # published tags instead so the module builds outside its own repository.
  {
    echo "module proxyfleet.local/k8sbuild"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$K8S_STAGING_VERSION"'#p' "$modfile"
    echo ")"
  } > "$src/go.mod"
  echo 'package k8sbuild' > "$src/doc.go"
  minor=$(<<<"$K8S_VERSION" cut -d. -f2)
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  pkgs=()
  for b in "${k8s_cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$src" && go mod download && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$K8S_BIN/" "${pkgs[@]}")
fi
if [ ! -x "$K8S_BIN/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  # etcd's server module also uses replace directives: build it from a wrapper module.
  esrc=$PROXYFLEET_CACHE/k8s/etcd-$ETCD_VERSION-src
  mkdir -p "$esrc"
  printf 'module proxyfleet.local/etcdbuild\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$esrc/go.mod"
  echo 'package etcdbuild' > "$esrc/doc.go"
  (cd "$esrc" && go mod download go.etcd.io/etcd/server/v3 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$K8S_BIN/etcd" go.etcd.io/etcd/server/v3)
fi
if [ ! -x "$K8S_BIN/helm" ]; then
  log "building helm $HELM_VERSION"
  GOBIN=$K8S_BIN CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
if [ ! -x "$K8S_BIN/crictl" ]; then
  log "building crictl $CRICTL_VERSION"
  csrc=$PROXYFLEET_CACHE/k8s/crictl-$CRICTL_VERSION-src
  mkdir -p "$csrc"
  printf 'module proxyfleet.local/crictlbuild\n\ngo 1.24.0\n\nrequire sigs.k8s.io/cri-tools %s\n' "$CRICTL_VERSION" > "$csrc/go.mod"
  echo 'package crictlbuild' > "$csrc/doc.go"
  (cd "$csrc" && go mod download sigs.k8s.io/cri-tools && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" -o "$K8S_BIN/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
fi
if [ ! -x "$K8S_BIN/coredns" ]; then
  log "building coredns $COREDNS_VERSION (the cluster DNS)"
  dsrc=$PROXYFLEET_CACHE/k8s/coredns-$COREDNS_VERSION-src
  mkdir -p "$dsrc"
  printf 'module proxyfleet.local/corednsbuild\n\ngo 1.24.0\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > "$dsrc/go.mod"
  echo 'package corednsbuild' > "$dsrc/doc.go"
  (cd "$dsrc" && go mod download github.com/coredns/coredns && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$K8S_BIN/coredns" github.com/coredns/coredns)
fi
log "done in $(( $(date +%s) - start ))s"
