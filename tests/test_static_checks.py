"""The code base stays lint-clean (ruff) and type-clean (mypy --strict on include/ and plugins/), and its packages
stay layered: none imports a package above it."""

from __future__ import annotations

import ast
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


# Khipu's packages from the bottom up: a module may import its own package and those below it, never one above.
# The verdict model sits below every judge; the store serves the domain; the tracing library applications embed
# stands on the trace format alone.
LAYERS = (
    "errors",
    "files",
    "process_group",
    "clock",
    "storage",
    "trace",
    "config",
    "registry",
    "access",
    "kafka",
    "tracing",
    "settings",
    "offsets",
    "store",
    "verdicts",
    "retention",
    "health",
    "detector",
    "alerting",
    "reconcile",
    "resend",
    "demo",
    "report",
    "localstack",
    "cli",
)
PACKAGE_ROOT = ROOT / "include" / "khipu"


def layer_of(module: str) -> str:
    """``khipu.detector.decide`` -> ``detector``; ``khipu.settings`` -> ``settings``; ``khipu`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "errors"


def khipu_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a khipu module in a file, at the top or inside a function."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, module) for module in modules if module == "khipu" or module.startswith("khipu.")]
    return found


def test_the_layers_name_every_package_and_module() -> None:
    """A new package or top-level module gets a place in LAYERS (else the check below would not see it)."""
    present = {p.name for p in PACKAGE_ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in PACKAGE_ROOT.glob("*.py") if p.stem != "__init__"}
    assert present - set(LAYERS) == set(), "give these a layer"
    assert set(LAYERS) - present == set(), "these layers no longer exist"


def test_no_package_imports_a_package_above_it() -> None:
    rank = {name: n for n, name in enumerate(LAYERS)}
    upward = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "include").with_suffix("").parts).removesuffix(".__init__")
        mine = layer_of(module)
        for line, imported in khipu_imports(path):
            theirs = layer_of(imported)
            if rank[theirs] > rank[mine]:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {imported} ({theirs} is above it)")
    assert upward == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check above can fail: a store module importing the detector is caught, with its line."""
    module = tmp_path / "upward.py"
    module.write_text("import os\n\nfrom khipu.detector.decide import decide\n")
    rank = {name: n for n, name in enumerate(LAYERS)}
    caught = [(line, m) for line, m in khipu_imports(module) if rank[layer_of(m)] > rank["store"]]
    assert caught == [(3, "khipu.detector.decide")]


def imported_by(*modules: str) -> set[str]:
    """Every module loaded by importing ``modules`` in a fresh interpreter (include/ and plugins/ on the path)."""
    probe = (
        f"import sys; sys.path[:0] = [{str(ROOT / 'include')!r}, {str(ROOT / 'plugins')!r}]; "
        + "".join(f"import {m}; " for m in modules)
        + "print('\\n'.join(sorted(sys.modules)))"
    )
    result = run(sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_the_tracing_library_loads_neither_the_registry_nor_yaml_nor_spark() -> None:
    """What applications embed stands on the trace format: no PyYAML, no Spark, no registry loader."""
    loaded = imported_by("khipu.tracing")
    assert {m for m in loaded if m.split(".")[0] in ("yaml", "pyspark", "airflow")} == set()
    assert {m for m in loaded if m.startswith("khipu.")} <= {
        m for m in loaded if m.startswith(("khipu.trace", "khipu.tracing", "khipu.errors"))
    }
    assert {m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_settings")} == set()  # loaded on demand


def test_the_airflow_plugins_do_not_load_spark() -> None:
    """The plugins start Spark drivers as processes; importing them (every scheduler and web server does) never
    loads pyspark."""
    loaded = imported_by("khipu_airflow.plugin", "khipu_airflow.detector", "khipu_airflow.reconcile")
    assert {m for m in loaded if m.startswith("pyspark")} == set()
