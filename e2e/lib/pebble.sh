# Pebble (Let's Encrypt's ACME test server) and pebble-challtestsrv (its DNS) as processes on
# the host, built from the Go module proxy by e2e/lib/build-acme-peers.sh; sourced by e2e tests.
# Pebble serves its directory on $NODE_IP:14000 (reachable from the pods) with a certificate we
# make for that address; it resolves every name through challtestsrv, whose answer the test
# points at the fleet's Service (pebble_point). Certificates live $1 seconds.
PEBBLE_NODE_IP=10.244.0.1
PEBBLE_DIR=/tmp/e2e-pebble

start_pebble() {
  local validity=$1
  bash "$root/e2e/lib/build-acme-peers.sh" || fail "building Pebble failed"
  stop_pebble
  rm -rf "$PEBBLE_DIR" && mkdir -p "$PEBBLE_DIR"
  (
    cd "$PEBBLE_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=e2e pebble https root" \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=pebble" -keyout key.pem -out req.csr 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:localhost,DNS:pebble\n' "$PEBBLE_NODE_IP" > san.ext
    openssl x509 -req -in req.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out cert.pem 2>/dev/null
  ) || fail "making Pebble's HTTPS certificate failed"
  cat > "$PEBBLE_DIR/config.json" <<JSON
{"pebble": {"listenAddress": "0.0.0.0:14000", "managementListenAddress": "127.0.0.1:15000",
  "certificate": "$PEBBLE_DIR/cert.pem", "privateKey": "$PEBBLE_DIR/key.pem",
  "httpPort": 80, "tlsPort": 443, "ocspResponderURL": "", "externalAccountBindingRequired": false,
  "retryAfter": {"authz": 1, "order": 1}, "keyAlgorithm": "ecdsa",
  "profiles": {"default": {"description": "e2e: short-lived", "validityPeriod": $validity}}}}
JSON
  "$PROXYFLEET_CACHE/bin/pebble-challtestsrv" -defaultIPv4 127.0.0.1 -defaultIPv6 "" -dnsserver 127.0.0.1:8053 \
    -management 127.0.0.1:8055 -http01 "" -https01 "" -tlsalpn01 "" -doh "" > /tmp/e2e-challtestsrv.log 2>&1 &
  PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 PEBBLE_AUTHZREUSE=0 \
    "$PROXYFLEET_CACHE/bin/pebble" -config "$PEBBLE_DIR/config.json" -dnsserver 127.0.0.1:8053 > /tmp/e2e-pebble.log 2>&1 &
  retry 30 curl -fsS --cacert "$PEBBLE_DIR/ca.crt" "https://$PEBBLE_NODE_IP:14000/dir" >/dev/null
  retry 30 curl -fsS --cacert "$PEBBLE_DIR/ca.crt" -o "$PEBBLE_DIR/root.pem" https://127.0.0.1:15000/roots/0
  say "Pebble $PEBBLE_VERSION running (log /tmp/e2e-pebble.log; leaves live ${validity}s)"
}

# Every name Pebble validates resolves to $1 (the fleet's Service address).
pebble_point() {
  curl -fsS -X POST -d "{\"ip\":\"$1\"}" http://127.0.0.1:8055/set-default-ipv4 >/dev/null
}

# One name resolves to $2 instead.
pebble_point_name() {
  curl -fsS -X POST -d "{\"host\":\"$1.\",\"addresses\":[\"$2\"]}" http://127.0.0.1:8055/add-a >/dev/null
}

stop_pebble() {
  pkill -f "$PROXYFLEET_CACHE/bin/pebble" 2>/dev/null || true
}
