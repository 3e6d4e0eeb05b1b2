"""Evaluating a whole cluster after a snapshot: read history from the store, judge, write results."""

from __future__ import annotations

from dataclasses import dataclass

from khipu.alerting.decide import alerts_for, group_changes, transitions
from khipu.health.evaluate import HealthConfig, PartitionHealth, evaluate_history
from khipu.health.rules import PartitionStatus
from khipu.store import Store


@dataclass(frozen=True, slots=True)
class ClusterEvaluation:
    evaluated_ms: int | None  # the snapshot judged (None: no snapshot yet)
    partitions: int
    statuses: dict[str, int]  # status name -> partitions
    transitions: int
    windows: int
    alerts: int


def evaluate_cluster(store: Store, cluster: str, config: HealthConfig) -> ClusterEvaluation:
    """Judge every partition of the cluster's newest snapshot, as of that snapshot's time.

    Idempotent: judging the same snapshot again finds no transition and records nothing twice.
    """
    latest = store.snapshots.latest(cluster)
    if not latest:
        return ClusterEvaluation(None, 0, {}, 0, 0, 0)
    now_ms = latest[0].snapshot_ms
    healths: list[PartitionHealth] = []
    for snapshot in latest:
        history = store.snapshots.partition_history(
            snapshot.key, live_limit=config.window_size, recent_limit=max(config.recent_log_ends, 2)
        )
        backlog = None
        if snapshot.lag and snapshot.committed is not None:
            backlog = store.snapshots.backlog_started_ms(
                cluster, snapshot.topic, snapshot.partition, snapshot.committed
            )
        healths.append(evaluate_history(history, now_ms, config, backlog))
    previous = {
        key: PartitionStatus[stored.status_name] for key, stored in store.health.current_statuses(cluster).items()
    }
    changes = transitions(previous, healths)
    windows = [window for health in healths for window in health.windows]
    alerts = alerts_for(group_changes(previous, healths), windows)
    store.health.save_evaluation(healths, changes, windows, alerts)
    counts: dict[str, int] = {}
    for health in healths:
        counts[health.status.name] = counts.get(health.status.name, 0) + 1
    return ClusterEvaluation(now_ms, len(healths), counts, len(changes), len(windows), len(alerts))
