"""Scraping the exporter over HTTP the way Prometheus does, and reading its answer back."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True, slots=True)
class Scrape:
    status: int
    headers: Mapping[str, str]
    body: str

    def samples(self) -> list[Sample]:
        return [sample for family in text_string_to_metric_families(self.body) for sample in family.samples]

    def series(self, name: str) -> dict[Labels, float]:
        """The samples called ``name``, by their labels."""
        return {labels_of(sample.labels): sample.value for sample in self.samples() if sample.name == name}

    def value(self, name: str) -> float:
        """The one sample called ``name`` (a metric without labels)."""
        (value,) = self.series(name).values()
        return value


def labels_of(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def scrape(url: str, token: str | None = None, authorization: str | None = None) -> Scrape:
    """GET ``url``; ``token`` sends ``Authorization: Bearer <token>``, ``authorization`` that header as given."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return Scrape(answer.status, dict(answer.headers), answer.read().decode())
    except urllib.error.HTTPError as refused:
        return Scrape(refused.code, dict(refused.headers), refused.read().decode())
