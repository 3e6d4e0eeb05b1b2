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


# -- Airflow's Spark provider: its public API only ------------------------------------------------------------------

PLUGINS_ROOT = ROOT / "plugins"
HOOK = "SparkSubmitHook"


def private_hook_uses(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every private attribute (``._name``) taken from a SparkSubmitHook in a module: from a
    name bound to one (constructed there, returned by a function annotated to return one, or a parameter annotated
    as one), from a construction itself, or from a call of such a function."""
    tree = ast.parse(source)
    makers = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.returns is not None
        and HOOK in ast.unparse(node.returns)
    }

    def makes_hook(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        return called == HOOK or called in makers

    hooks: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and makes_hook(node.value):
            hooks |= {ast.unparse(target) for target in node.targets}
        elif isinstance(node, ast.AnnAssign) and (HOOK in ast.unparse(node.annotation) or makes_hook(node.value)):
            hooks.add(ast.unparse(node.target))
        elif isinstance(node, ast.arg) and node.annotation is not None and HOOK in ast.unparse(node.annotation):
            hooks.add(node.arg)
    return [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (ast.unparse(node.value) in hooks or makes_hook(node.value))
    ]


def test_the_private_hook_check_sees_the_launcher_it_replaced() -> None:
    """The check below can fail: the detector launcher as it was (the hook's _conf, _connection and
    _build_spark_submit_command) is caught, each use with its line."""
    old = (
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "def submit_hook(conn_id: str) -> SparkSubmitHook:\n"
        "    hook = SparkSubmitHook(conn_id=conn_id, conf={})\n"
        "    hook._conf.update({'a': 'b'})\n"
        "    return hook\n"
        "def restart(spark_conn_id: str) -> None:\n"
        "    hook = submit_hook(spark_conn_id)\n"
        "    if hook._connection['deploy_mode'] == 'cluster':\n"
        "        hook.submit('app')\n"
        "    launch(hook._build_spark_submit_command('app'))\n"
        "def command(hook: SparkSubmitHook) -> list[str]:\n"
        "    return submit_hook('x')._build_spark_submit_command('app') + [hook._name]\n"
    )
    assert [line for line, _ in private_hook_uses(old)] == [4, 8, 10, 12, 12]


def test_the_plugins_use_only_the_spark_submit_hooks_public_api() -> None:
    """Its constructor's arguments and submit(): never its private fields, which change between provider releases."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {expression}"
        for path in sorted(PLUGINS_ROOT.rglob("*.py"))
        for line, expression in private_hook_uses(path.read_text())
    ]
    assert found == []


def test_the_detector_launcher_does_not_load_the_local_stack() -> None:
    """The production launcher stands on khipu.process_group, not on khipu.localstack (the local stack's own)."""
    loaded = imported_by("khipu_airflow.detector", "khipu_airflow.reconcile", "khipu_airflow.spark_submit")
    assert {m for m in loaded if m.startswith("khipu.localstack")} == set()
    assert "khipu.process_group" in loaded  # what it stands on instead
