"""A route of 15 hops over 3 clusters, with fan-out and fan-in, and a store holding what each hop did: for the
route map's tests.

The registry is the project's own (``config/registry.yaml``: the demo streams) plus the stream ``payments``
on the clusters east, west and lake. Each hop's verdicts are written through the store's repositories, as
the detector writes them, from the counts in :data:`RECENT`, :data:`HOURS_AGO` and :data:`DAYS_AGO`; the
tests expect what those counts say (:func:`expected`), never what Khipu computed from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.offsets.model import PartitionKey
from khipu.store import Store
from khipu.verdicts.metrics import counts_by_minute, metrics_of

ROOT = Path(__file__).resolve().parents[1]
STREAM = "payments"
LOSS_THRESHOLD = 0.02
DUPLICATE_THRESHOLD = 0.05
MINUTE_MS = 60_000

PAYMENTS = {
    "owner": "team-payments",
    "sampling_percent": 100,
    "recovery_attributes": ["payment_id"],
    "alerts": {"loss_rate": LOSS_THRESHOLD, "duplicate_rate": DUPLICATE_THRESHOLD, "latency_p99_ms": 5000},
    "route": {
        "producers": [
            {"location": "checkout-api", "writes": ["east/orders"]},
            {"location": "refunds-api", "writes": ["east/refunds"]},
            {"location": "billing-api", "writes": ["west/invoices"]},
        ],
        "consumers": [
            # fan-in across clusters: two east topics into one west topic
            {"group": "payments-enricher", "reads": ["east/orders", "east/refunds"], "writes": ["west/payments"]},
            # west/payments fans out to three groups
            {"group": "ledger-joiner", "reads": ["west/payments", "west/invoices"], "writes": ["lake/ledger"]},
            {"group": "fraud-scorer", "reads": ["west/payments"]},
            {
                "group": "mm2-lake",
                "location": "mm2",
                "reads": ["west/payments"],
                "writes": ["lake/west.payments"],
                "commits_offsets": False,
            },
            {"group": "ledger-sink", "reads": ["lake/ledger"]},
            {"group": "ledger-audit", "reads": ["lake/ledger"]},
            {"group": "lake-archiver", "reads": ["lake/west.payments"]},
        ],
    },
}


@dataclass(frozen=True, slots=True)
class HopCounts:
    """What one hop did over a period: verdicts by kind, and the latency of every delivery (and duplicate)."""

    delivered: int = 0
    lost: int = 0
    confirmed_lost: int = 0
    duplicate: int = 0
    latency_ms: int = 100

    def plus(self, other: HopCounts) -> HopCounts:
        return HopCounts(
            self.delivered + other.delivered,
            self.lost + other.lost,
            self.confirmed_lost + other.confirmed_lost,
            self.duplicate + other.duplicate,
            self.worst_latency(other),
        )

    def worst_latency(self, other: HopCounts) -> int:
        """The slower of two periods' latencies (a window's p95 is its worst minute's), of those with verdicts."""
        if not self.judged:
            return other.latency_ms
        return max(self.latency_ms, other.latency_ms) if other.judged else self.latency_ms

    @property
    def judged(self) -> int:
        return self.delivered + self.lost + self.confirmed_lost + self.duplicate


CHECKOUT = "checkout-api -> east/orders"
REFUNDS = "refunds-api -> east/refunds"
BILLING = "billing-api -> west/invoices"
ENRICH_ORDERS = "east/orders -> payments-enricher"
ENRICH_REFUNDS = "east/refunds -> payments-enricher"
ENRICH_WRITE = "payments-enricher -> west/payments"
JOIN_PAYMENTS = "west/payments -> ledger-joiner"
JOIN_INVOICES = "west/invoices -> ledger-joiner"
JOIN_WRITE = "ledger-joiner -> lake/ledger"
FRAUD = "west/payments -> fraud-scorer"
MIRROR_READ = "west/payments -> mm2-lake"
MIRROR_WRITE = "mm2 -> lake/west.payments"
SINK = "lake/ledger -> ledger-sink"
AUDIT = "lake/ledger -> ledger-audit"
ARCHIVE = "lake/west.payments -> lake-archiver"

# The last 10 minutes, spread over them.
RECENT = {
    CHECKOUT: HopCounts(delivered=200, latency_ms=40),
    REFUNDS: HopCounts(delivered=50, latency_ms=35),
    ENRICH_ORDERS: HopCounts(delivered=194, lost=6, latency_ms=120),  # 3 %: above the 2 % threshold
    ENRICH_REFUNDS: HopCounts(delivered=49, lost=1, latency_ms=130),  # 2 %: at the threshold, not above it
    ENRICH_WRITE: HopCounts(delivered=243, latency_ms=250),
    JOIN_PAYMENTS: HopCounts(delivered=230, duplicate=13, latency_ms=900),  # 5.35 % duplicates: above 5 %
    JOIN_WRITE: HopCounts(delivered=228, confirmed_lost=2, latency_ms=1_500),  # 0.87 %: within
    FRAUD: HopCounts(delivered=243, latency_ms=300),
    MIRROR_READ: HopCounts(delivered=243, latency_ms=2_000),
    MIRROR_WRITE: HopCounts(delivered=243, latency_ms=2_100),
    SINK: HopCounts(delivered=230, latency_ms=700),
    AUDIT: HopCounts(delivered=200, lost=30, latency_ms=800),  # 13 %
    ARCHIVE: HopCounts(delivered=243, latency_ms=4_200),
}
# Three hours ago: in the day's window and the week's, not the hour's.
HOURS_AGO = {CHECKOUT: HopCounts(delivered=100, lost=100, latency_ms=60)}
# Three days ago: in the week's window only.
DAYS_AGO = {BILLING: HopCounts(delivered=20, latency_ms=55), JOIN_INVOICES: HopCounts(delivered=20, latency_ms=75)}
PERIODS = ((RECENT, 10 * MINUTE_MS), (HOURS_AGO, 3 * 3_600_000), (DAYS_AGO, 3 * 86_400_000))

# Consumer health as the last evaluation stored it: (cluster, group, topic, partition) -> status
HEALTH = {
    ("east", "payments-enricher", "orders", 0): PartitionStatus.OK,
    ("east", "payments-enricher", "refunds", 0): PartitionStatus.REWIND,
    ("west", "fraud-scorer", "payments", 0): PartitionStatus.OK,
    ("west", "fraud-scorer", "payments", 1): PartitionStatus.STALL,
    ("west", "fraud-scorer", "payments", 2): PartitionStatus.OK,
    ("west", "ledger-joiner", "payments", 0): PartitionStatus.OK,
    ("lake", "ledger-sink", "ledger", 0): PartitionStatus.OK,
    ("lake", "ledger-audit", "ledger", 0): PartitionStatus.STOP,
    ("lake", "lake-archiver", "west.payments", 0): PartitionStatus.EXPIRY_RISK,
}


def write_registry(path: Path) -> Path:
    """The project's registry plus the stream ``payments`` and its clusters, written to ``path``."""
    registry = yaml.safe_load((ROOT / "config" / "registry.yaml").read_text())
    registry["clusters"].update({"east": {}, "west": {}, "lake": {}})
    registry["streams"][STREAM] = PAYMENTS
    path.write_text(yaml.safe_dump(registry, sort_keys=False))
    return path


def expected(window_ms: int) -> dict[str, HopCounts]:
    """Each hop's counts in a window of ``window_ms`` ending now: the periods that fall in it."""
    found: dict[str, HopCounts] = {}
    for counts, ago_ms in PERIODS:
        if ago_ms < window_ms:
            for hop, hop_counts in counts.items():
                found[hop] = found.get(hop, HopCounts()).plus(hop_counts)
    return found


def lost_ids(hop: str) -> list[str]:
    """The ids of the messages the seed wrote LOST or CONFIRMED_LOST at ``hop``, in the last 10 minutes."""
    counts = RECENT.get(hop, HopCounts())
    return [_message_id(hop, "recent", i) for i in range(counts.lost + counts.confirmed_lost)]


def seed_payments(store: Store, now_ms: int) -> list[dict[str, Any]]:
    """Write every period's verdicts and their metric minutes, and the consumer health; returns the rows."""
    rows: list[dict[str, Any]] = []
    for counts, ago_ms in PERIODS:
        period = "recent" if counts is RECENT else f"ago-{ago_ms}"
        for hop, hop_counts in counts.items():
            kinds = (
                ["LOST"] * hop_counts.lost
                + ["CONFIRMED_LOST"] * hop_counts.confirmed_lost
                + ["DUPLICATE"] * hop_counts.duplicate
                + ["DELIVERED"] * hop_counts.delivered
            )
            for i, kind in enumerate(kinds):
                decided = now_ms - ago_ms + 30_000 + (i * 9 * MINUTE_MS) // max(len(kinds), 1)
                latency = hop_counts.latency_ms if kind in ("DELIVERED", "DUPLICATE") else None
                rows.append(_verdict(_message_id(hop, period, i), hop, kind, decided, latency))
    store.verdicts.upsert(rows)
    store.verdicts.replace_part("routemap-seed", counts_by_minute(rows), metrics_of)
    healths = [
        PartitionHealth(PartitionKey(*key), status, now_ms, 5, 1_000, f"{status.name} as seeded", {})
        for key, status in HEALTH.items()
    ]
    store.health.save_evaluation(healths, [], [], [])
    return rows


def _message_id(hop: str, period: str, i: int) -> str:
    return f"pay-{hop.replace(' -> ', '--').replace('/', '.')}-{period}-{i}"


def _verdict(message_id: str, hop: str, kind: str, decided_ms: int, latency_ms: int | None) -> dict[str, Any]:
    source, target = hop.split(" -> ")
    read = "/" in source
    cluster_topic = source if read else target
    cause = {"LOST": "skipped_by_consumer", "CONFIRMED_LOST": "dropped_in_processor", "DUPLICATE": "rewind_replay"}
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": STREAM,
        "hop_kind": "read" if read else "write",
        "verdict": kind,
        "cause": cause.get(kind),
        "count": 2 if kind == "DUPLICATE" else 1,
        "topic": cluster_topic.split("/", 1)[1],
        "partition": 0,
        "offset": decided_ms % 100_000,
        "group": target if read else None,
        "location": None if read else source,
        "observed_ms": decided_ms - 500,
        "latency_ms": latency_ms,
        "e2e_latency_ms": None,
        "decided_ms": decided_ms,
        "detail": f"{kind.lower()} at {hop}",
        "first_seen_ms": decided_ms - 2_000,
        "decided_by": "detector",
        "evidence_kind": None,
        "late_evidence": False,
    }
