"""The code base stays lint-clean (ruff) and type-clean (mypy --strict on include/ and plugins/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing() -> None:
    result = run(str(BIN / "ruff"), "check", "include", "plugins", "dags", "spark", "bench", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes_on_the_product_code() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr
