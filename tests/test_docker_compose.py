"""Checks of docker-compose.yaml, the production-like reference stack.

There is no Docker engine on the development machine, so the stack cannot be started here: these
tests parse the file (YAML anchors and ``<<:`` merge keys resolved by ``yaml.safe_load``) and check
what can be checked without running it — the services it must define, the files it points at, the
Airflow executor and database, and the Airflow connections it declares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
COMPOSE_DIR = COMPOSE_FILE.parent

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
    for name in (*masters, *workers):
        assert "spark:4." in str(services[name].get("image", "")), (
            f"{name} image {services[name].get('image')!r} is not a Spark 4.x image"
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


def test_passwords_come_from_variables_not_literals(services: dict[str, dict[str, Any]]) -> None:
    literal: list[str] = []
    for name, service in services.items():
        for key, value in environment_of(service).items():
            if "PASSWORD" in key and value and "${" not in value:
                literal.append(f"{name}: {key}")
            # user:password@ in a URL: the password must be an interpolated variable.
            for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", value):
                if not password.startswith("${"):
                    literal.append(f"{name}: {key} (password in URL)")
    assert not literal, f"hard-coded passwords (use ${{VARIABLE:-local-default}}): {sorted(set(literal))}"


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
