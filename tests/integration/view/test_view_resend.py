"""A confirmed loss resent from its message's page, in Chromium, by a real Airflow user of the stream's team: a dry
run of the team's ``khipu_resend_manual__team-orders`` first (it writes nothing, and says it would resend the
message), then the real run, with its outcome and the resend ledger's attempt on the page, and exactly one copy in
the topic.

Real parts: the session's Kafka broker holding the original, a SQLite store holding the loss as reconciliation
leaves it, and Airflow in multi-team mode (api-server, scheduler, dag-processor with this checkout's DAG and
plugin in the bundles `khipu airflow-bundles` gives; the SimpleAuthManager's users in Airflow's teams). Others may
not: a user of another team (404, as for a message that does not exist), a viewer of the stream's own team (no
button; 403), a real run without a dry run.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser, Page

from khipu.localstack.airflow import StackUser
from khipu.localstack.broker import BrokerProcess
from khipu.registry import parse_registry
from khipu.store import Store
from khipu.verdicts.model import Cause, VerdictKind
from tests.integration.resend.pipeline import Pipeline, message_id_of, resent_copies
from tests.integration.view.airflowteams import RunningAirflow, airflow_with_teams

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OWNER, OTHER_TEAM, VIEWER = "olga", "rita", "vera"
USERS = (
    StackUser("admin", "admin"),
    StackUser(OWNER, "user", ("team-orders",)),  # may trigger DAGs, in the stream's team
    StackUser(OTHER_TEAM, "user", ("team-refunds",)),  # may trigger DAGs, another team
    StackUser(VIEWER, "viewer", ("team-orders",)),  # the stream's team, may not trigger DAGs
)
RUN_TIMEOUT_MS = 180_000
TEAM_DAG = "khipu_resend_manual__team-orders"  # the stream's team's own (khipu.access.dags)


def registry_text(inp: str, out: str) -> str:
    return f"""
version: 1
clusters: {{local: {{connection_id: khipu_kafka}}}}
streams:
  orders:
    owner: team-orders
    resend: {{mode: manual}}
    route:
      producers: [{{location: p, writes: [local/{inp}]}}]
      consumers:
        - {{group: proc, location: proc, reads: [local/{inp}], writes: [local/{out}]}}
        - {{group: s1, reads: [local/{out}]}}
        - {{group: s2, reads: [local/{out}]}}
  refunds:
    owner: team-refunds
    route:
      producers: [{{location: r, writes: [local/{inp}-refunds]}}]
      consumers: []
"""


@dataclass
class Stack:
    airflow: RunningAirflow
    pipeline: Pipeline
    lost: str  # CONFIRMED_LOST at s1, its original still in the topic
    hop: str

    def post(self, user: str, path: str, form: dict[str, str]) -> tuple[int, str]:
        token = self.airflow.token(user)
        request = urllib.request.Request(
            f"{self.airflow.base}/khipu{path}",
            data=urlencode(form).encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": self.airflow.base,  # as the view's own page sends it (khipu_airflow.view.guard)
            },
            method="POST",
        )
        opener = urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(request, timeout=60) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()


@pytest.fixture(scope="module")
def stack(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("view-resend")
    suffix = secrets.token_hex(3)
    inp, out = f"in-{suffix}", f"out-{suffix}"
    broker.admin().ensure_topics({inp: 1, out: 2})
    registry_file = work / "registry.yaml"
    registry_file.write_text(registry_text(inp, out))
    store_path = work / "khipu.db"
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    pipeline = Pipeline(broker, store, parse_registry(registry_text(inp, out)), inp, out)
    hop = pipeline.hops["s1"]
    at = pipeline.write(out, 1, "m-view-lost", b"order-77")
    pipeline.verdict(
        "m-view-lost", hop, VerdictKind.CONFIRMED_LOST, cause=Cause.SKIPPED_BY_CONSUMER, partition=1, offset=at
    )
    env = {
        "KHIPU_STORE_URL": f"sqlite:///{store_path}",
        "KHIPU_STATE_DIR": str(work / "state"),
        "KHIPU_REGISTRY": str(registry_file),
        "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local"}}
        ),
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", ""),
    }
    with airflow_with_teams(work, USERS, env, dags=(ROOT / "dags" / "khipu_resend_manual.py",)) as airflow:
        _wait_for_the_dag(airflow)
        yield Stack(airflow, pipeline, "m-view-lost", hop)


def test_others_may_not_resend_the_loss(stack: Stack) -> None:
    form = {"hop": stack.hop}
    status, body = stack.post(OTHER_TEAM, f"/messages/{stack.lost}/resend", form)
    assert status == 404 and "no verdict and no archived trace" in body  # another team's: as if it did not exist
    status, body = stack.post(VIEWER, f"/messages/{stack.lost}/resend", form)
    assert status == 403 and f"you may not trigger the DAG {TEAM_DAG}" in body
    status, body = stack.post(OWNER, f"/messages/{stack.lost}/resend", {**form, "after": "manual__no-such-run"})
    assert status == 404, body  # a real run names its dry run; Airflow knows no such run
    assert resent_copies(stack.pipeline) == [] and _runs(stack.airflow) == []


def test_a_confirmed_loss_is_resent_from_its_page_dry_run_first(stack: Stack, browser: Browser, shots: Path) -> None:
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        message_page = f"{stack.airflow.base}/khipu/messages/{stack.lost}"
        _log_in(page, stack.airflow, OWNER, message_page)
        assert page.get_by_test_id("resend-offer").get_attribute("data-hop") == stack.hop

        clicked = time.monotonic()
        page.get_by_test_id("dry-run").click()
        dry = _finished_run(page)
        print(f"dry run: its outcome on the page {time.monotonic() - clicked:.1f} s after the click")
        assert (dry.get_attribute("data-dry-run"), dry.get_attribute("data-state")) == ("yes", "success")
        assert dry.locator('[data-field="outcome"]').all_inner_texts() == ["would_resend"]
        assert resent_copies(stack.pipeline) == []  # a dry run writes nothing: no copy, no ledger row
        assert stack.pipeline.store.resends.of_messages([stack.lost]) == {}
        page.screenshot(path=str(shots / "resend-dry-run.png"), full_page=True)

        clicked = time.monotonic()
        page.get_by_test_id("resend-for-real").click()
        real = _finished_run(page)
        print(f"real run: its outcome on the page {time.monotonic() - clicked:.1f} s after the click")
        assert (real.get_attribute("data-dry-run"), real.get_attribute("data-state")) == ("no", "success")
        assert real.locator('[data-field="outcome"]').all_inner_texts() == ["produced"]
        (copy,) = resent_copies(stack.pipeline)  # exactly one copy, of this message, where the ledger says
        (attempt,) = stack.pipeline.store.resends.of_messages([stack.lost])[(stack.lost, stack.hop)]
        assert message_id_of(copy) == stack.lost and attempt["state"] == "produced"
        assert (copy.partition(), copy.offset()) == (attempt["produced_partition"], attempt["produced_offset"])
        ledger = page.locator(f'table[data-testid="resends"] tr[data-resend="{attempt["resend_id"]}"]')
        assert ledger.locator('[data-field="state"]').inner_text() == "produced"
        assert f"[{copy.partition()}]@{copy.offset()}" in ledger.inner_text()
        assert not page.get_by_test_id("resend-for-real").count()  # no real run after a real run
        page.screenshot(path=str(shots / "resend-done.png"), full_page=True)
    finally:
        page.close()

    runs = _runs(stack.airflow)
    assert [(r["conf"]["dry_run"], r["state"]) for r in runs] == [(True, "success"), (False, "success")]
    assert {r["triggering_user_name"] for r in runs} == {OWNER}  # Airflow says who triggered them
    real_run_id = runs[1]["dag_run_id"]
    status, body = stack.post(OWNER, f"/messages/{stack.lost}/resend", {"hop": stack.hop, "after": real_run_id})
    assert status == 409 and "is not a dry run" in body  # a real run follows a dry run, not another real run


def _finished_run(page: Page) -> Any:
    """The run the page follows, once it ended (the page reloads itself until then)."""
    page.wait_for_url("**resend_run=**")
    run = page.locator('[data-testid="resend-run"]')
    page.locator('[data-testid="resend-run"][data-state="success"], [data-testid="resend-run"][data-state="failed"]')\
        .wait_for(timeout=RUN_TIMEOUT_MS)  # fmt: skip
    return run


def _log_in(page: Page, airflow: RunningAirflow, user: str, target: str) -> None:
    page.goto(target)
    page.wait_for_url("**/auth/login**")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(airflow.password(user))
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(target, timeout=30_000)


def _wait_for_the_dag(airflow: RunningAirflow) -> None:
    token = airflow.token("admin")
    deadline = time.monotonic() + 180
    while True:
        request = urllib.request.Request(
            f"{airflow.base}/api/v2/dags/{TEAM_DAG}", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                if not json.loads(answer.read())["is_paused"]:
                    return
        except urllib.error.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{TEAM_DAG} not parsed in 180 s:\n{airflow.log_tail()}"
        time.sleep(2)


def _runs(airflow: RunningAirflow) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{airflow.base}/api/v2/dags/{TEAM_DAG}/dagRuns?order_by=run_after",
        headers={"Authorization": f"Bearer {airflow.token('admin')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return list(json.loads(answer.read())["dag_runs"])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None
