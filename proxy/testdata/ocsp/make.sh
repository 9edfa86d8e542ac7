#!/usr/bin/env bash
# Regenerates the OCSP fixtures of proxy/src/ocsp.rs's tests with the openssl CLI: a CA, a
# leaf (good), a second leaf (revoked), and responses signed by the CA. The tests pass "now"
# explicitly, so the fixtures never expire.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 -subj /CN=ocsp-test-ca \
  -keyout "$tmp/ca.key" -out ca.pem 2>/dev/null
for leaf in good revoked; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$leaf.example.com" \
    -keyout "$tmp/$leaf.key" -out "$tmp/$leaf.csr" 2>/dev/null
  openssl x509 -req -in "$tmp/$leaf.csr" -CA ca.pem -CAkey "$tmp/ca.key" -CAcreateserial -days 3650 \
    -extfile <(printf 'subjectAltName=DNS:%s.example.com' "$leaf") -out "$leaf.pem" 2>/dev/null
done
serial() { openssl x509 -in "$1" -noout -serial | cut -d= -f2; }
printf 'V\t351231000000Z\t\t%s\tunknown\t/CN=good.example.com\n' "$(serial good.pem)" > "$tmp/index.txt"
printf 'R\t351231000000Z\t240101000000Z\t%s\tunknown\t/CN=revoked.example.com\n' "$(serial revoked.pem)" >> "$tmp/index.txt"
for leaf in good revoked; do
  openssl ocsp -issuer ca.pem -cert "$leaf.pem" -no_nonce -reqout "$tmp/$leaf.req" 2>/dev/null
  openssl ocsp -index "$tmp/index.txt" -rsigner ca.pem -rkey "$tmp/ca.key" -CA ca.pem -ndays 4 \
    -reqin "$tmp/$leaf.req" -respout "$leaf.ocsp.der" 2>/dev/null
done
# A SHA-256 CertID too (openssl's default is SHA-1).
openssl ocsp -issuer ca.pem -sha256 -cert good.pem -no_nonce -reqout "$tmp/good256.req" 2>/dev/null
openssl ocsp -index "$tmp/index.txt" -rsigner ca.pem -rkey "$tmp/ca.key" -CA ca.pem -ndays 4 \
  -reqin "$tmp/good256.req" -respout good.sha256.ocsp.der 2>/dev/null
rm -f ca.srl
