"""Notifiers: configuration errors are named; the webhook posts JSON and reports failures without secrets."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from khipu.alerting.model import Alert, AlertState, Severity
from khipu_airflow.notifiers import KhipuLogNotifier, KhipuWebhookNotifier, NotifierConfigError, configured_notifiers

ALERT = Alert("k1", "group g on local", "group_status", AlertState.FIRING, Severity.CRITICAL, "STALL: g", 5, {"x": 1})


@pytest.fixture
def server() -> Iterator[tuple[int, list[tuple[dict[str, str], Any]]]]:
    seen: list[tuple[dict[str, str], Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append((dict(self.headers), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], seen
    httpd.shutdown()


def test_webhook_posts_the_alert_payload_with_a_bearer_token(
    server: tuple[int, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, seen = server
    monkeypatch.setenv(
        "AIRFLOW_CONN_HOOK1",
        json.dumps(
            {"conn_type": "http", "host": "127.0.0.1", "port": port, "password": "t0ken", "extra": {"endpoint": "/in"}}
        ),
    )
    KhipuWebhookNotifier("hook1").send_alert(ALERT)
    [(headers, body)] = seen
    assert body == ALERT.payload() and body["state"] == "firing"
    assert headers["Authorization"] == "Bearer t0ken"


def test_webhook_failure_names_the_host_not_the_path_or_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_HOOK2",
        json.dumps({"conn_type": "http", "extra": {"url": "http://127.0.0.1:1/secret-path?token=abc"}}),
    )
    with pytest.raises(RuntimeError) as caught:
        KhipuWebhookNotifier("hook2", timeout_s=2).send_alert(ALERT)
    assert "127.0.0.1:1" in str(caught.value) and "secret-path" not in str(caught.value)
    assert "abc" not in str(caught.value)


def test_default_notifiers_are_the_log_and_the_webhook_when_its_connection_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK", raising=False)
    assert [n.name for n in configured_notifiers({})] == ["log"]
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK", json.dumps({"conn_type": "http", "extra": {"url": "x"}}))
    assert [n.name for n in configured_notifiers({})] == ["log", "webhook"]


def test_notifiers_from_configuration() -> None:
    env = {
        "KHIPU_NOTIFIERS": json.dumps(
            [{"class": "khipu_airflow.notifiers.KhipuWebhookNotifier", "kwargs": {"conn_id": "ops", "timeout_s": 3}}]
        )
    }
    [sink] = configured_notifiers(env)
    assert isinstance(sink, KhipuWebhookNotifier) and (sink.conn_id, sink.timeout_s) == ("ops", 3)
    assert isinstance(configured_notifiers({"KHIPU_NOTIFIERS": "[]"}), list)
    assert KhipuLogNotifier.name == "log"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{oops", "KHIPU_NOTIFIERS is not JSON"),
        ('{"class": "x.Y"}', "KHIPU_NOTIFIERS: got dict; expected a list"),
        ('[{"kwargs": {}}]', "KHIPU_NOTIFIERS[0]: got {'kwargs': {}}; expected"),
        ('[{"class": "no.such.Module"}]', "KHIPU_NOTIFIERS[0]: cannot import 'no.such.Module'"),
        ('[{"class": "json.JSONDecoder"}]', "KHIPU_NOTIFIERS[0]: json.JSONDecoder has no name and send_alert(alert)"),
    ],
)
def test_bad_notifier_configuration_is_named(raw: str, message: str) -> None:
    with pytest.raises(NotifierConfigError) as caught:
        configured_notifiers({"KHIPU_NOTIFIERS": raw})
    assert str(caught.value).startswith(message)
