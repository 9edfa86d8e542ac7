# Pinned versions of the real cluster components (see docs/local-cluster.md for why v1.34).
K8S_VERSION=v1.34.4
K8S_STAGING_VERSION=v0.34.4
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.19.0
CRICTL_VERSION=v1.34.0
COREDNS_VERSION=v1.14.7
JAEGER_VERSION=v1.75.0   # Jaeger v2 (cmd/jaeger): the OTLP collector the tracing test sends to
H2SPEC_VERSION=v2.2.1+incompatible   # the Go module proxy serves this one (v2.6.0's tag is refused)
CARGO_DENY_VERSION=0.20.2   # make lint: licenses, bans, sources (advisories when a RustSec db is present)
PROXYFLEET_CACHE=${PROXYFLEET_CACHE:-$HOME/.cache/proxyfleet}
K8S_BIN=$PROXYFLEET_CACHE/k8s/$K8S_VERSION/bin
CERT_MANAGER_VERSION=v1.21.2   # the root module (controllers, CRDs); our main in e2e/peers/cert-manager
PEBBLE_VERSION=v2.10.3         # Let's Encrypt's ACME test server (github.com/letsencrypt/pebble/v2)
