#!/bin/sh
# Grafana of the Khipu reference stack (docker-compose.yaml), started by this script instead of the image's /run.sh.
#
# The dashboards of dashboards/grafana (mounted at /etc/khipu/dashboards) are exported for import: their data
# source is an input, ${DS_PROMETHEUS}, that Grafana's import dialog fills in and its file provisioning does not
# (grafana/grafana#10786: "Datasource ${DS_PROMETHEUS} was not found"). Each is written where the provisioning
# (docker/grafana/provisioning/dashboards/khipu.yml) reads it, with the input replaced by the uid of the
# provisioned Prometheus (docker/grafana/provisioning/datasources/prometheus.yml); then Grafana starts as its
# image starts it.
set -eu
target=/var/lib/grafana/dashboards/khipu
mkdir -p "$target"
for dashboard in /etc/khipu/dashboards/*.json; do
  sed -e 's/\${DS_PROMETHEUS}/khipu-prometheus/g' "$dashboard" > "$target/$(basename "$dashboard")"
done
exec /run.sh "$@"
