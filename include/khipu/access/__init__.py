"""Who sees which streams in the Khipu view: a pure decision over the registry and what Airflow's auth manager
said of the person asking (:mod:`khipu.access.scope`); and which of Khipu's DAGs carry whose data in Airflow itself
(:mod:`khipu.access.dags`). The questions put to the auth manager are the plugin's
(``plugins/khipu_airflow/access.py``); docs/view.md#who-sees-which-streams says how a deployment sets it up."""

from __future__ import annotations

from khipu.access.dags import MANUAL_DAG, resend_dag_for, resend_dag_of, resend_refusal
from khipu.access.scope import (
    EVERY_STREAM_RESOURCE,
    EVERY_STREAM_TEAM,
    TEAM_RESOURCE_PREFIX,
    AccessUnanswered,
    Reach,
    SeenRegistry,
    Viewer,
    alert_in_reach,
    reach_limit,
    reach_of,
    seen_registry,
    sees_stream,
    team_resource,
)

__all__ = [
    "EVERY_STREAM_RESOURCE",
    "MANUAL_DAG",
    "EVERY_STREAM_TEAM",
    "TEAM_RESOURCE_PREFIX",
    "AccessUnanswered",
    "Reach",
    "SeenRegistry",
    "Viewer",
    "alert_in_reach",
    "reach_limit",
    "reach_of",
    "resend_dag_for",
    "resend_dag_of",
    "resend_refusal",
    "seen_registry",
    "sees_stream",
    "team_resource",
]
