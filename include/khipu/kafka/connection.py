"""How to reach one Kafka cluster: typed settings, validated at load, with secrets held apart.

A :class:`KafkaConnection` is built from librdkafka-style settings (an Airflow connection's
extra, the environment, a connections file) and gives each kind of client what it needs:
:meth:`KafkaConnection.client_config` for confluent-kafka, :meth:`KafkaConnection.spark_options`
for Spark's Kafka source and sink. Passwords are :class:`Secret` values: their ``repr`` and
``str`` are masked, :meth:`KafkaConnection.redacted` is what logs and errors show, and only the
two client builders reveal them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from khipu.config import KafkaSecuritySection, KhipuSection, load
from khipu.config.model import SASL_MECHANISMS, SECURITY_PROTOCOLS
from khipu.errors import InvalidSetting
from khipu.trace.names import NAME_PATTERN, NAME_RULE

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka keys this class owns; every other key passes through as a plain (non-secret) setting
_OWNED = {
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.key.password",
}
_SECRET_WORDS = ("password", "secret", "jaas", "token", "key.pem", "private", "oauthbearer")
# librdkafka settings whose Java client (Spark's connector) setting has the same name and meaning
_SAME_IN_JAVA = frozenset(
    {
        "client.id",
        "request.timeout.ms",
        "metadata.max.age.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "socket.connection.setup.timeout.ms",
        "ssl.endpoint.identification.algorithm",
    }
)
MASK = "***"


class KafkaConnectionError(InvalidSetting):
    """A Kafka connection setting is invalid; names the setting, the value (masked if secret), what is allowed."""

    kind = "Kafka connection setting"


class KafkaUnavailable(RuntimeError):
    """The cluster could not be reached, or refused a request."""


class Secret:
    """A credential: masked wherever it is printed; :meth:`reveal` only where a client needs it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def is_secret_setting(key: str) -> bool:
    """Whether a client setting's value must never be shown (passwords, JAAS configs, tokens, keys)."""
    return any(word in key.lower() for word in _SECRET_WORDS)


@dataclass(frozen=True, slots=True)
class KafkaConnection:
    """One cluster, as the registry names it, and how to connect to it."""

    bootstrap_servers: str
    cluster: str = "local"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_key_password: Secret | None = field(default=None, repr=False)
    options: Mapping[str, str] = field(default_factory=dict, repr=False)  # other librdkafka settings

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not _valid_bootstrap(self.bootstrap_servers):
            raise KafkaConnectionError("bootstrap.servers", self.bootstrap_servers, "'host:port[,host:port...]'")
        if not isinstance(self.cluster, str) or not NAME_PATTERN.match(self.cluster):
            raise KafkaConnectionError("cluster", self.cluster, NAME_RULE)
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise KafkaConnectionError(
                "security.protocol", self.security_protocol, "one of " + ", ".join(SECURITY_PROTOCOLS)
            )
        uses_sasl = self.security_protocol.startswith("SASL_")
        if uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise KafkaConnectionError(
                    "sasl.mechanism",
                    self.sasl_mechanism,
                    "one of " + ", ".join(SASL_MECHANISMS) + " for " + self.security_protocol,
                )
            if not self.sasl_username or self.sasl_password is None or not self.sasl_password.reveal():
                raise KafkaConnectionError(
                    "sasl.username/sasl.password",
                    f"username {self.sasl_username!r}, password {'set' if self.sasl_password else 'missing'}",
                    f"both set for {self.security_protocol} (the connection's login and password)",
                )
        elif self.sasl_mechanism or self.sasl_username:
            raise KafkaConnectionError(
                "security.protocol",
                self.security_protocol,
                "SASL_PLAINTEXT or SASL_SSL when SASL credentials are given",
            )
        for key, value in self.options.items():
            if key in _OWNED:
                raise KafkaConnectionError(
                    key, MASK if is_secret_setting(key) else value, "given through its own field"
                )
            if not isinstance(value, str):
                raise KafkaConnectionError(key, MASK if is_secret_setting(key) else value, "a string value")

    # -- building --------------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], cluster: str = "local") -> KafkaConnection:
        """From librdkafka-style settings (``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ...)."""
        known = {k: v for k, v in settings.items() if k in _OWNED}
        options = {k: str(v) for k, v in settings.items() if k not in _OWNED}
        if "bootstrap.servers" not in known:
            raise KafkaConnectionError("bootstrap.servers", None, "'host:port[,host:port...]'")
        mechanism = known.get("sasl.mechanism", known.get("sasl.mechanisms"))
        password, key_password = known.get("sasl.password"), known.get("ssl.key.password")
        return cls(
            bootstrap_servers=str(known["bootstrap.servers"]),
            cluster=cluster,
            security_protocol=str(known.get("security.protocol", "PLAINTEXT")).upper(),
            sasl_mechanism=str(mechanism).upper() if mechanism else None,
            sasl_username=str(known["sasl.username"]) if known.get("sasl.username") else None,
            sasl_password=_secret(password),
            ssl_ca_location=str(known["ssl.ca.location"]) if known.get("ssl.ca.location") else None,
            ssl_key_password=_secret(key_password),
            options=options,
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        bootstrap_servers: str | None = None,
        cluster: str | None = None,
    ) -> KafkaConnection:
        """The trace cluster from ``KHIPU_BOOTSTRAP_SERVERS``, ``KHIPU_CLUSTER`` and, for a secured cluster,
        ``KHIPU_KAFKA_SECURITY_PROTOCOL``, ``KHIPU_KAFKA_SASL_MECHANISM``, ``KHIPU_KAFKA_SASL_USERNAME``,
        ``KHIPU_KAFKA_SASL_PASSWORD``, ``KHIPU_KAFKA_SSL_CA_LOCATION`` (declared in :mod:`khipu.config.model`);
        ``bootstrap_servers`` and ``cluster``, when given, stand in for the first two."""
        khipu = load(KhipuSection, environ, KafkaConnectionError)
        security = load(KafkaSecuritySection, environ, KafkaConnectionError)
        settings: dict[str, Any] = {"bootstrap.servers": bootstrap_servers or khipu.bootstrap_servers}
        given = {
            "security.protocol": security.security_protocol,
            "sasl.mechanism": security.sasl_mechanism,
            "sasl.username": security.sasl_username,
            "sasl.password": security.sasl_password,
            "ssl.ca.location": security.ssl_ca_location,
        }
        settings.update({key: value for key, value in given.items() if value})
        try:
            return cls.from_settings(settings, cluster=cluster or khipu.cluster)
        except KafkaConnectionError as exc:  # name what the user set: the environment variable
            variables = {key: f"KHIPU_KAFKA_{key.replace('.', '_').upper()}" for key in given}
            named = " / ".join(variables.get(part, part) for part in exc.setting.split("/"))
            raise KafkaConnectionError(named, exc.value, exc.expected) from None

    # -- what clients get ------------------------------------------------------------------------------

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings, credentials included: hand to a client, never log."""
        config = {"bootstrap.servers": self.bootstrap_servers, **self.options}
        if self.security_protocol != "PLAINTEXT":
            config["security.protocol"] = self.security_protocol
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            config["sasl.password"] = self.sasl_password.reveal()
        if self.ssl_ca_location:
            config["ssl.ca.location"] = self.ssl_ca_location
        if self.ssl_key_password is not None:
            config["ssl.key.password"] = self.ssl_key_password.reveal()
        return config

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (``kafka.``-prefixed Java client settings), credentials
        included: set them on the reader in the driver, never on a command line. A setting the Java
        client cannot take as given is refused by name, rather than silently left out."""
        unmapped = sorted(key for key in self.options if key not in _SAME_IN_JAVA)
        if unmapped:
            raise KafkaConnectionError(
                unmapped[0],
                MASK if is_secret_setting(unmapped[0]) else self.options[unmapped[0]],
                f"a setting Spark's Kafka connector takes under the same name ({', '.join(sorted(_SAME_IN_JAVA))})",
            )
        if self.ssl_key_password is not None:
            raise KafkaConnectionError(
                "ssl.key.password", MASK, "no client certificate: the detector's Spark reader trusts a CA only"
            )
        options = {"kafka.bootstrap.servers": self.bootstrap_servers}
        options.update({f"kafka.{key}": value for key, value in self.options.items()})
        if self.security_protocol != "PLAINTEXT":
            options["kafka.security.protocol"] = self.security_protocol
        if self.sasl_mechanism and self.sasl_username and self.sasl_password is not None:
            options["kafka.sasl.mechanism"] = self.sasl_mechanism
            options["kafka.sasl.jaas.config"] = (
                f"{_LOGIN_MODULES[self.sasl_mechanism]} required "
                f"username={_jaas_quoted(self.sasl_username)} password={_jaas_quoted(self.sasl_password.reveal())};"
            )
        if self.ssl_ca_location:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = self.ssl_ca_location
        return options

    def redacted(self) -> dict[str, str]:
        """The settings as logs and errors may show them: every credential masked."""
        return {k: MASK if is_secret_setting(k) else v for k, v in self.client_config().items()}

    def describe(self) -> str:
        """``cluster 'x' at host:port (SASL_PLAINTEXT/PLAIN as user)``: for messages."""
        auth = ""
        if self.security_protocol != "PLAINTEXT":
            auth = f" ({self.security_protocol}" + (
                f"/{self.sasl_mechanism} as {self.sasl_username})" if self.sasl_mechanism else ")"
            )
        return f"cluster {self.cluster!r} at {self.bootstrap_servers}{auth}"

    # -- passing to another process (a file readable by its owner only; see khipu.kafka.secrets) -------

    def to_json(self) -> dict[str, Any]:
        """Every setting, credentials revealed: only for a file only its owner can read."""
        return {"cluster": self.cluster, "settings": self.client_config()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KafkaConnection:
        try:
            return cls.from_settings(dict(data["settings"]), cluster=str(data["cluster"]))
        except (KeyError, TypeError):
            raise KafkaConnectionError("<connection>", "<malformed>", '{"cluster": ..., "settings": {...}}') from None


def _jaas_quoted(text: str) -> str:
    """A JAAS option value in double quotes: only backslash and quote are escaped (JAAS knows no \\u escapes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _secret(value: Any) -> Secret | None:
    if value is None or value == "":
        return None
    return value if isinstance(value, Secret) else Secret(str(value))


def _valid_bootstrap(value: str) -> bool:
    parts = [part.strip() for part in value.split(",")]
    return bool(parts) and all(part and ":" in part and part.rsplit(":", 1)[1].isdigit() for part in parts)
