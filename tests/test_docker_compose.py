"""Checks of docker-compose.yaml, the production-like reference stack.

There is no Docker engine on the development machine, so the stack cannot be started here: these
tests parse the file (YAML anchors and ``<<:`` merge keys resolved by ``yaml.safe_load``), the
Dockerfiles and configuration it points at, and check what can be checked without running it — the
services it must define, the files it points at, the Airflow executor and database, the Airflow
connections it declares — and check it against what Khipu's code needs: the settings the model
declares and accepts, the trace topic's configuration, the Python and packages the Spark executors
run, one object store shared by the driver's services and the executors, PostgreSQL for the store,
the exporter scraped by Prometheus and drawn by Grafana, and no secret written anywhere.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from khipu.config import SECTIONS, unknown_variables
from khipu.config.load import masked, variables
from khipu.config.model import MASK
from khipu.detector.launch import DetectorJobError, check_deployment
from khipu.kafka.admin import TRACE_TOPIC_CONFIG
from khipu.report.exporter import METRICS_PATH, ExporterConfig
from khipu.settings import KhipuSettings
from khipu.storage.location import AWS_SDK_DEFAULTS
from khipu.storage.spark import ENDPOINT_VARIABLE, s3_endpoint

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
COMPOSE_DIR = COMPOSE_FILE.parent
ENV_EXAMPLE = ROOT / "docker" / ".env.example"
CONSTRAINTS = ROOT / "constraints.txt"
REQUIREMENTS = ROOT / "requirements.txt"
# What Spark runs on the executors: the trace decoder and the detector's stateful processor (built by
# khipu.detector.job) and reconciliation's reads; and what the exporter and the `khipu` command import.
KHIPU_IMAGE_MODULES = ("khipu.detector.job", "khipu.reconcile.run", "khipu.report.exporter", "khipu.cli")
SPARK_PACKAGES = ("pyspark", "pyarrow", "pandas")  # what PySpark needs equal on the driver and the executors
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# names of variables that hold a secret, besides those the settings model marks (khipu.config.model.Masked)
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|FERNET|ACCESS_KEY")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}, ...; $${...} is a literal $
INTERPOLATION = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")

AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Where the Khipu code must appear inside every long-running Airflow container.
KHIPU_MOUNTS = {
    "./dags": "/opt/airflow/dags",
    "./plugins": "/opt/airflow/plugins",
    "./include": "/opt/khipu/include",
    "./spark": "/opt/khipu/spark",
    "./config": "/opt/khipu/config",
}


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict), f"{COMPOSE_FILE.name} must be a YAML mapping, got {type(document).__name__}"
    assert isinstance(document.get("services"), dict) and document["services"], (
        f"{COMPOSE_FILE.name} has no 'services' mapping"
    )
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whether written as a mapping or as a list of KEY=VALUE."""
    raw = service.get("environment") or {}
    if isinstance(raw, dict):
        return {str(key): "" if value is None else str(value) for key, value in raw.items()}
    environment: dict[str, str] = {}
    for item in raw:
        key, _, value = str(item).partition("=")
        environment[key] = value
    return environment


def command_text(service: dict[str, Any]) -> str:
    """A service's entrypoint and command as one string (both may be strings or lists)."""
    parts: list[str] = []
    for field in ("entrypoint", "command"):
        value = service.get(field)
        if isinstance(value, list):
            parts.extend(str(item) for item in value)
        elif value is not None:
            parts.append(str(value))
    return " ".join(parts)


def bind_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of every bind mount with a relative host path, short or long syntax."""
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            source, target = str(volume.get("source", "")), str(volume.get("target", ""))
        else:
            source, _, rest = str(volume).partition(":")
            target = rest.split(":", 1)[0]
        if source.startswith((".", "/", "~")):
            yield source, target


def build_of(service: dict[str, Any]) -> tuple[str, str] | None:
    """(context, dockerfile) of a service that builds its image, else None."""
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return build, "Dockerfile"
    return str(build.get("context", ".")), str(build.get("dockerfile", "Dockerfile"))


def is_airflow_image(service: dict[str, Any]) -> bool:
    built = build_of(service)
    image = str(service.get("image", ""))
    return (built is not None and "airflow" in built[1].lower()) or image.split(":")[0].endswith("airflow")


def airflow_component(services: dict[str, dict[str, Any]], component: str) -> tuple[str, dict[str, Any]]:
    """The service that runs ``airflow <component>`` (the image's entrypoint is ``airflow``)."""
    pattern = re.compile(rf"(^|\s){re.escape(component)}(\s|$)")
    matches = [
        (name, service)
        for name, service in services.items()
        if is_airflow_image(service) and pattern.search(command_text(service))
    ]
    assert len(matches) == 1, (
        f"expected exactly one Airflow service running `airflow {component}`, found "
        f"{[name for name, _ in matches] or 'none'}"
    )
    return matches[0]


def airflow_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {name: service for name, service in services.items() if is_airflow_image(service)}
    assert found, "no service uses the Airflow image (build with an airflow Dockerfile or an */airflow image)"
    return found


def resolve(path: str) -> Path:
    return (COMPOSE_DIR / path).resolve()


def service_running(services: dict[str, dict[str, Any]], main_class: str) -> list[str]:
    return [name for name, service in services.items() if main_class in command_text(service)]


def spark_workers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {name: services[name] for name in service_running(services, "org.apache.spark.deploy.worker.Worker")}
    assert found, "no Spark worker service"
    return found


def exporter_service(services: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    found = [(name, s) for name, s in services.items() if re.search(r"(^|\s)khipu exporter(\s|$)", command_text(s))]
    assert len(found) == 1, f"expected one service running `khipu exporter`, found {[name for name, _ in found]}"
    return found[0]


def drivers_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run Khipu beside the executors: the Airflow components (their tasks are the Spark
    drivers, the view reads the archives) and the exporter."""
    name, exporter = exporter_service(services)
    return {**airflow_services(services), name: exporter}


def image_service(services: dict[str, dict[str, Any]], image: str) -> tuple[str, dict[str, Any]]:
    found = [(name, s) for name, s in services.items() if str(s.get("image", "")).split(":")[0] == image]
    assert len(found) == 1, f"expected one service of the image {image}, found {[name for name, _ in found]}"
    return found[0]


def mount_source(service: dict[str, Any], target: str) -> Path:
    """The repository path a service bind-mounts at ``target``."""
    for source, mounted in bind_mounts(service):
        if mounted.rstrip("/") == target.rstrip("/"):
            return resolve(source)
    raise AssertionError(f"nothing is mounted at {target}; bind mounts: {list(bind_mounts(service))}")


def resolved(environment: dict[str, str]) -> dict[str, str]:
    """The environment as a container would get it: ``${NAME:?...}`` (a value the operator must give) as a
    placeholder, ``${NAME:-default}`` as its default, ``${NAME}`` as empty."""

    def value(match: re.Match[str]) -> str:
        operator, rest = match.group(2) or "", match.group(3) or ""
        if "?" in operator:
            return f"given-{match.group(1).lower().replace('_', '-')}"
        return rest if "-" in operator else ""

    return {key: INTERPOLATION.sub(value, raw) for key, raw in environment.items()}


def required_variable(value: str) -> str | None:
    """The variable, when ``value`` is exactly one ``${NAME:?...}`` or ``${NAME?...}``: a value the operator
    must give, with no default written here."""
    match = INTERPOLATION.fullmatch(value.strip())
    return match.group(1) if match and "?" in (match.group(2) or "") else None


def khipu_settings(service: dict[str, Any]) -> KhipuSettings:
    return KhipuSettings.from_env(resolved(environment_of(service)))


def dockerfile_of(service: dict[str, Any]) -> Path:
    built = build_of(service)
    assert built is not None, f"the service with image {service.get('image')!r} builds no image"
    return resolve(built[0]) / built[1]


def instructions(dockerfile: Path, keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction, continuation lines joined, comments left out."""
    lines = [line for line in dockerfile.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.split(None, 1)[:1] == [keyword]]


def base_image(dockerfile: Path) -> str:
    """The image the final stage starts from."""
    tokens = [token for token in instructions(dockerfile, "FROM")[-1].split() if not token.startswith("--")]
    return tokens[0]


def python_of(image: str) -> str:
    found = re.search(r"python:?(\d+\.\d+)", image)
    assert found, f"the image {image!r} names no Python version"
    return found.group(1)


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of every ``pip install`` the Dockerfile runs."""
    commands = [part for run in instructions(dockerfile, "RUN") for part in re.split(r"&&|;", run)]
    return [
        words[words.index("install") + 1 :]
        for command in commands
        if "pip" in (words := shlex.split(command)) and "install" in words
    ]


def option_values(arguments: list[str], *options: str) -> list[str]:
    return [arguments[i + 1] for i, argument in enumerate(arguments[:-1]) if argument in options]


def package_name(requirement: str) -> str:
    """PEP 503's normalized name of a requirement line (``PyYAML==6.0.3`` -> ``pyyaml``)."""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert found, f"not a requirement: {requirement!r}"
    return re.sub(r"[-_.]+", "-", found.group(0)).lower()


def requirement_lines(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]


def pins(path: Path) -> dict[str, str]:
    """name -> pinned version of a requirements or constraints file (``name==version`` lines)."""
    return {package_name(line): line.split("==", 1)[1].strip() for line in requirement_lines(path) if "==" in line}


def shell_commands(service: dict[str, Any]) -> list[list[str]]:
    """The words of each command a service runs: its entrypoint and command, or the script they hand a shell
    (``sh -c SCRIPT``), one command per line or ``&&``."""
    argv: list[str] = []
    for field in ("entrypoint", "command"):
        value = service.get(field)
        argv.extend(str(item) for item in value) if isinstance(value, list) else argv.extend(shlex.split(value or ""))
    script = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else shlex.join(argv)
    return [shlex.split(part) for line in script.splitlines() for part in line.split("&&") if part.strip()]


def strings_of(document: object) -> Iterator[str]:
    """Every key and value of the parsed compose file (comments left out)."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield str(key)
            yield from strings_of(value)
    elif isinstance(document, list):
        for item in document:
            yield from strings_of(item)
    elif document is not None:
        yield str(document)


def interpolations(compose: dict[str, Any]) -> list[re.Match[str]]:
    return [match for text in strings_of(compose) for match in INTERPOLATION.finditer(text)]


# ----------------------------------------------------------------------------- (a) services


def test_kafka_runs_in_kraft_mode_as_broker_and_controller(services: dict[str, dict[str, Any]]) -> None:
    kraft = {
        name: environment_of(service)["KAFKA_PROCESS_ROLES"]
        for name, service in services.items()
        if "KAFKA_PROCESS_ROLES" in environment_of(service)
    }
    assert kraft, "no Kafka service sets KAFKA_PROCESS_ROLES (KRaft mode, no ZooKeeper)"
    for name, roles in kraft.items():
        role_set = {role.strip() for role in roles.split(",")}
        assert role_set <= {"broker", "controller"} and role_set, f"{name}: KAFKA_PROCESS_ROLES={roles!r} is not KRaft"
    all_roles = {role.strip() for roles in kraft.values() for role in roles.split(",")}
    assert {"broker", "controller"} <= all_roles, f"the KRaft services have roles {sorted(all_roles)}, need both"
    assert not any("zookeeper" in str(service.get("image", "")).lower() for service in services.values()), (
        "a ZooKeeper service is defined next to KRaft"
    )


def test_kafka_listens_on_9092_for_clients_in_the_network(services: dict[str, dict[str, Any]]) -> None:
    brokers = {
        name: environment_of(service)
        for name, service in services.items()
        if "broker" in environment_of(service).get("KAFKA_PROCESS_ROLES", "")
    }
    assert brokers, "no Kafka broker service"
    for name, env in brokers.items():
        advertised = env.get("KAFKA_ADVERTISED_LISTENERS", "")
        assert f"//{name}:9092" in advertised, (
            f"{name}: KAFKA_ADVERTISED_LISTENERS={advertised!r} does not advertise {name}:9092 to the network"
        )


def test_spark_has_a_master_and_a_worker_registered_with_it(services: dict[str, dict[str, Any]]) -> None:
    masters = [
        name for name, service in services.items() if "org.apache.spark.deploy.master.Master" in command_text(service)
    ]
    workers = [
        name for name, service in services.items() if "org.apache.spark.deploy.worker.Worker" in command_text(service)
    ]
    assert len(masters) == 1, f"expected one Spark master service, found {masters}"
    assert workers, "no Spark worker service"
    master = masters[0]
    for worker in workers:
        assert f"spark://{master}:7077" in command_text(services[worker]), (
            f"Spark worker {worker} does not register with spark://{master}:7077"
        )
    published = " ".join(str(port) for port in services[master].get("ports") or [])
    for port in ("7077", "8080"):
        assert re.search(rf":{port}(/tcp)?\b", published), f"Spark master {master} does not publish port {port}"
    # one Spark for all: the master and every worker run the image Khipu builds (its Spark is the pinned pyspark)
    builds = {name: build_of(services[name]) for name in (*masters, *workers)}
    assert len(set(builds.values())) == 1 and None not in builds.values(), (
        f"the Spark master and workers must run one image built here, with Khipu's pinned pyspark; they build {builds}"
    )


def test_postgres_16_serves_airflow_and_the_khipu_store(services: dict[str, dict[str, Any]]) -> None:
    postgres = [name for name, service in services.items() if str(service.get("image", "")).startswith("postgres:")]
    assert len(postgres) == 1, f"expected one PostgreSQL service, found {postgres}"
    image = str(services[postgres[0]]["image"])
    assert image.split(":", 1)[1].startswith("16"), f"PostgreSQL image is {image!r}, want 16"
    init_scripts = [
        source
        for source, target in bind_mounts(services[postgres[0]])
        if target.startswith("/docker-entrypoint-initdb.d")
    ]
    assert init_scripts, "PostgreSQL mounts no init script creating the Khipu store database"
    sql = "\n".join(resolve(script).read_text(encoding="utf-8") for script in init_scripts)
    assert re.search(r"CREATE\s+DATABASE\s+khipu", sql, re.IGNORECASE), "the init script does not create database khipu"
    assert re.search(r"CREATE\s+(ROLE|USER)\s+khipu", sql, re.IGNORECASE), "the init script does not create role khipu"


@pytest.mark.parametrize("component", AIRFLOW_COMPONENTS)
def test_each_airflow_component_has_its_own_service(services: dict[str, dict[str, Any]], component: str) -> None:
    name, service = airflow_component(services, component)
    assert service.get("healthcheck"), f"{name} (airflow {component}) has no healthcheck"


def test_airflow_init_migrates_the_database_before_the_components_start(services: dict[str, dict[str, Any]]) -> None:
    inits = [
        name
        for name, service in services.items()
        if is_airflow_image(service) and "db migrate" in command_text(service)
    ]
    assert len(inits) == 1, f"expected one Airflow service running `airflow db migrate`, found {inits}"
    init = inits[0]
    for component in AIRFLOW_COMPONENTS:
        name, service = airflow_component(services, component)
        depends_on = service.get("depends_on") or {}
        assert isinstance(depends_on, dict) and init in depends_on, f"{name} does not depend on {init}"
        assert depends_on[init].get("condition") == "service_completed_successfully", (
            f"{name} must wait for {init} to complete successfully, has {depends_on[init]!r}"
        )


def test_every_depends_on_names_a_defined_service(services: dict[str, dict[str, Any]]) -> None:
    unknown = [
        (name, dependency)
        for name, service in services.items()
        for dependency in (service.get("depends_on") or [])
        if dependency not in services
    ]
    assert not unknown, f"depends_on names services that are not defined: {unknown}"


def test_service_healthy_conditions_point_at_services_with_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    missing = [
        (name, dependency)
        for name, service in services.items()
        if isinstance(service.get("depends_on"), dict)
        for dependency, spec in service["depends_on"].items()
        if isinstance(spec, dict)
        and spec.get("condition") == "service_healthy"
        and not services.get(dependency, {}).get("healthcheck")
    ]
    assert not missing, f"service_healthy waits on services without a healthcheck: {missing}"


# ----------------------------------------------------------------------------- (b) paths


def test_every_mounted_path_exists_in_the_repository(services: dict[str, dict[str, Any]]) -> None:
    mounts = [(name, source) for name, service in services.items() for source, _ in bind_mounts(service)]
    assert mounts, "no bind mounts found: the Khipu code is not mounted anywhere"
    missing = [f"{name}: {source} -> {resolve(source)}" for name, source in mounts if not resolve(source).exists()]
    assert not missing, "bind-mount sources missing from the repository:\n" + "\n".join(missing)


def test_every_build_context_and_dockerfile_exists(services: dict[str, dict[str, Any]]) -> None:
    builds = {name: built for name, service in services.items() if (built := build_of(service)) is not None}
    assert builds, "no service builds an image (the Airflow image must be built from docker/airflow.Dockerfile)"
    for name, (context, dockerfile) in builds.items():
        assert resolve(context).is_dir(), f"{name}: build context {context} ({resolve(context)}) is not a directory"
        dockerfile_path = (resolve(context) / dockerfile).resolve()
        assert dockerfile_path.is_file(), f"{name}: Dockerfile {dockerfile} ({dockerfile_path}) does not exist"


def test_files_the_airflow_dockerfile_copies_exist_in_its_context(services: dict[str, dict[str, Any]]) -> None:
    builds = {built for service in services.values() if (built := build_of(service)) is not None}
    assert builds, "no service builds an image"
    for context, dockerfile in builds:
        text = (resolve(context) / dockerfile).read_text(encoding="utf-8")
        for line in text.splitlines():
            tokens = line.split()
            if not tokens or tokens[0].upper() not in {"COPY", "ADD"} or any(t.startswith("--from") for t in tokens):
                continue
            sources = [token for token in tokens[1:-1] if not token.startswith("--")]
            for source in sources:
                assert (resolve(context) / source).exists(), (
                    f"{dockerfile} copies {source}, which is missing from the build context {resolve(context)}"
                )


def test_airflow_services_mount_the_khipu_code(services: dict[str, dict[str, Any]]) -> None:
    for component in AIRFLOW_COMPONENTS:
        name, service = airflow_component(services, component)
        mounted = {source.rstrip("/"): target.rstrip("/") for source, target in bind_mounts(service)}
        for source, target in KHIPU_MOUNTS.items():
            assert mounted.get(source) == target, (
                f"{name} must mount {source} at {target}; its bind mounts are {mounted}"
            )


def test_every_named_volume_is_declared(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    declared = set(compose.get("volumes") or {})
    used = {
        (name, str(volume).split(":", 1)[0])
        for name, service in services.items()
        for volume in service.get("volumes") or []
        if isinstance(volume, str) and not str(volume).startswith((".", "/", "~"))
    }
    undeclared = sorted(f"{name}: {volume}" for name, volume in used if volume not in declared)
    assert not undeclared, f"named volumes used but not declared under top-level 'volumes': {undeclared}"


# ----------------------------------------------------------------------------- (c) executor and database


def test_airflow_services_run_the_local_executor_on_postgresql(services: dict[str, dict[str, Any]]) -> None:
    for name, service in airflow_services(services).items():
        env = environment_of(service)
        executor = env.get("AIRFLOW__CORE__EXECUTOR")
        assert executor == "LocalExecutor", f"{name}: AIRFLOW__CORE__EXECUTOR={executor!r}, want 'LocalExecutor'"
        conn = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        assert conn.startswith(("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")), (
            f"{name}: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN={conn!r} is not a PostgreSQL URL"
        )
        host = re.sub(r"^.*@", "", conn).split("/", 1)[0].split(":", 1)[0]
        assert host in services, f"{name}: the metadata database host {host!r} is not a service of this stack"
        assert str(services[host].get("image", "")).startswith("postgres:"), (
            f"{name}: the metadata database host {host!r} is not a PostgreSQL service"
        )


# ----------------------------------------------------------------------------- (d) connections


def json_connections(services: dict[str, dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {
        (name, key): value
        for name, service in services.items()
        for key, value in environment_of(service).items()
        if key.startswith("AIRFLOW_CONN_") and value.lstrip().startswith(("{", "["))
    }


def test_every_json_airflow_connection_parses(services: dict[str, dict[str, Any]]) -> None:
    connections = json_connections(services)
    assert connections, "no AIRFLOW_CONN_* variable in JSON form was found"
    for (name, key), value in connections.items():
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            pytest.fail(f"{name}: {key} is not valid JSON ({error}): {value}")
        assert isinstance(parsed, dict) and parsed.get("conn_type"), f"{name}: {key} has no conn_type: {value}"


def test_khipu_connections_are_defined_for_every_airflow_service(services: dict[str, dict[str, Any]]) -> None:
    for name, service in airflow_services(services).items():
        env = environment_of(service)
        for key in ("AIRFLOW_CONN_KHIPU_KAFKA", "AIRFLOW_CONN_SPARK_DEFAULT", "AIRFLOW_CONN_KHIPU_STORE"):
            assert env.get(key), f"{name} does not define {key}"
        assert env["AIRFLOW_CONN_KHIPU_STORE"].startswith(("postgresql://", "postgres://")), (
            f"{name}: AIRFLOW_CONN_KHIPU_STORE is not a PostgreSQL URI"
        )


def test_kafka_connection_and_settings_point_at_the_stack_broker(services: dict[str, dict[str, Any]]) -> None:
    for name, service in airflow_services(services).items():
        env = environment_of(service)
        extra = json.loads(env["AIRFLOW_CONN_KHIPU_KAFKA"]).get("extra", {})
        if isinstance(extra, str):
            extra = json.loads(extra)
        for servers in (extra.get("bootstrap.servers", ""), env.get("KHIPU_BOOTSTRAP_SERVERS", "")):
            assert servers, f"{name}: Kafka bootstrap servers not set"
            for address in servers.split(","):
                host = address.rsplit(":", 1)[0]
                assert "KAFKA_PROCESS_ROLES" in environment_of(services.get(host, {})), (
                    f"{name}: bootstrap address {address!r} is not a Kafka service of this stack"
                )


def test_spark_connection_points_at_the_stack_master(services: dict[str, dict[str, Any]]) -> None:
    for name, service in airflow_services(services).items():
        spark = json.loads(environment_of(service)["AIRFLOW_CONN_SPARK_DEFAULT"])
        host = str(spark.get("host", "")).removeprefix("spark://")
        assert "org.apache.spark.deploy.master.Master" in command_text(services.get(host, {})), (
            f"{name}: spark_default host {spark.get('host')!r} is not the Spark master service"
        )
        assert int(spark.get("port", 0)) == 7077, f"{name}: spark_default port is {spark.get('port')!r}, want 7077"


# ----------------------------------------------------------------------------- (e) Khipu's settings and topics


def test_every_khipu_variable_a_service_sets_is_one_the_settings_model_declares(
    services: dict[str, dict[str, Any]],
) -> None:
    unknown = {name: found for name, s in services.items() if (found := unknown_variables(environment_of(s)))}
    assert not unknown, f"KHIPU_* variables no section of khipu.config.model declares (a typo?): {unknown}"


def test_khipus_settings_load_in_every_service_that_runs_khipu(services: dict[str, dict[str, Any]]) -> None:
    """The model's own validation (KHIPU_DATA_URL a location, KHIPU_STORE_URL a store URL, ...), and
    KHIPU_S3_ENDPOINT as Spark's S3A settings read it, refuse nothing a service is given."""
    for service in {**drivers_services(services), **spark_workers(services)}.values():
        khipu_settings(service)  # raises SettingsError naming the variable, its value and what is expected
        s3_endpoint(resolved(environment_of(service)))  # StorageError naming KHIPU_S3_ENDPOINT
    _, exporter = exporter_service(services)
    ExporterConfig.from_env(resolved(environment_of(exporter)))  # refuses a non-loopback address without a token


def test_trace_topic_is_created_with_every_config_the_code_expects(services: dict[str, dict[str, Any]]) -> None:
    topics = {khipu_settings(s).trace_topic for s in drivers_services(services).values()}
    assert len(topics) == 1, f"the services that run Khipu name different trace topics: {sorted(topics)}"
    topic = topics.pop()
    created, configured = [], []
    for service in services.values():
        for words in shell_commands(service):
            tool = Path(words[0]).name if words else ""
            if tool == "kafka-topics.sh" and "--create" in words and option_values(words, "--topic") == [topic]:
                created.append(option_values(words, "--config"))
            if tool == "kafka-configs.sh" and option_values(words, "--entity-name") == [topic]:
                configured.append([pair for value in option_values(words, "--add-config") for pair in value.split(",")])
    assert created, f"no service creates the trace topic {topic} (kafka-topics.sh --create --topic {topic})"
    expected = {f"{key}={value}" for key, value in TRACE_TOPIC_CONFIG.items()}
    for pairs in created + configured:
        missing = expected - set(pairs)
        assert not missing, f"the trace topic {topic} is created or altered with {pairs}, without {sorted(missing)}"


def test_lost_topic_is_created(services: dict[str, dict[str, Any]]) -> None:
    topics = {khipu_settings(s).lost_topic for s in drivers_services(services).values()}
    assert len(topics) == 1, f"the services that run Khipu name different lost topics: {sorted(topics)}"
    topic = topics.pop()
    created = [
        name
        for name, service in services.items()
        for words in shell_commands(service)
        if words
        and Path(words[0]).name == "kafka-topics.sh"
        and "--create" in words
        and option_values(words, "--topic") == [topic]
    ]
    assert created, f"no service creates the lost topic {topic}, which the detector writes lost messages to"


# ----------------------------------------------------------------------------- (f) what the images run


def test_kafka_image_is_the_broker_the_tests_run(services: dict[str, dict[str, Any]]) -> None:
    pom = (ROOT / "jvm" / "kafka-broker.pom.xml").read_text()
    tested = re.search(r"<artifactId>kafka_[\d.]+</artifactId>\s*<version>([^<]+)</version>", pom)
    assert tested, "jvm/kafka-broker.pom.xml names no kafka_2.x version"
    images = {str(s["image"]) for s in services.values() if str(s.get("image", "")).startswith("apache/kafka:")}
    assert images == {f"apache/kafka:{tested.group(1)}"}, (
        f"the Kafka images are {sorted(images)}; the tests run Apache Kafka {tested.group(1)}"
    )


def test_executors_run_the_python_of_khipu_and_of_the_driver(services: dict[str, dict[str, Any]]) -> None:
    """PySpark refuses executors whose Python differs from the driver's; Khipu is built for one Python."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    driver = {name: python_of(base_image(dockerfile_of(s))) for name, s in airflow_services(services).items()}
    executors = {name: python_of(base_image(dockerfile_of(s))) for name, s in spark_workers(services).items()}
    assert len(set(driver.values()) | set(executors.values())) == 1, (
        f"the driver (Airflow) runs Python {driver}, the executors {executors}: they must be one version"
    )
    for name, version in {**driver, **executors}.items():
        assert SpecifierSet(project).contains(f"{version}.0"), (
            f"{name} runs Python {version}; Khipu requires {project} (pyproject.toml)"
        )


def test_every_image_installs_khipus_dependencies_with_its_constraints(services: dict[str, dict[str, Any]]) -> None:
    """Both images pin what they install with constraints.txt, so the driver's and the executors' pyspark, pyarrow
    and pandas are the versions `make install` tests; a pin of their own must agree with it."""
    constraints = pins(CONSTRAINTS)
    dockerfiles = {dockerfile_of(s) for s in {**airflow_services(services), **spark_workers(services)}.values()}
    for dockerfile in dockerfiles:
        copied = " ".join(instructions(dockerfile, "COPY"))
        installs = [arguments for arguments in pip_installs(dockerfile) if option_values(arguments, "-r")]
        assert installs, f"{dockerfile.name} installs no requirements file"
        for arguments in installs:
            assert "constraints.txt" in option_values(arguments, "-c", "--constraint"), (
                f"{dockerfile.name}: `pip install {' '.join(arguments)}` is not pinned by -c constraints.txt"
            )
            assert re.search(r"(^|\s)constraints\.txt(\s|$)", copied), f"{dockerfile.name} copies no constraints.txt"
            for listed in option_values(arguments, "-r"):
                for line in requirement_lines(resolve(listed)):
                    package = package_name(line)
                    if "==" in line and package in constraints:
                        assert line.split("==", 1)[1].strip() == constraints[package], (
                            f"{listed} pins {line}; constraints.txt pins {package}=={constraints[package]}"
                        )
    for name, service in spark_workers(services).items():
        listed_files = [f for args in pip_installs(dockerfile_of(service)) for f in option_values(args, "-r")]
        installed = {package_name(line) for f in listed_files for line in requirement_lines(resolve(f))}
        missing = [package for package in SPARK_PACKAGES if package not in installed]
        assert not missing, f"{name}'s image does not install {missing} (from {listed_files})"


def test_khipus_image_installs_every_package_its_processes_import(services: dict[str, dict[str, Any]]) -> None:
    """The executors, the exporter and `khipu` import these modules in the worker's image: each package of
    requirements.txt that they load, and the store's database driver, must be installed there."""
    _, exporter = exporter_service(services)
    store_url = khipu_settings(exporter).store_url
    script = (
        "import importlib, importlib.metadata as md, json, sys\n"
        "from pathlib import Path\n"
        "from sqlalchemy.engine import make_url\n"
        "from khipu.config.store_url import store_url\n"
        f"for module in {list(KHIPU_IMAGE_MODULES)!r}:\n"
        "    importlib.import_module(module)\n"
        f"make_url(store_url({store_url!r}, Path('/'))).get_dialect().import_dbapi()\n"
        "owners = md.packages_distributions()\n"
        "print(json.dumps(sorted({d for m in list(sys.modules) for d in owners.get(m.split('.')[0], [])})))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, f"importing {KHIPU_IMAGE_MODULES} failed:\n{ran.stderr[-2000:]}"
    required = {package_name(line) for line in requirement_lines(REQUIREMENTS)}
    imported = {package_name(name) for name in json.loads(ran.stdout)} & required
    assert {"pyspark", "pyarrow", "psycopg2-binary"} <= imported, f"the import found only {sorted(imported)}"
    for name, service in {**spark_workers(services), exporter_service(services)[0]: exporter}.items():
        listed_files = [f for args in pip_installs(dockerfile_of(service)) for f in option_values(args, "-r")]
        listed = {package_name(line) for f in listed_files for line in requirement_lines(resolve(f))}
        missing = sorted(imported - listed)
        assert not missing, f"{name}'s image imports {missing} (requirements.txt) but installs only {sorted(listed)}"


# ----------------------------------------------------------------------------- (g) shared storage, the store


def test_workers_and_the_drivers_services_share_one_object_store_location(services: dict[str, dict[str, Any]]) -> None:
    everyone = {**drivers_services(services), **spark_workers(services)}
    data = {name: khipu_settings(s).data for name, s in everyone.items()}
    assert len(set(data.values())) == 1, f"the driver's services and the workers keep data in different places: {data}"
    location = next(iter(data.values()))
    assert not location.is_local, (
        f"KHIPU_DATA_URL is {location.url}, a folder on each container's own disk: the executors and the driver "
        "must share an object store (s3a://bucket/prefix)"
    )
    reached = {
        name: {key: environment_of(s).get(key, "") for key in (ENDPOINT_VARIABLE, *CREDENTIALS)}
        for name, s in everyone.items()
    }
    assert len({json.dumps(r, sort_keys=True) for r in reached.values()}) == 1, (
        f"the services reach the object store differently (endpoint, credentials): {reached}"
    )
    settings = next(iter(reached.values()))
    assert all(settings.values()), f"the object store is reached without {[k for k, v in settings.items() if not v]}"
    host = urlsplit(resolved(settings)[ENDPOINT_VARIABLE]).hostname
    assert host in services, f"{ENDPOINT_VARIABLE} names {host!r}, not a service of this stack"
    for name, service in everyone.items():  # the AWS SDKs' checksums, as include/khipu/storage/location.py sets them
        checksums = {key: environment_of(service).get(key) for key in AWS_SDK_DEFAULTS}
        assert checksums == AWS_SDK_DEFAULTS, (
            f"{name} sets {checksums}; an S3 API other than AWS's needs {AWS_SDK_DEFAULTS}"
        )


def test_workers_mount_nothing_of_the_drivers_disk(services: dict[str, dict[str, Any]]) -> None:
    def named_volumes(service: dict[str, Any]) -> set[str]:
        return {
            str(volume).split(":", 1)[0]
            for volume in service.get("volumes") or []
            if isinstance(volume, str) and not str(volume).startswith((".", "/", "~"))
        }

    drivers = {volume for s in drivers_services(services).values() for volume in named_volumes(s)}
    for name, worker in spark_workers(services).items():
        shared = named_volumes(worker) & drivers
        assert not shared, f"{name} mounts {sorted(shared)}, which the driver's services mount too"
        writable = [
            volume
            for volume in worker.get("volumes") or []
            if str(volume).startswith((".", "/", "~")) and not str(volume).endswith(":ro")
        ]
        assert not writable, f"{name} bind-mounts {writable} writable: a worker shares no disk with the driver"


def test_executors_get_the_object_stores_credentials_through_their_environment(
    services: dict[str, dict[str, Any]],
) -> None:
    """Never as Spark settings (include/khipu/storage/spark.py): those are shown in Spark's UI and event logs."""
    for name, worker in spark_workers(services).items():
        env = environment_of(worker)
        for variable in CREDENTIALS:
            assert required_variable(env.get(variable, "")), (
                f"{name} does not get {variable} from the operator's environment (has {env.get(variable)!r})"
            )
    text = " ".join(strings_of(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))))
    for setting in ("fs.s3a.access.key", "fs.s3a.secret.key", "spark.executorEnv."):
        assert setting not in text, f"docker-compose.yaml sets {setting}: a credential as a Spark setting"


def test_object_store_serves_the_bucket_of_the_data_url_to_the_same_user(services: dict[str, dict[str, Any]]) -> None:
    _, exporter = exporter_service(services)
    env = environment_of(exporter)
    host = urlsplit(resolved(env)[ENDPOINT_VARIABLE]).hostname or ""
    store = services[host]
    store_env = environment_of(store)
    bucket = khipu_settings(exporter).data.path.split("/", 1)[0]
    made = [
        path
        for words in shell_commands(store)
        if words and words[0] == "mkdir"
        for path in words[1:]
        if not path.startswith("-")
    ]
    basedir = store_env.get("JCLOUDS_FILESYSTEM_BASEDIR", "")
    assert f"{basedir}/{bucket}" in made, (
        f"{host} does not make the bucket {bucket!r} of KHIPU_DATA_URL at start (folders made: {made}, "
        f"its back end's folder {basedir!r})"
    )
    user = tuple(required_variable(store_env.get(key, "")) for key in ("S3PROXY_IDENTITY", "S3PROXY_CREDENTIAL"))
    assert user == CREDENTIALS, f"{host}'s user is given by {user}; the services reach it with {CREDENTIALS}"
    port = urlsplit(store_env.get("S3PROXY_ENDPOINT", "")).port
    assert port == urlsplit(resolved(env)[ENDPOINT_VARIABLE]).port, (
        f"{host} listens on {store_env.get('S3PROXY_ENDPOINT')!r}; {ENDPOINT_VARIABLE} is {env[ENDPOINT_VARIABLE]!r}"
    )
    pom = (ROOT / "jvm" / "object-store.pom.xml").read_text()
    tested = re.search(r"<artifactId>s3proxy</artifactId>\s*<version>([^<]+)</version>", pom)
    assert tested and str(store.get("image")).endswith(f":{tested.group(1)}"), (
        f"{host} runs {store.get('image')}; the tests run S3Proxy {tested.group(1) if tested else '?'} "
        "(jvm/object-store.pom.xml)"
    )


def test_every_khipu_process_keeps_its_store_on_the_stacks_postgresql(services: dict[str, dict[str, Any]]) -> None:
    master = json.loads(environment_of(next(iter(airflow_services(services).values())))["AIRFLOW_CONN_SPARK_DEFAULT"])
    spark_master = f"{master['host']}:{master['port']}"
    for name, service in drivers_services(services).items():
        store = khipu_settings(service).store_url
        try:
            check_deployment(spark_master, store, {})  # the detector's own refusal of SQLite on a cluster
        except DetectorJobError as exc:
            pytest.fail(f"{name}: {exc}")
        parts = urlsplit(store)
        assert parts.hostname in services and str(services[parts.hostname].get("image", "")).startswith("postgres:"), (
            f"{name}: the store {store.replace(parts.password or '', MASK)} is not on the PostgreSQL service"
        )
        connection = environment_of(service).get("AIRFLOW_CONN_KHIPU_STORE")
        if connection is not None:
            assert connection == environment_of(service)["KHIPU_STORE_URL"], (
                f"{name}: the connection khipu_store and KHIPU_STORE_URL name different stores"
            )


# ----------------------------------------------------------------------------- (h) exporter, Prometheus, Grafana


def test_prometheus_scrapes_the_exporters_port_with_its_token(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    exporter, service = exporter_service(services)
    exporter_env = environment_of(service)
    config = ExporterConfig.from_env(resolved(exporter_env))
    prometheus, prometheus_service = image_service(services, "prom/prometheus")
    config_file = [
        argument.split("=", 1)[1]
        for argument in prometheus_service.get("command") or []
        if str(argument).startswith("--config.file=")
    ]
    assert config_file, f"{prometheus} names no --config.file"
    scrape = yaml.safe_load(mount_source(prometheus_service, config_file[0]).read_text())
    jobs = [
        job
        for job in scrape.get("scrape_configs") or []
        for static in job.get("static_configs") or []
        if f"{exporter}:{config.port}" in static.get("targets", [])
    ]
    assert jobs, f"{prometheus} scrapes no target {exporter}:{config.port} (KHIPU_EXPORTER_PORT)"
    job = jobs[0]
    assert job.get("metrics_path", "/metrics") == METRICS_PATH, f"{prometheus} scrapes {job.get('metrics_path')}"
    credentials = (job.get("authorization") or {}).get("credentials_file", "")
    secret = credentials.removeprefix("/run/secrets/")
    assert credentials.startswith("/run/secrets/") and secret in (prometheus_service.get("secrets") or []), (
        f"{prometheus} sends no bearer token from a compose secret it is given (credentials_file {credentials!r})"
    )
    source = (compose.get("secrets") or {}).get(secret, {}).get("environment")
    given = required_variable(exporter_env.get("KHIPU_EXPORTER_TOKEN", ""))
    assert source and source == given, (
        f"the secret {secret} is the variable {source!r}; the exporter's KHIPU_EXPORTER_TOKEN is {given!r}"
    )


def test_grafana_draws_the_projects_dashboards_on_the_stacks_prometheus(services: dict[str, dict[str, Any]]) -> None:
    grafana, service = image_service(services, "grafana/grafana")
    prometheus, _ = image_service(services, "prom/prometheus")
    provisioning = mount_source(service, "/etc/grafana/provisioning")
    sources = [
        source
        for path in sorted((provisioning / "datasources").glob("*.y*ml"))
        for source in yaml.safe_load(path.read_text()).get("datasources") or []
    ]
    prometheus_url = f"http://{prometheus}:9090"  # Prometheus' own port: its command sets no other
    prometheus_uids = {s["uid"] for s in sources if s.get("type") == "prometheus" and s.get("url") == prometheus_url}
    assert prometheus_uids, f"{grafana} provisions no data source on {prometheus_url}: {sources}"
    dashboards_dir = mount_source(service, "/etc/khipu/dashboards")
    assert dashboards_dir == ROOT / "dashboards" / "grafana", f"{grafana} mounts {dashboards_dir}, not the project's"
    script = mount_source(service, shlex.split(command_text(service))[-1]).read_text()
    filled = dict(re.findall(r"s/\\\$\{(\w+)\}/([\w-]+)/g", script))
    providers = [
        provider["options"]["path"]
        for path in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for provider in yaml.safe_load(path.read_text()).get("providers") or []
    ]
    written = re.search(r"^target=(\S+)$", script, re.MULTILINE)
    assert written and written.group(1) in providers, (
        f"{grafana}'s start script writes the dashboards to {written.group(1) if written else None}; "
        f"the dashboards are provisioned from {providers}"
    )
    assert "/etc/khipu/dashboards/*.json" in script, f"{grafana}'s start script does not read every mounted dashboard"
    dashboards = sorted(dashboards_dir.glob("*.json"))
    assert dashboards, "dashboards/grafana holds no dashboard"
    for dashboard in dashboards:
        for needed in json.loads(dashboard.read_text()).get("__inputs") or []:
            if needed.get("type") == "datasource":
                assert filled.get(needed["name"]) in prometheus_uids, (
                    f"{dashboard.name} asks for the data source ${{{needed['name']}}}; {grafana}'s start script fills "
                    f"in {filled}, the provisioned Prometheus is {sorted(prometheus_uids)}"
                )


# ----------------------------------------------------------------------------- (i) secrets


def secret_variables(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """variable given by the operator -> where it holds a secret ("service: KEY"); fails where a secret is written
    in the file (a literal, or a variable with a default) instead."""
    masks = {v: masked(section.model_fields[field]) for section in SECTIONS for v, field in variables(section).items()}
    found: dict[str, list[str]] = {}
    written: list[str] = []
    for name, service in services.items():
        for key, value in environment_of(service).items():
            mask = masks.get(key)
            if SECRET_NAME.search(key) or (mask is not None and mask.show("x") == MASK):
                holders = [value]
            else:  # a URL with a password (KHIPU_STORE_URL, Airflow's database, connections)
                holders = re.findall(r"://[^/@\s]*?:(\$\{[^}]*\}|[^/@\s]*)@", value)
            for holder in holders:
                variable = required_variable(holder)
                if variable is None:
                    written.append(f"{name}: {key}")
                else:
                    found.setdefault(variable, []).append(f"{name}: {key}")
    assert not written, (
        f"secrets written in docker-compose.yaml (literal, or a variable with a default): {sorted(set(written))}; "
        "use ${NAME:?...} and document NAME in docker/.env.example"
    )
    return found


def test_no_secret_value_is_written_in_the_compose_file(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    secrets = secret_variables(services)
    assert {"STORE_DB_PASSWORD", "KHIPU_EXPORTER_TOKEN", *CREDENTIALS} <= set(secrets), (
        f"the secrets found are {sorted(secrets)}"
    )
    defaulted = sorted(
        {m.group(1) for m in interpolations(compose) if m.group(1) in secrets and "-" in (m.group(2) or "")}
    )
    assert not defaulted, f"secrets with a default written in docker-compose.yaml: {defaulted}"


def test_secrets_never_reach_a_command_line(services: dict[str, dict[str, Any]]) -> None:
    secrets = secret_variables(services)
    for name, service in services.items():
        commands = [command_text(service), json.dumps((service.get("healthcheck") or {}).get("test", ""))]
        for variable in secrets:
            for words in commands:
                assert not re.search(rf"\$\$?\{{?{variable}\b", words), f"{name} puts {variable} on a command line"


def test_env_example_documents_every_variable_the_operator_must_give(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    required = {m.group(1) for m in interpolations(compose) if "?" in (m.group(2) or "")}
    required |= {s["environment"] for s in (compose.get("secrets") or {}).values() if "environment" in s}
    example = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if re.match(r"^[A-Z][A-Z0-9_]*=", line)
    )
    missing = sorted(required - set(example))
    assert not missing, f"{ENV_EXAMPLE.relative_to(ROOT)} does not document {missing}"
    secrets = set(secret_variables(services)) | {key for key in example if SECRET_NAME.search(key)}
    valued = sorted(key for key in secrets if example.get(key, "").strip())
    assert not valued, f"{ENV_EXAMPLE.relative_to(ROOT)} gives values to secrets {valued}: leave them empty there"
