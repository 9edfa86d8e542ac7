#!/usr/bin/env bash
# TLS passthrough and plain TCP through a fleet on the real cluster (issue 19). The backends
# are nginx (Debian's) with their own CA on the node's bridge address: routed by SNI, their
# own certificates verified by the client (TLS is not terminated), a client certificate
# checked by the backend itself (end-to-end mTLS), unknown names refused, and a PROXY protocol
# v2 header parsed by nginx showing the client's address, not the proxy pod's.
. "$(dirname "$0")/../lib/testlib.sh"
. "$root/e2e/lib/operator.sh"

node_ip=10.244.0.1   # the node's side of the CNI bridge: pods reach it
work=$(mktemp -d)
install_operator
ns=$(test_namespace e2e-pass)
trap '[ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null; rm -rf "$work"; kubectl delete ns e2e-pass --wait=false >/dev/null 2>&1 || true' EXIT

say "the backends' own CA, server and client certificates (openssl)"
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=backend-ca \
  -keyout ca.key -out ca.crt 2>/dev/null
leaf() { # leaf NAME SAN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out "$1.crt" \
    -extfile <(printf 'subjectAltName=%s' "$2") 2>/dev/null
}
leaf db DNS:db.example.com
leaf apps 'DNS:*.apps.example.com'
leaf pp DNS:pp.example.com
leaf client DNS:client.example.com
cat > nginx.conf <<CONF
daemon on; pid $work/nginx.pid; error_log $work/error.log; worker_processes 1;
events {}
http {
  access_log off;
  client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work; uwsgi_temp_path $work; scgi_temp_path $work;
  server { listen $node_ip:18780 ssl; ssl_certificate $work/db.crt; ssl_certificate_key $work/db.key;
           ssl_client_certificate $work/ca.crt; ssl_verify_client on;
           location / { return 200 "db client=\$ssl_client_s_dn\n"; } }
  server { listen $node_ip:18781 ssl; ssl_certificate $work/apps.crt; ssl_certificate_key $work/apps.key;
           location / { return 200 "apps sni=\$ssl_server_name\n"; } }
  server { listen $node_ip:18782 ssl proxy_protocol; ssl_certificate $work/pp.crt; ssl_certificate_key $work/pp.key;
           location / { return 200 "pp client=\$proxy_protocol_addr\n"; } }
}
CONF
nginx -c "$work/nginx.conf" -p "$work" || fail "nginx did not start: $(cat "$work/error.log")"
cd "$root"

kubectl create secret generic socks-user -n "$ns" --from-literal=username=alice --from-literal=password=s3cret >/dev/null
kubectl apply -n "$ns" -f - >/dev/null <<YAML || fail "the ProxyDeployment was refused"
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata:
  name: pass
spec:
  replicas: 2
  listeners:
    - name: pass
      port: 9443
      protocol: TCP
      tcp:
        routes:
          - {name: db, serverNames: [db.example.com], upstream: db}
          - {name: apps, serverNames: ["*.apps.example.com"], upstream: apps}
    - {name: pp, port: 9444, protocol: TCP, tcp: {defaultUpstream: pp, proxyProtocol: true, idleTimeout: 5m}}
    - {name: socks, port: 1080, protocol: TCP, tcp: {mode: socks5, socks5: {credentialsSecret: socks-user}}}
  connect: {allow: ["$node_ip:18781"], allowedNetworks: ["$node_ip/32"]}
  upstreams:
    - {name: db, endpoints: ["$node_ip:18780"], pool: {connectTimeout: 2s}}
    - {name: apps, endpoints: ["$node_ip:18781"]}
    - {name: pp, endpoints: ["$node_ip:18782"]}
YAML
kubectl wait -n "$ns" --for=condition=Ready pxd/pass --timeout=180s >/dev/null || { kubectl get pxd -n "$ns" pass -o yaml >&2; fail "pass fleet never Ready"; }
ip=$(kubectl get svc -n "$ns" pass -o jsonpath='{.spec.clusterIP}')
via() { local name=$1 port=$2; shift 2; curl -sS --max-time 5 --cacert "$work/ca.crt" --resolve "$name:$port:$ip" "$@" "https://$name:$port/"; }
retry 30 via x.apps.example.com 9443 -f -o /dev/null

say "routed by SNI to the backend, which serves its own certificate (verified against the backend's CA)"
out=$(via shop.apps.example.com 9443 -f) || fail "no answer through the passthrough listener"
[ "$out" = "apps sni=shop.apps.example.com" ] || fail "unexpected answer: $out"
issuer=$(echo | openssl s_client -connect "$ip:9443" -servername db.example.com 2>/dev/null | openssl x509 -noout -issuer)
<<<"$issuer" grep -q 'CN *= *backend-ca' || fail "the client did not see the backend's certificate: $issuer"

say "end-to-end mTLS: the backend checks the client's certificate itself"
out=$(via db.example.com 9443 -f --cert "$work/client.crt" --key "$work/client.key") || fail "mTLS through the passthrough failed"
<<<"$out" grep -q 'db client=CN=client$' || fail "the backend did not see the client certificate: $out"
code=$(via db.example.com 9443 -o /dev/null -w '%{http_code}' || true)
[ "$code" = 400 ] || fail "the backend accepted a client without a certificate (HTTP $code)"

say "an unknown server name is refused (no default upstream)"
via other.example.com 9443 -o /dev/null 2>/dev/null && fail "an unknown SNI was relayed"

say "PROXY protocol v2: nginx sees the client's address, not the proxy pod's"
out=$(via pp.example.com 9444 -f) || fail "no answer through the PROXY protocol listener"
client=${out#pp client=}
pods=$(kubectl get pods -n "$ns" -l proxyfleet.io/proxydeployment=pass -o jsonpath='{.items[*].status.podIP}')
[ -n "$client" ] || fail "nginx saw no PROXY protocol address: $out"
for p in $pods; do [ "$client" != "$p" ] || fail "nginx saw the proxy pod's address $p"; done
say "nginx saw client=$client (proxy pods: $pods)"

say "100 new connections through the passthrough, none failed"
failed=0
for _ in $(seq 100); do via shop.apps.example.com 9443 -f -o /dev/null || failed=$((failed + 1)); done
[ "$failed" = 0 ] || fail "$failed of 100 connections failed"

say "metrics by route"
total=0
for p in $pods; do
  n=$(curl -fsS --max-time 5 "http://$p:9901/metrics" | awk '/^proxyfleet_tcp_connections_total\{.*route="apps".*result="relayed"/ { s += $2 } END { print s + 0 }')
  total=$((total + ${n%.*}))
done
[ "$total" -ge 100 ] || fail "only $total relayed connections counted for route apps"
say "route apps: $total connections relayed across the pods"

say "SOCKS5 (curl): a password from a Secret, the connect allow-list deciding the target"
socks() { curl -sS --max-time 5 --cacert "$work/ca.crt" -x "socks5://$1@$ip:1080" --resolve "$2:$node_ip" "https://$2/" "${@:3}"; }
out=$(socks alice:s3cret shop.apps.example.com:18781 -f) || fail "no answer through SOCKS5"
[ "$out" = "apps sni=shop.apps.example.com" ] || fail "unexpected answer through SOCKS5: $out"
rc=0; socks alice:s3cret db.example.com:18780 -o /dev/null 2>/dev/null || rc=$?
[ "$rc" = 97 ] || fail "a target outside connect.allow was not refused by the SOCKS5 server (curl exit $rc)"
rc=0; socks alice:wrong shop.apps.example.com:18781 -o /dev/null 2>/dev/null || rc=$?
[ "$rc" = 97 ] || fail "a wrong SOCKS5 password was not refused (curl exit $rc)"
socks_counts=$(for p in $pods; do curl -fsS --max-time 5 "http://$p:9901/metrics"; done |
  awk '/^proxyfleet_tcp_connections_total\{.*route="socks5"/ && $2 > 0 { split($1, a, "result=\""); r = a[2]; sub(/".*/, "", r); c[r] += $2 } END { for (r in c) printf "%s=%d ", r, c[r] }')
for want in relayed=1 not_allowed=1 auth_failed=1; do
  case " $socks_counts" in *" $want "*) ;; *) fail "SOCKS5 counters: want $want, got $socks_counts" ;; esac
done
say "SOCKS5 counters: $socks_counts"

say "bad TCP listeners refused at admission, naming the field"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-tcp}
spec:
  listeners: [{name: pass, port: 9443, protocol: TCP, hostnames: [a.example.com], tcp: {defaultUpstream: u}}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "a TCP listener with hostnames was accepted"
<<<"$out" grep -q 'spec.listeners: Invalid value.*a TCP listener relays bytes' || fail "unexpected refusal: $out"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-tcp}
spec:
  listeners: [{name: pass, port: 9443, protocol: TCP}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "protocol TCP without tcp was accepted"
<<<"$out" grep -q 'protocol TCP needs tcp' || fail "unexpected refusal: $out"
out=$(kubectl apply -n "$ns" -f - 2>&1 <<YAML
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyDeployment
metadata: {name: bad-tcp}
spec:
  listeners: [{name: socks, port: 1080, protocol: TCP, tcp: {mode: socks5}}]
  upstreams: [{name: u, endpoints: ["10.0.0.1:80"]}]
YAML
) && fail "a socks5 listener without connect was accepted"
<<<"$out" grep -q 'spec.connect: Invalid value.*a socks5 listener needs connect' || fail "unexpected refusal: $out"
say "TLS passthrough and TCP passed"
