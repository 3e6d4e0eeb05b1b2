"""The code base stays lint-clean (ruff) and type-clean (mypy --strict on include/ and plugins/), and the
store stays apart from the domain it serves."""

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


def test_the_store_imports_no_domain_package() -> None:
    """The store serves health, alerting and the detector; they depend on it, never the other way round."""
    probe = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'include')!r}); import khipu.store; "
        "print(sorted(m for m in sys.modules if m.startswith(('khipu.health', 'khipu.alerting', 'khipu.detector'))))"
    )
    result = run(sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
