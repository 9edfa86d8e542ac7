#!/usr/bin/env bash
# `e2e/cluster down --all` leaves no process, mount, netns or iptables chain of ours behind.
. "$(dirname "$0")/../lib/testlib.sh"
state=/var/lib/proxyfleet/clusters
"$root/e2e/cluster" up --name member-8 --control-plane-only >/dev/null
"$root/e2e/cluster" down --all
left=""
pgrep -f "$state" >/dev/null && left+=" processes: $(pgrep -af "$state" | tr "\n" " ")"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy containerd coredns; do
  pgrep -f "(^|/)$b( |$)" >/dev/null && left+=" process $b"
done
grep -q " $state" /proc/self/mounts && left+=" mounts"
ip netns list 2>/dev/null | grep -q '^cni-' && left+=" netns"
for t in filter nat mangle; do
  iptables-save -t $t | grep -qE '^:(KUBE-|CNI-|PROXYFLEET-)' && left+=" iptables($t)"
done
ip link show pfcni0 >/dev/null 2>&1 && left+=" bridge"
ls "$state" 2>/dev/null | grep -q . && left+=" state dirs"
[ -z "$left" ] || fail "left behind:$left"
say "ok: nothing left behind"
