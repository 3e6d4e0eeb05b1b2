"""Khipu's timetables, registered by a plugin of their own: khipu_reconcile's schedule (:class:`HourlySinceInstall`).

Apart from the Khipu view's plugin (:mod:`khipu_airflow.plugin`), which builds its app when Airflow imports it: a
view setting Airflow refuses (``KHIPU_VIEW_ACCESS``, the store URL) stops that plugin, never the scheduler's reading
of khipu_reconcile. Airflow imports every file of the plugins folder as a module named after the file alone, so the
class registered here is imported through its package, as the DAG imports it: Airflow finds a timetable by that
name (``khipu_airflow.timetables.HourlySinceInstall``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from khipu_airflow.timetables import HourlySinceInstall


class KhipuTimetablesPlugin(AirflowPlugin):  # type: ignore[misc]
    name = "khipu_timetables"
    timetables = [HourlySinceInstall]  # noqa: RUF012 - Airflow reads this class attribute
