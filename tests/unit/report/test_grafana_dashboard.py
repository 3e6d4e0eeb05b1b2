"""The Grafana dashboard (dashboards/grafana/khipu.json) asks only for what the exporter serves.

The names and labels it queries are checked against a real scrape of the exporter over a seeded store,
so renaming a metric or a label in the exporter without the dashboard fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.report.conftest import ROOT, SeededStore, StartExporter
from tests.unit.report.scraping import scrape

DASHBOARD = ROOT / "dashboards" / "grafana" / "khipu.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
METRIC = re.compile(r"\bkhipu_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b(khipu_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\bby \(([^)]*)\) \((khipu_[a-z0-9_]+)")


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows only group them), including those inside collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        nested = panel.get("panels", [])
        found += [p for p in [panel, *nested] if p["type"] != "row"]
    return found


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL the dashboard runs: its panels' targets and its template variables' queries."""
    exprs = [target["expr"] for panel in graph_panels(dashboard) for target in panel["targets"]]
    return exprs + [variable["definition"] for variable in dashboard["templating"]["list"]]


@pytest.fixture
def served_labels(seeded: SeededStore, start_exporter: StartExporter) -> dict[str, set[str]]:
    """Each sample name the exporter serves over the seeded store, with the label names it carries."""
    labels: dict[str, set[str]] = {}
    for sample in scrape(start_exporter(seeded.url).url).samples():
        labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def test_the_dashboard_is_a_grafana_10_import_with_a_prometheus_input() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 38  # Grafana 10
    (source,) = dashboard["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    panels = graph_panels(dashboard)
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no target"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and METRIC.search(target["expr"]), panel["title"]


def test_the_stream_variable_lists_streams_and_filters_the_verdict_panels() -> None:
    dashboard = load_dashboard()
    (stream,) = [v for v in dashboard["templating"]["list"] if v["name"] == "stream"]
    assert stream["datasource"] == DATASOURCE and "stream" in stream["definition"]
    filtered = [p["title"] for p in graph_panels(dashboard) if any("$stream" in t["expr"] for t in p["targets"])]
    titles = " ".join(filtered).lower()
    for shown in ("loss rate", "duplicate rate", "verdicts by kind", "latency p99"):
        assert shown in titles


def test_every_metric_the_dashboard_queries_is_served(served_labels: dict[str, set[str]]) -> None:
    used = {name for query in queries(load_dashboard()) for name in METRIC.findall(query)}
    assert used, "the dashboard queries no Khipu metric"
    assert used - set(served_labels) == set()
    assert "khipu_hop_latency_seconds_bucket" in used  # the p99 panel reads the gauge histogram's buckets


def test_every_label_the_dashboard_selects_or_groups_by_is_served(served_labels: dict[str, set[str]]) -> None:
    checked = 0
    for query in queries(load_dashboard()):
        for name, matchers in SELECTOR.findall(query):
            for label in MATCHER_LABEL.findall(matchers):
                assert label in served_labels[name], (query, label)
                checked += 1
        for grouping, name in GROUPING.findall(query):
            for label in (part.strip() for part in grouping.split(",")):
                assert label in served_labels[name], (query, label)
                checked += 1
    assert checked > 0
