"""The local S3-API object store: S3Proxy serving the S3 API over a folder, on 127.0.0.1.

Runs from the jars `make install` copies from Maven Central into ``.jvm/s3proxy/``
(``jvm/object-store.pom.xml``); nothing is downloaded at run time. A store folder holds:

- ``credentials.json``: the access key and secret key, drawn at random at the first start and kept (owner-only);
- ``s3proxy.properties``: S3Proxy's settings, written from them at every start (owner-only: it holds the secret);
- ``logback.xml``: its log settings (INFO; S3Proxy's default is DEBUG, every request and header);
- ``data/``: the objects, one folder per bucket (jclouds' ``filesystem-nio2`` back end).

The secret travels only in those two owner-only files and in the environment of the processes that reach the
store (:meth:`ObjectStoreProcess.environment`): never on a command line, never in a log. Requests are signed (AWS
Signature V2 or V4); a request with other credentials is refused.

S3Proxy 4.1 (``jvm/object-store.pom.xml``): 2.6 listed a directory marker without its size, which Hadoop's S3A
fails on, refused the checksums pyarrow's AWS SDK sends with an upload by default, and left each multipart
upload's bookkeeping (``.mpus-*``) at the bucket's top; 4.1 does none of these.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from khipu.files import tighten, write_owner_only
from khipu.localstack.processes import find_java, free_port, port_open, stop_process_group
from khipu.settings import project_root
from khipu.storage.location import AWS_SDK_DEFAULTS
from khipu.storage.spark import DEFAULT_REGION, ENDPOINT_VARIABLE, REGION_VARIABLE

S3PROXY_MAIN = "org.gaul.s3proxy.Main"
DEFAULT_BUCKET = "khipu"
DEFAULT_PORT = 9000  # S3 APIs' usual local port (MinIO's), and KHIPU_S3_ENDPOINT's example
CREDENTIALS_FILE = "credentials.json"


class ObjectStoreError(RuntimeError):
    """The local object store could not be set up, started or reached."""


def s3proxy_jars() -> Path:
    """The folder of S3Proxy's jars; fails with the command that installs them when it is empty."""
    jars = project_root() / ".jvm" / "s3proxy"
    if not any(jars.glob("s3proxy-*.jar")):
        raise ObjectStoreError(f"S3Proxy's jars are not installed in {jars}; run `make install` (Maven fetches them)")
    return jars


@dataclass(frozen=True, slots=True)
class Credentials:
    """The store's one user. The secret is never shown (``repr``) nor logged."""

    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def draw(cls) -> Credentials:
        return cls(f"khipu-{secrets.token_hex(6)}", secrets.token_urlsafe(30))


def ensure_credentials(path: Path) -> Credentials:
    """The credentials kept in ``path`` (owner-only JSON), drawn there the first time. A file an earlier release
    left readable by others is made owner-only; one that holds no credentials is refused, naming it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        drawn = Credentials.draw()
        write_owner_only(path, json.dumps({"access_key": drawn.access_key, "secret_key": drawn.secret_key}) + "\n")
        return drawn
    tighten(path)
    try:
        found = json.loads(text)
        return Credentials(str(found["access_key"]), str(found["secret_key"]))
    except (ValueError, KeyError, TypeError):
        raise ObjectStoreError(
            f"{path} holds no credentials; expected JSON with access_key and secret_key (delete it to draw new ones)"
        ) from None


@dataclass(frozen=True, slots=True)
class ObjectStoreSpec:
    """One S3Proxy: its folder, where it listens, and the bucket it serves."""

    directory: Path  # credentials.json, s3proxy.properties, logback.xml and data/ live here
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    bucket: str = DEFAULT_BUCKET
    heap_mb: int = 256

    @classmethod
    def scratch(cls, directory: Path, bucket: str = DEFAULT_BUCKET) -> ObjectStoreSpec:
        """A throwaway store for tests and benchmarks, on a free port."""
        return cls(directory, port=free_port(), bucket=bucket)

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def credentials_path(self) -> Path:
        return self.directory / CREDENTIALS_FILE

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def properties(self, credentials: Credentials) -> dict[str, str]:
        return {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": credentials.access_key,
            "s3proxy.credential": credentials.secret_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(self.data_dir),
            # the folder back end takes no credentials of its own; jclouds wants the fields set
            "jclouds.identity": "local",
            "jclouds.credential": "local",
        }


@dataclass(frozen=True, slots=True)
class ObjectStoreProcess:
    """A running store: where it answers, its bucket, and what a process needs to reach it."""

    pid: int
    spec: ObjectStoreSpec
    credentials: Credentials = field(repr=False)
    log_path: Path  # its stdout and stderr: S3Proxy's log

    @property
    def endpoint(self) -> str:
        return self.spec.endpoint

    @property
    def bucket(self) -> str:
        return self.spec.bucket

    @property
    def access_key(self) -> str:
        return self.credentials.access_key

    @property
    def secret_key(self) -> str:
        return self.credentials.secret_key

    def environment(self) -> dict[str, str]:
        """The variables a Khipu process (pyarrow's S3 file system, Spark's S3A) reaches this store with
        (:func:`client_environment`). Hand it to a child's environment, never its argv."""
        return client_environment(self.spec, self.credentials)

    def stop(self) -> bool:
        """Stop its process group; True if it was running."""
        return stop_process_group(self.pid)


def client_environment(spec: ObjectStoreSpec, credentials: Credentials) -> dict[str, str]:
    """What reaches the store: the endpoint, the credentials, the region, and the AWS SDKs' checksums only where
    S3 requires them (what :mod:`khipu.storage.location` sets for any S3 API other than AWS's)."""
    return {
        ENDPOINT_VARIABLE: spec.endpoint,
        "AWS_ACCESS_KEY_ID": credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
        REGION_VARIABLE: DEFAULT_REGION,
        **AWS_SDK_DEFAULTS,
    }


_LOGBACK = """\
<!-- S3Proxy's log, to its stdout (the local stack sends it to <state>/logs/s3proxy.log); written by khipu -->
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>[%d] %level %msg \\(%logger\\)%n</pattern></encoder>
  </appender>
  <logger name="org.gaul.s3proxy" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def write_config(spec: ObjectStoreSpec, credentials: Credentials) -> Path:
    """Write ``s3proxy.properties`` (owner-only: it holds the secret) and the log settings."""
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    path = spec.directory / "s3proxy.properties"
    text = "# Written by khipu on every start from credentials.json; edit ObjectStoreSpec, not this file.\n" + "".join(
        f"{key}={value}\n" for key, value in spec.properties(credentials).items()
    )
    write_owner_only(path, text)
    (spec.directory / "logback.xml").write_text(_LOGBACK)
    return path


def _jvm(spec: ObjectStoreSpec) -> list[str]:
    java = find_java()
    if java is None:
        raise ObjectStoreError("S3Proxy needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set")
    return [
        java,
        f"-Xmx{spec.heap_mb}m",
        "-Djava.awt.headless=true",
        f"-Dlogback.configurationFile={spec.directory / 'logback.xml'}",
        "-cp",
        f"{s3proxy_jars()}/*",
    ]


def start_object_store(spec: ObjectStoreSpec, log_path: Path, ready_timeout_s: float = 60.0) -> ObjectStoreProcess:
    """Start S3Proxy in its own process group, wait until it answers, and create the bucket if it is new."""
    if port_open(spec.host, spec.port):
        raise ObjectStoreError(
            f"cannot start the object store on {spec.host}:{spec.port}: something already listens there"
        )
    spec.directory.mkdir(parents=True, exist_ok=True)
    credentials = ensure_credentials(spec.credentials_path)
    config = write_config(spec, credentials)
    argv = [*_jvm(spec), S3PROXY_MAIN, "--properties", str(config)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    store = ObjectStoreProcess(process.pid, spec, credentials, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while not (port_open(spec.host, spec.port) and _answers(spec.endpoint)):
        if process.poll() is not None:
            raise ObjectStoreError(f"the object store exited with code {process.returncode} at start; see {log_path}")
        if time.monotonic() > deadline:
            stop_process_group(process.pid)
            raise ObjectStoreError(
                f"the object store did not answer on {spec.endpoint} within {ready_timeout_s:.0f}s; see {log_path}"
            )
        time.sleep(0.1)
    try:
        _ensure_bucket(store)
    except OSError as exc:
        stop_process_group(process.pid)
        raise ObjectStoreError(f"creating the bucket {spec.bucket!r} on {spec.endpoint} failed: {exc}") from None
    return store


def _answers(endpoint: str) -> bool:
    """S3Proxy answers HTTP: an unsigned request is refused (403), which is an answer."""
    try:
        with urllib.request.urlopen(endpoint, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _ensure_bucket(store: ObjectStoreProcess) -> None:
    """Create the bucket through the S3 API (a bucket request carries no payload: no checksum to disagree on)."""
    filesystem = pafs.S3FileSystem(
        access_key=store.access_key,
        secret_key=store.secret_key,
        endpoint_override=f"{store.spec.host}:{store.spec.port}",
        scheme="http",
        region=DEFAULT_REGION,
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    )
    if filesystem.get_file_info(store.bucket).type == pafs.FileType.NotFound:
        filesystem.create_dir(store.bucket)
