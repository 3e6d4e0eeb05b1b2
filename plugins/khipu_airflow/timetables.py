"""The reconciliation's schedule: hourly since the install, every hour after it caught up, none before it.

Registered by the Khipu plugin (:class:`khipu_airflow.plugin.KhipuPlugin`), as Airflow asks of a timetable of one's
own, so that the scheduler reads it back from the serialized DAG.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.trigger import CronTriggerTimetable

from khipu.reconcile.window import first_scheduled_hour_ms


class HourlySinceInstall(CronTriggerTimetable):  # type: ignore[misc]
    """Every full hour (UTC), the run's interval empty at its logical date (the hour ending there), like ``@hourly``.

    A DAG that never ran gets its first run at the next full hour after the scheduler first sees it (the install),
    whatever its start date: the hours before are backfill's, not a queue of runs ahead of the current one. Once it
    has run, every following hour runs (with ``catchup``: those missed while Airflow was down too), each once, in
    order. Airflow keeps the first run, like every run, in its metadata database."""

    description = "every hour (UTC), from the first full hour after the install; missed hours caught up"

    def __init__(self) -> None:
        super().__init__("0 * * * *", timezone="UTC")

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> HourlySinceInstall:
        return cls()

    def serialize(self) -> dict[str, Any]:
        return {}

    @property
    def summary(self) -> str:
        return "hourly since the install"

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        if last_automated_data_interval is None:  # never ran: from the install on, not from the DAG's start date
            now_ms = int(pendulum.now("UTC").timestamp() * 1000)
            install = pendulum.from_timestamp(first_scheduled_hour_ms(now_ms) / 1000, tz="UTC")
            restriction = TimeRestriction(install, restriction.latest, restriction.catchup)
        return super().next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction
        )
