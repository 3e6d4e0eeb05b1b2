"""The reconciliation's schedule: hourly from the install on, every hour after it caught up, none before it.

Registered by a plugin of its own (:mod:`khipu_airflow.timetable_plugin`), as Airflow asks of a timetable of one's
own, so that the scheduler reads it back from the serialized DAG whatever becomes of the Khipu view's plugin.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.trigger import CronTriggerTimetable

from khipu.clock import iso_text
from khipu.reconcile.window import next_scheduled_hour_ms


def _ms(moment: Any) -> int:
    return int(moment.timestamp() * 1000)


class HourlySinceInstall(CronTriggerTimetable):  # type: ignore[misc]
    """Every full hour (UTC), the run's interval empty at its logical date (the hour ending there), like ``@hourly``,
    from the first full hour after the install on (:func:`khipu.reconcile.window.next_scheduled_hour_ms`).

    ``installed_ms`` is when the store was created (:meth:`khipu.store.Store.installed_ms`), read when the DAG is
    parsed and kept in the serialized DAG: the scheduler decides from it alone. None (the store could not be read):
    a DAG that never ran starts at the next full hour."""

    def __init__(self, installed_ms: int | None = None) -> None:
        super().__init__("0 * * * *", timezone="UTC")
        self.installed_ms = installed_ms
        since = "unknown: from the next full hour" if installed_ms is None else iso_text(installed_ms)
        self.description = f"every hour (UTC) from the first full hour after the install ({since}); missed hours run"

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> HourlySinceInstall:
        return cls(data.get("installed_ms"))

    def serialize(self) -> dict[str, Any]:
        return {"installed_ms": self.installed_ms}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HourlySinceInstall) and self.installed_ms == other.installed_ms

    def __hash__(self) -> int:
        return hash((type(self), self.installed_ms))

    @property
    def summary(self) -> str:
        return "hourly since the install"

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        hour_ms = next_scheduled_hour_ms(
            None if last_automated_data_interval is None else _ms(last_automated_data_interval.end),
            self.installed_ms,
            _ms(pendulum.now("UTC")),
            not_before_ms=None if restriction.earliest is None else _ms(restriction.earliest),
            catchup=restriction.catchup,
        )
        hour = pendulum.from_timestamp(hour_ms / 1000, tz="UTC")
        if restriction.latest is not None and hour > restriction.latest:
            return None
        return DagRunInfo.interval(hour, hour)
