"""What the Khipu view, its JSON API, the CLI and the Prometheus exporter show: one set of reports."""
