"""Every ``KHIPU_*`` variable, declared once: its name, type, default, bounds, meaning, and whether it is a secret.

The variables fall into sections, one per concept that reads them (the trace cluster, the detector, the
exporter, ...). A section is a ``pydantic-settings`` model, loaded on its own (:func:`khipu.config.load`):
a traced application validates only what tracing reads, never the exporter's port. The objects the rest of
Khipu passes around (:class:`khipu.settings.KhipuSettings`, :class:`khipu.detector.model.DetectorConfig`,
...) are views built from sections; the defaults they show come from here.

A new section is a :class:`Section` subclass listed in :data:`SECTIONS`: ``khipu settings``, the settings
table in docs/settings.md and the README's list follow from it.

Loading never connects to anything: the checks below parse text and compute paths, nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from khipu.config.store_url import ACCEPTED as STORE_URLS
from khipu.config.store_url import StoreUrlError, store_url
from khipu.storage.location import Location, StorageError
from khipu.trace.names import DEFAULT_TRACE_TOPIC, NAME_PATTERN, NAME_RULE

MASK = "***"


def project_root() -> Path:
    """The checkout this package is installed from (editable install: include/khipu/config -> ../../..)."""
    return Path(__file__).resolve().parents[3]


# -- what a variable may hold: each type says, in words, what is expected of it -------------------------------


@dataclass(frozen=True, slots=True)
class Expect:
    """What a variable's value must be, in the words an error shows (``expected <text>``)."""

    text: str


@dataclass(frozen=True, slots=True)
class Masked:
    """A secret, or a value holding one: ``show`` turns its value into what may be printed."""

    show: Callable[[str], str]
    note: str = "Secret: never shown."


def _mask_all(_value: str) -> str:
    return MASK


def mask_url_password(url: str) -> str:
    """``postgresql://khipu:***@db/khipu``: a URL with the password of its user part masked."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", rf"\1:{MASK}@", url)


SECRET = Masked(_mask_all)
PASSWORD_IN_URL = Masked(mask_url_password, "Its password is never shown.")


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


def _bootstrap(value: str | None) -> str | None:
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",")]
    if not all(part and ":" in part and part.rsplit(":", 1)[1].isdigit() for part in parts):
        raise ValueError("not host:port")
    return value


def _host(value: str) -> str:
    if value.count(":") == 1:  # host:port; an IPv6 address has two or more
        raise ValueError("a port")
    return value


def _one_of(*allowed: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        if value is not None and value not in allowed:
            raise ValueError("not allowed")
        return value

    return check


Port = Annotated[int, Field(ge=1, le=65535), Expect("a TCP port number in [1, 65535]")]
Milliseconds = Annotated[int, Field(ge=0), Expect("a duration in ms >= 0")]
Name = Annotated[str, Field(pattern=NAME_PATTERN.pattern), Expect(NAME_RULE)]
Bootstrap = Annotated[str | None, AfterValidator(_bootstrap), Expect("'host:port[,host:port...]'")]
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def setting(variable: str, default: Any, description: str, **bounds: Any) -> Any:
    """A field read from ``variable``; ``default`` may be a zero-argument callable (computed at load)."""
    if callable(default):
        return Field(default_factory=default, validation_alias=variable, description=description, **bounds)
    return Field(default, validation_alias=variable, description=description, **bounds)


class Section(BaseSettings):
    """Variables one concept reads. ``title`` heads its part of ``khipu settings`` and the docs; ``doc`` is
    where its behaviour is described. An empty variable counts as unset."""

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore")

    title: ClassVar[str]
    doc: ClassVar[str | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what :func:`khipu.config.load` gathered (the environment it was given, the settings file), so that
        a caller's own environment mapping is never mixed with ``os.environ``."""
        return (init_settings,)


# -- the sections ----------------------------------------------------------------------------------------------


class KhipuSection(Section):
    """Where Khipu's own processes (CLI, local stack, Airflow tasks, Spark jobs) find the trace cluster, the
    registry, the store and their state."""

    title = "Khipu and its trace cluster"
    doc = "docs/local-stack.md"

    bootstrap_servers: Bootstrap = setting(
        "KHIPU_BOOTSTRAP_SERVERS",
        None,
        "The trace cluster's bootstrap servers. Unset: 127.0.0.1:<KHIPU_BROKER_PORT>, the local stack's broker "
        "(a traced application must set it, or KHIPU_TRACE_BOOTSTRAP_SERVERS).",
    )
    cluster: Name = setting("KHIPU_CLUSTER", "local", "The trace cluster's name, as the registry spells it.")
    trace_topic: Name = setting("KHIPU_TRACE_TOPIC", DEFAULT_TRACE_TOPIC, "The topic traces are written to.")
    lost_topic: Name = setting("KHIPU_LOST_TOPIC", "khipu.lost", "The topic the detector writes lost messages to.")
    registry_path: Annotated[Path, Expect("a file path")] = setting(
        "KHIPU_REGISTRY",
        lambda: project_root() / "config" / "registry.yaml",
        "The stream registry (YAML). Unset: config/registry.yaml in the checkout.",
    )
    state_dir: Annotated[Path, Expect("a directory path")] = setting(
        "KHIPU_STATE_DIR",
        lambda: project_root() / ".khipu",
        "Runtime state: the trace archive under <state>/archive/, the verdict archive of plain DELIVERED "
        "verdicts under <state>/verdicts/, the local stack's broker, Airflow and logs. Unset: .khipu/ in the "
        "checkout.",
    )
    data_url: Annotated[str | None, Expect("a local folder or an object store prefix (s3a://bucket/prefix)")] = setting(
        "KHIPU_DATA_URL",
        None,
        "Where the archives and the detector's checkpoint live, on every host: the trace archive under "
        "<data>/archive, the verdict archive under <data>/verdicts, the checkpoint under <data>/detector/checkpoint, "
        "reconciliation's working data under <data>/reconcile. A local folder (embedded, one host) or an object "
        "store prefix such as s3a://khipu-data/prod (a cluster: credentials from AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY or the host's role, never the URL). Unset: the state folder.",
    )
    s3_endpoint: Annotated[str | None, Expect("an http(s) URL")] = setting(
        "KHIPU_S3_ENDPOINT",
        None,
        "An S3 API other than AWS's own (s3proxy, MinIO, Ceph), e.g. http://127.0.0.1:9000. Unset: AWS.",
    )
    store_url: Annotated[str | None, PASSWORD_IN_URL, Expect(STORE_URLS)] = setting(
        "KHIPU_STORE_URL",
        None,
        "The store: sqlite:///<relative path> (made absolute at load), sqlite:////<absolute path>, or postgresql://, "
        "postgres:// or postgresql+psycopg2://<user>:<password>@<host>:<port>/<database> (all opened with psycopg2); "
        "any other is refused by name. Unset: sqlite:///<state>/khipu.db.",
    )
    broker_port: Port = setting("KHIPU_BROKER_PORT", 9092, "The local stack's broker port.")
    controller_port: Port | None = setting(
        "KHIPU_BROKER_CONTROLLER_PORT",
        None,
        "The local stack's KRaft controller port. Unset: KHIPU_BROKER_PORT + 1 (9093 at 65535).",
    )
    airflow_port: Port = setting("KHIPU_AIRFLOW_PORT", 8080, "The local stack's Airflow UI and API port.")
    object_store_port: Port = setting(
        "KHIPU_OBJECT_STORE_PORT", 9000, "The local stack's object store (S3Proxy, an S3 API) port."
    )

    @model_validator(mode="after")
    def _derived(self) -> KhipuSection:
        if self.bootstrap_servers is None:
            self.bootstrap_servers = f"127.0.0.1:{self.broker_port}"
        if self.store_url is None:
            self.store_url = f"sqlite:///{self.state_dir / 'khipu.db'}"
        try:
            self.store_url = store_url(self.store_url, Path.cwd())  # the URL the store opens, whoever reads it
        except StoreUrlError as exc:
            raise SettingConflict("KHIPU_STORE_URL", exc.shown, f"{STORE_URLS}; {exc.problem}") from None
        if self.data_url is None:
            self.data_url = str(self.state_dir.absolute())  # a relative state folder: from where Khipu runs
        try:
            self.data_url = Location.of(self.data_url, "KHIPU_DATA_URL").url
        except StorageError as exc:
            raise SettingConflict("KHIPU_DATA_URL", exc.value, exc.expected) from None
        if self.controller_port is None:
            self.controller_port = self.broker_port + 1 if self.broker_port < 65535 else 9093
        if self.controller_port == self.broker_port:
            raise SettingConflict(
                "KHIPU_BROKER_CONTROLLER_PORT", self.controller_port, "a port other than KHIPU_BROKER_PORT"
            )
        return self


class KafkaSecuritySection(Section):
    title = "A secured trace cluster"
    doc = "docs/detector.md"

    security_protocol: Annotated[
        str | None, BeforeValidator(_upper), AfterValidator(_one_of(*SECURITY_PROTOCOLS)),
        Expect("one of " + ", ".join(SECURITY_PROTOCOLS)),
    ] = setting("KHIPU_KAFKA_SECURITY_PROTOCOL", None, "Unset: PLAINTEXT.")  # fmt: skip
    sasl_mechanism: Annotated[
        str | None, BeforeValidator(_upper), AfterValidator(_one_of(*SASL_MECHANISMS)),
        Expect("one of " + ", ".join(SASL_MECHANISMS)),
    ] = setting("KHIPU_KAFKA_SASL_MECHANISM", None, "For SASL_PLAINTEXT and SASL_SSL.")  # fmt: skip
    sasl_username: str | None = setting("KHIPU_KAFKA_SASL_USERNAME", None, "The SASL login.")
    sasl_password: Annotated[str | None, SECRET] = setting("KHIPU_KAFKA_SASL_PASSWORD", None, "The SASL password.")
    ssl_ca_location: str | None = setting(
        "KHIPU_KAFKA_SSL_CA_LOCATION", None, "A PEM file of the CA that signed the brokers' certificates."
    )


class TracingSection(Section):
    title = "Traced applications"
    doc = "docs/tracing.md"

    bootstrap_servers: Bootstrap = setting(
        "KHIPU_TRACE_BOOTSTRAP_SERVERS",
        None,
        "Where a traced application sends its traces, when the trace cluster is not KHIPU_BOOTSTRAP_SERVERS "
        "(KHIPU_CLUSTER and KHIPU_TRACE_TOPIC name its cluster and topic).",
    )


class DetectorSection(Section):
    title = "The streaming detector"
    doc = "docs/detector.md"

    grace_ms: Milliseconds = setting(
        "KHIPU_DETECTOR_GRACE_MS",
        3_000,
        "After a group's commit passes a message, how long its receive trace may still come.",
    )
    max_wait_ms: Milliseconds = setting(
        "KHIPU_DETECTOR_MAX_WAIT_MS", 900_000, "Undecided this long after its first trace: PENDING."
    )
    recheck_ms: Milliseconds = setting(
        "KHIPU_DETECTOR_RECHECK_MS", 2_000, "How often an undecided message looks at committed offsets again."
    )
    open_transaction_wait_ms: Milliseconds = setting(
        "KHIPU_DETECTOR_OPEN_TRANSACTION_WAIT_MS",
        900_000,
        "How much longer than the maximum wait a hop waiting on a Kafka transaction not decided yet waits.",
    )
    trigger_s: Annotated[float, Field(gt=0, le=3600), Expect("a number of seconds in (0, 3600]")] = setting(
        "KHIPU_DETECTOR_TRIGGER_S", 2.0, "The detector's micro-batch trigger interval."
    )


class SupervisionSection(Section):
    title = "Detector supervision"
    doc = "docs/detector.md"

    stale_after_s: Annotated[float, Field(ge=1), Expect("a number of seconds >= 1")] = setting(
        "KHIPU_DETECTOR_STALE_AFTER_S", 120.0, "A heartbeat older than this: the detector is hung or down."
    )
    startup_grace_s: Annotated[float, Field(ge=1), Expect("a number of seconds >= 1")] = setting(
        "KHIPU_DETECTOR_STARTUP_GRACE_S", 300.0, "A freshly submitted detector gets this long to report."
    )


class AlertSection(Section):
    title = "Verdict alerts"
    doc = "docs/consumer-health.md"

    window_ms: Annotated[int, Field(ge=1), Expect("an integer >= 1")] = setting(
        "KHIPU_ALERT_WINDOW_MS", 300_000, "The sliding window the verdict-threshold alerts sum."
    )
    min_verdicts: Annotated[int, Field(ge=1), Expect("an integer >= 1")] = setting(
        "KHIPU_ALERT_MIN_VERDICTS", 20, "A window with fewer verdicts than this says nothing."
    )


class HealthSection(Section):
    title = "Consumer health"
    doc = "docs/consumer-health.md"

    window: Annotated[int, Field(ge=1), Expect("an integer >= 1")] = setting(
        "KHIPU_HEALTH_WINDOW", 10, "Offset snapshots per health window (the local stack uses 5)."
    )
    expiry_margin_s: Annotated[int, Field(ge=0), Expect("an integer of seconds >= 0")] = setting(
        "KHIPU_EXPIRY_MARGIN_S",
        600,
        "EXPIRY_RISK when the oldest unconsumed record is this close to its topic's retention.ms; also the least "
        "margin of the detector's trace_trail alert (else half the trace topic's retention.ms).",
    )


class NotifierSection(Section):
    title = "Alert notifiers"
    doc = "docs/consumer-health.md"

    notifiers: str | None = setting(
        "KHIPU_NOTIFIERS",
        None,
        'A JSON list of {"class": "module.Class", "kwargs": {...}}. Unset: the log notifier, and the webhook '
        "notifier when the Airflow connection khipu_alert_webhook exists.",
    )


class ReconcileSection(Section):
    title = "Reconciliation"
    doc = "docs/reconciliation.md"

    horizon_ms: Milliseconds = setting(
        "KHIPU_RECONCILE_HORIZON_MS", 7_200_000, "How late a trace may come before reconciliation settles a loss."
    )


class ResendSection(Section):
    title = "Resend"
    doc = "docs/resend.md"

    wait_ms: Milliseconds = setting(
        "KHIPU_RESEND_WAIT_MS", 600_000, "How long a produced attempt has to arrive before the next one."
    )


# Spark's local mode, every core; a task that fails (a Python worker that crashed, seen once in a broker outage) is
# tried again, up to 4 times in all, instead of failing the batch and the detector's query with it (local mode's
# default is 1 try: spark.task.maxFailures does not apply there)
LOCAL_MASTER = "local[*,4]"


class SparkSection(Section):
    title = "Spark jobs started by hand"
    doc = "docs/detector.md"

    master: str = setting(
        "KHIPU_SPARK_MASTER",
        LOCAL_MASTER,
        "The Spark master of spark/detector.py and spark/reconcile.py (local mode: every core, a failed task tried "
        "up to 4 times).",
    )
    connections_file: Annotated[Path | None, Expect("a file path")] = setting(
        "KHIPU_CONNECTIONS_FILE",
        None,
        "An owner-only JSON file of the clusters' connections and the store URL, which the Airflow task writes "
        "for the Spark job it submits.",
    )


Hours = Annotated[int, Field(ge=1), Expect("a whole number of hours >= 1")]
Days = Annotated[int, Field(ge=1), Expect("a whole number of days >= 1")]


class RetentionSection(Section):
    title = "Retention"
    doc = "docs/retention.md"

    trace_archive_hours: Hours = setting(
        "KHIPU_RETENTION_TRACE_ARCHIVE_HOURS", 168, "Hours of raw traces kept (reconciliation's and backfill's input)."
    )
    verdict_archive_hours: Hours = setting(
        "KHIPU_RETENTION_VERDICT_ARCHIVE_HOURS", 720, "Hours of archived plain DELIVERED verdicts kept."
    )
    verdict_days: Days = setting(
        "KHIPU_RETENTION_VERDICT_DAYS", 90, "Days the store keeps settled verdicts and their history."
    )
    quarantine_days: Days = setting(
        "KHIPU_RETENTION_QUARANTINE_DAYS", 14, "Days quarantined trace records and emitter sequence gaps are kept."
    )
    heartbeat_days: Days = setting(
        "KHIPU_RETENTION_HEARTBEAT_DAYS", 7, "Days detector heartbeats are kept (each query's newest always is)."
    )
    minute_metrics_days: Days = setting(
        "KHIPU_RETENTION_MINUTE_METRICS_DAYS", 7, "Days metrics are kept per minute; older ones are rolled into hours."
    )
    metrics_days: Days = setting("KHIPU_RETENTION_METRICS_DAYS", 400, "Days the hourly metrics are kept.")
    backfill_hours: Hours = setting(
        "KHIPU_RETENTION_BACKFILL_HOURS",
        72,
        "How far back, beyond reconciliation's own reach, a backfill may go: the trace archive keeps at least this.",
    )
    disk_free_min_percent: Annotated[float, Field(ge=0, lt=100), Expect("a percentage in [0, 100)")] = setting(
        "KHIPU_DISK_FREE_MIN_PERCENT", 10.0, "An alert fires when the state folder's disk has less free than this."
    )
    archive_file_mib: Annotated[int, Field(ge=1, le=4096), Expect("a whole number of MiB in [1, 4096]")] = setting(
        "KHIPU_ARCHIVE_FILE_MIB",
        128,
        "The size, in MiB of Parquet, that each closed archive hour is compacted into files of: an hour of N MiB "
        "becomes N / this files (at least one).",
    )


def _exporter_host_expected() -> str:
    return "a host name or IP address to listen on, without a port or scheme (e.g. 127.0.0.1, 0.0.0.0, ::)"


class ExporterSection(Section):
    title = "The Prometheus exporter"
    doc = "docs/view.md#prometheus"

    host: Annotated[
        str, Field(pattern=r"^[A-Za-z0-9._:-]+$"), AfterValidator(_host), Expect(_exporter_host_expected())
    ] = setting("KHIPU_EXPORTER_HOST", "127.0.0.1", "The address `khipu exporter` listens on.")
    port: Port = setting("KHIPU_EXPORTER_PORT", 9477, "The port `khipu exporter` listens on.")
    token: Annotated[
        str | None, Field(pattern=r"^[!-~]+$"), SECRET, Expect("visible ASCII characters without spaces")
    ] = setting(
        "KHIPU_EXPORTER_TOKEN",
        None,
        "A bearer token scrapers must send (its figures are every team's). Unset: refused off the loopback; on it, "
        "none asked for. `make up` draws one into the state folder's `exporter.token` unless this is set.",
    )


ACCESS_MODES = ("teams", "custom-views")


class ViewSection(Section):
    title = "The Khipu view"
    doc = "docs/view.md#who-sees-which-streams"

    access: Annotated[str, AfterValidator(_one_of(*ACCESS_MODES)), Expect(" or ".join(ACCESS_MODES))] = setting(
        "KHIPU_VIEW_ACCESS",
        "teams",
        "How the view asks Airflow's auth manager which streams a user sees: `teams` (Airflow's teams, multi-team "
        "mode), or `custom-views` (a custom view per team, for auth managers without teams, such as FAB).",
    )


# The sections, in the order ``khipu settings`` and the docs show them. A new one goes here.
SECTIONS: tuple[type[Section], ...] = (
    KhipuSection,
    KafkaSecuritySection,
    TracingSection,
    DetectorSection,
    SupervisionSection,
    AlertSection,
    HealthSection,
    NotifierSection,
    ReconcileSection,
    ResendSection,
    SparkSection,
    ExporterSection,
    RetentionSection,
    ViewSection,
)


class SettingConflict(ValueError):
    """A section's own check refused a value (two variables disagree, or a value its type alone cannot judge), naming
    the variable to change."""

    def __init__(self, variable: str, value: object, expected: str) -> None:
        super().__init__(f"{variable}: got {value!r}; expected {expected}")
        self.variable, self.value, self.expected = variable, value, expected


def default(section: type[Section], field: str) -> Any:
    """A field's declared default (for the views' own defaults): never read from the environment."""
    return section.model_fields[field].get_default(call_default_factory=True)
