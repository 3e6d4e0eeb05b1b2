"""What the view's browser tests share: Airflow's api-server with this checkout's plugins, Debian's Chromium
(``scripts/ensure-chromium``; ``make test`` runs it) launched once per module, and the folder screenshots go to
(``KHIPU_SCREENSHOT_DIR``, else a temporary one: ``make screenshots`` sets it to docs/screenshots)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from khipu.localstack.processes import stop_process_group

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian's chromium is missing: run scripts/ensure-chromium (make test does)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("KHIPU_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def api_server(env: dict[str, str], port: int, log: Path) -> Iterator[str]:
    """``airflow api-server`` on 127.0.0.1:``port`` with ``env`` (its whole environment), its output in ``log``,
    until it answers its health check (at most 120 s); its base URL. Stopped by its process group afterwards."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not answers(f"{base}/api/v2/monitor/health"):
            assert process.poll() is None, f"the api-server exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the api-server did not answer in 120 s: {log.read_text()[-3000:]}"
            time.sleep(1)
        yield base
    finally:
        stop_process_group(process.pid)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3):
            return True
    except (urllib.error.URLError, OSError):
        return False
