"""An Airflow auth manager without Airflow's teams, whose custom views are granted per user as FAB grants
permissions to roles (``can_read`` on a resource): for the view's ``KHIPU_VIEW_ACCESS=custom-views`` tests
(tests/integration/view/test_view_custom_views.py). FAB itself is not installed in this project.

The SimpleAuthManager's users, roles, login and tokens, with three differences: it has no teams
(``is_authorized_team`` is the base class's, which says so); ``is_authorized_custom_view`` answers from
``KHIPU_TEST_CUSTOM_VIEWS``, a JSON object of user -> the resource names they may read; and ``is_authorized_dag``
grants DAGs one by one, as FAB grants ``DAG:<dag id>`` to roles, from ``KHIPU_TEST_DAGS`` (user -> DAG ids; Airflow's
admins get every DAG): reading for a viewer, triggering too for a user. Without ``KHIPU_TEST_DAGS``, the
SimpleAuthManager's own answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class CustomViewsAuthManager(SimpleAuthManager):
    is_authorized_team = BaseAuthManager.is_authorized_team  # no teams: "not compatible with multi-team"

    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        grants = os.environ.get("KHIPU_TEST_DAGS")
        if grants is None:
            return bool(
                super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
            )
        if self._is_admin(user):
            return True
        granted = json.loads(grants).get(user.username, [])
        if details is None or details.id is None:  # a question about DAGs in general (a list): answered per DAG
            return bool(granted)
        may_edit = method == "GET" or str(user.role).upper() in ("USER", "OP")  # FAB: can_read; can_edit
        return details.id in granted and may_edit

    def is_authorized_custom_view(self, *, method: Any, resource_name: str, user: Any) -> bool:
        granted = json.loads(os.environ.get("KHIPU_TEST_CUSTOM_VIEWS", "{}")).get(user.username, [])
        return method == "GET" and resource_name in granted  # FAB: ("can_read", resource) among the user's
