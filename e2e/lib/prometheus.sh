# A real Prometheus (Debian's package) scraping the proxy pods, which the harness discovers
# through the local API server.
# It listens on the node address so in-cluster operators can query it.
PROM_DIR=/var/lib/proxyfleet/prometheus
PROM_ADDR=10.244.0.1:9090

start_prometheus() {
  local pki=/var/lib/proxyfleet/clusters/main/pki
  stop_prometheus
  mkdir -p "$PROM_DIR/data"
  # Debian's Prometheus is built without kubernetes_sd_configs, so the harness discovers the
  # proxy pods through the API server itself and hands them over as file_sd targets.
  cat > "$PROM_DIR/prometheus.yml" <<YAML
global: {scrape_interval: 2s, evaluation_interval: 10s}
scrape_configs:
  - job_name: proxyfleet-proxies
    file_sd_configs:
      - files: [$PROM_DIR/targets.json]
        refresh_interval: 2s
YAML
  echo '[]' > "$PROM_DIR/targets.json"
  (
    while true; do
      kubectl get pods -A -l proxyfleet.io/proxydeployment -o json 2>/dev/null | jq '[.items[]
          | select(.status.podIP != null and .metadata.deletionTimestamp == null)
          | {targets: [.status.podIP + ":9901"],
             labels: {namespace: .metadata.namespace, pod: .metadata.name,
                      proxydeployment: .metadata.labels["proxyfleet.io/proxydeployment"],
                      track: (.metadata.labels["proxyfleet.io/track"] // ""),
                      revision: (.metadata.labels["proxyfleet.io/revision"] // "")}}]' > "$PROM_DIR/targets.json.tmp" 2>/dev/null \
        && mv "$PROM_DIR/targets.json.tmp" "$PROM_DIR/targets.json"
      sleep 2
    done
  ) >/dev/null 2>&1 &
  echo $! > "$PROM_DIR/discovery.pid"
  setsid prometheus --config.file="$PROM_DIR/prometheus.yml" --storage.tsdb.path="$PROM_DIR/data" \
    --web.listen-address="$PROM_ADDR" --storage.tsdb.retention.time=1h --log.level=warn \
    >"$PROM_DIR/prometheus.log" 2>&1 < /dev/null &
  echo $! > "$PROM_DIR/pid"
  retry 60 curl -fsS "http://$PROM_ADDR/-/ready"
}

stop_prometheus() {
  if [ -f "$PROM_DIR/discovery.pid" ]; then
    kill "$(cat "$PROM_DIR/discovery.pid")" 2>/dev/null || true
    rm -f "$PROM_DIR/discovery.pid"
  fi
  if [ -f "$PROM_DIR/pid" ]; then
    kill "$(cat "$PROM_DIR/pid")" 2>/dev/null || true
    sleep 1
    kill -9 "$(cat "$PROM_DIR/pid")" 2>/dev/null || true
    rm -f "$PROM_DIR/pid"
  fi
  rm -rf "$PROM_DIR/data"
}
