"""Notifiers: where Khipu's alerts go. Built in: the task log, and a webhook (HTTP POST of JSON).

Each is an Airflow ``BaseNotifier`` (usable as a DAG or task failure callback) and an alert sink
(``send_alert``). Which ones run is configuration: ``KHIPU_NOTIFIERS`` holds a JSON list of
``{"class": "module.Class", "kwargs": {...}}``; without it, the log notifier runs, and the webhook
notifier too when the connection ``khipu_alert_webhook`` exists. Any class with a ``name`` and a
``send_alert(alert)`` method can be listed.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook, BaseNotifier

from khipu.alerting.dispatch import AlertSink
from khipu.alerting.model import Alert, task_failure_alert
from khipu.config import NotifierSection, load

log = logging.getLogger(__name__)

WEBHOOK_CONNECTION_ID = "khipu_alert_webhook"


class NotifierConfigError(ValueError):
    """KHIPU_NOTIFIERS is not a valid notifier list."""


class KhipuLogNotifier(BaseNotifier):  # type: ignore[misc]
    """Writes alerts to the task log (always available; the fallback when others fail)."""

    name = "log"

    def send_alert(self, alert: Alert) -> None:
        log.warning("KHIPU ALERT %s [%s] %s", alert.state.value.upper(), alert.severity.value, alert.title)

    def notify(self, context: Any) -> None:
        self.send_alert(failure_alert_from(context))


class KhipuWebhookNotifier(BaseNotifier):  # type: ignore[misc]
    """POSTs each alert's JSON payload to the URL of an Airflow connection.

    The connection gives the URL in its extra (``{"url": "https://..."}``) or as schema://host:port
    plus an extra ``endpoint``; a password, if set, is sent as a bearer token. The URL's path and
    query (which may hold tokens) are never logged, only its host.
    """

    name = "webhook"

    def __init__(self, conn_id: str = WEBHOOK_CONNECTION_ID, timeout_s: float = 10.0) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.timeout_s = timeout_s

    def _target(self) -> tuple[str, dict[str, str]]:
        conn = BaseHook.get_connection(self.conn_id)
        extra = dict(conn.extra_dejson or {})
        url = extra.get("url")
        if not url:
            if not conn.host:
                raise ValueError(f"connection {self.conn_id!r} has no webhook URL (extra 'url' or host)")
            base = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
            url = f"{base}{f':{conn.port}' if conn.port else ''}{extra.get('endpoint', '')}"
        headers = {"Content-Type": "application/json", "User-Agent": "khipu"}
        if conn.password:
            headers["Authorization"] = f"Bearer {conn.password}"
        return str(url), headers

    def send_alert(self, alert: Alert) -> None:
        url, headers = self._target()
        request = urllib.request.Request(url, data=json.dumps(alert.payload()).encode(), headers=headers, method="POST")
        host = urlsplit(url).netloc
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webhook at {host} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RuntimeError(f"webhook at {host} unreachable: {reason}") from None
        if not 200 <= status < 300:
            raise RuntimeError(f"webhook at {host} answered HTTP {status}")

    def notify(self, context: Any) -> None:
        self.send_alert(failure_alert_from(context))


def failure_alert_from(context: Any) -> Alert:
    ti = context.get("ti") or context.get("task_instance")
    dag = context.get("dag")
    dag_id = str(getattr(dag, "dag_id", None) or getattr(ti, "dag_id", None) or "unknown")
    error = context.get("exception") or context.get("reason") or "failed"
    return task_failure_alert(
        dag_id,
        getattr(ti, "task_id", None),
        context.get("run_id") or getattr(ti, "run_id", None),
        f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error),
        time.time_ns() // 1_000_000,
    )


def _connection_exists(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # the SDK raises its own not-found error type
        return False
    return True


def configured_notifiers(environ: Any = None) -> list[AlertSink]:
    """The notifiers to use now, from ``KHIPU_NOTIFIERS`` or the defaults (see the module doc)."""
    raw = load(NotifierSection, environ).notifiers
    if not raw:
        sinks: list[AlertSink] = [KhipuLogNotifier()]
        if _connection_exists(WEBHOOK_CONNECTION_ID):
            sinks.append(KhipuWebhookNotifier())
        return sinks
    try:
        specs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NotifierConfigError(
            f"KHIPU_NOTIFIERS is not JSON ({exc.msg}); expected a list of "
            '{"class": "module.Class", "kwargs": {...}}'
        ) from None
    if not isinstance(specs, list):
        raise NotifierConfigError(f"KHIPU_NOTIFIERS: got {type(specs).__name__}; expected a list")
    sinks = []
    for index, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("class"), str) or "." not in spec["class"]:
            raise NotifierConfigError(
                f'KHIPU_NOTIFIERS[{index}]: got {spec!r}; expected {{"class": "module.Class", "kwargs": {{...}}}}'
            )
        module_name, _, class_name = spec["class"].rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            raise NotifierConfigError(f"KHIPU_NOTIFIERS[{index}]: cannot import {spec['class']!r}") from None
        sink = cls(**spec.get("kwargs", {}))
        if not callable(getattr(sink, "send_alert", None)) or not isinstance(getattr(sink, "name", None), str):
            raise NotifierConfigError(f"KHIPU_NOTIFIERS[{index}]: {spec['class']} has no name and send_alert(alert)")
        sinks.append(sink)
    return sinks


def notify_failure(context: Any) -> None:
    """DAG / task failure callback: tell every configured notifier; a broken one never hides the failure."""
    alert = failure_alert_from(context)
    for sink in configured_notifiers():
        try:
            sink.send_alert(alert)
        except Exception as exc:
            log.error("notifier %s could not report failure of %s: %s", sink.name, alert.subject, exc)
