"""A place Khipu keeps files: a local folder or a prefix in an object store, and the few things done there.

A :class:`Location` is one URL, as a setting gives it:

    /var/lib/khipu/archive            a local folder (also ``file:///var/lib/khipu/archive``)
    s3a://khipu-data/prod/archive     a prefix in an S3 bucket (``s3://`` is the same place)
    gs://…, abfs://…                  read and written by Spark (with its connector) and pyarrow; untested here

Spark is given :attr:`Location.spark_url` (Hadoop's scheme); everything else goes through pyarrow's file system
for the URL (:meth:`Location.filesystem`). An object store is reached with the environment's credentials
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, or the host's role) and ``KHIPU_S3_ENDPOINT`` for an S3 API
other than AWS's (s3proxy, MinIO, Ceph); no secret is ever part of a URL.

**Writes are committed whole.** :meth:`Location.write_bytes` makes a file appear complete or not at all: a
local file is written under a temporary name and renamed into place (atomic on one file system); an object is
uploaded in one request, or in parts that the store shows only once the upload completes, so a writer that dies
mid-write leaves nothing a reader sees. Object stores have no atomic rename, so nothing here renames an object.
What spans several files (a micro-batch's hours) is committed by :mod:`khipu.storage.batches`.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from khipu.errors import InvalidSetting

OBJECT_STORE_SCHEMES = ("s3a", "gs", "abfs", "abfss")
SCHEME_ALIASES = {"s3": "s3a", "s3n": "s3a", "gcs": "gs"}
# the AWS SDK (pyarrow's) otherwise adds checksums that S3 APIs other than AWS's refuse (s3proxy, older MinIO)
AWS_SDK_DEFAULTS = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}
EXPECTED = "a local folder (/path or file:///path) or an object store prefix (s3a://bucket/prefix, gs://…, abfs://…)"


class StorageError(InvalidSetting):
    """A location that cannot be used: names the setting, its value and what is expected."""

    kind = "storage location"


class StorageUnreachable(OSError):
    """The object store did not answer, or refused: names the location and what it said."""


@dataclass(frozen=True, slots=True)
class Location:
    """A folder or object-store prefix. ``url``: ``file:///abs/path`` or ``<scheme>://<bucket>/<prefix>``, with
    no trailing slash (build one with :meth:`of`)."""

    url: str

    LOCAL: ClassVar[str] = "file"

    @classmethod
    def of(cls, value: str | Path | Location, setting: str = "location") -> Location:
        """The location a setting names; StorageError naming ``setting`` when it names none (an unknown scheme,
        a bucket without a prefix, a relative or empty path, credentials in the URL)."""
        if isinstance(value, Location):
            return value
        text = str(value).strip()
        if not text:
            raise StorageError(setting, value, EXPECTED)
        if "://" not in text and not text.startswith("file:"):
            path = Path(text).expanduser()
            if not path.is_absolute():
                raise StorageError(setting, text, f"an absolute path or a URL: {EXPECTED}")
            return cls(f"file://{PurePosixPath(os.path.normpath(path))}")
        parts = urlsplit(text)
        scheme = SCHEME_ALIASES.get(parts.scheme.lower(), parts.scheme.lower())
        if scheme == cls.LOCAL:
            if parts.netloc not in ("", "localhost"):
                raise StorageError(setting, text, f"a file URL on this host (file:///path): {EXPECTED}")
            return cls.of(parts.path or "", setting)
        if scheme not in OBJECT_STORE_SCHEMES:
            raise StorageError(setting, text, EXPECTED)
        if parts.password or parts.query or (parts.username and not scheme.startswith("abfs")):  # abfs: container@
            raise StorageError(setting, "<a URL with credentials or options>", f"{EXPECTED}; credentials come from "
                               "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never the URL")  # fmt: skip
        prefix = parts.path.strip("/")
        if not parts.netloc or not prefix:
            raise StorageError(setting, text, f"a bucket and a prefix under it (e.g. {scheme}://khipu-data/archive)")
        return cls(f"{scheme}://{parts.netloc}/{prefix}")

    # -- naming -----------------------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]

    @property
    def is_local(self) -> bool:
        return self.scheme == self.LOCAL

    @property
    def local_path(self) -> Path:
        """The folder, for a local location (ValueError for an object store: use the file system)."""
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local folder")
        return Path(self.url.removeprefix("file://"))

    @property
    def path(self) -> str:
        """The location in its pyarrow file system: ``/abs/path``, or ``bucket/prefix``."""
        return str(self.local_path) if self.is_local else self.url.split("://", 1)[1]

    @property
    def spark_url(self) -> str:
        """As Spark (Hadoop) names it: a plain path for a local folder (as Khipu gave Spark before URLs, so an
        existing checkpoint's location reads the same), the URL otherwise."""
        return str(self.local_path) if self.is_local else self.url

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        """The folder holding it (ValueError for a bucket's top prefix or the root folder)."""
        head = self.url.rsplit("/", 1)[0]
        if head.endswith(":/") or (not self.is_local and head.count("/") < 3):
            raise ValueError(f"{self.url} has no parent Khipu may write in")
        return Location(head if head != "file://" else "file:///")

    def __truediv__(self, part: str) -> Location:
        if not part or part.startswith("/") or ".." in part.split("/"):
            raise ValueError(f"a relative name under {self.url}, not {part!r}")
        return Location(f"{self.url}/{part.strip('/')}")

    def __str__(self) -> str:
        return self.spark_url

    # -- the file system --------------------------------------------------------------------------------------

    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's file system for this location (one per scheme and bucket, kept)."""
        if self.is_local:
            return pafs.LocalFileSystem()
        return _object_store(self.scheme, self.url.split("://", 1)[1].split("/", 1)[0], s3_endpoint(os.environ))

    def info(self) -> pafs.FileInfo:
        try:
            return self.filesystem().get_file_info(self.path)
        except OSError as exc:
            raise StorageUnreachable(f"{self.url}: {exc}") from exc

    def exists(self) -> bool:
        return bool(self.info().type != pafs.FileType.NotFound)

    def is_dir(self) -> bool:
        """A folder, or an object-store prefix holding something."""
        return bool(self.info().type == pafs.FileType.Directory)

    def is_file(self) -> bool:
        return bool(self.info().type == pafs.FileType.File)

    def children(self) -> list[pafs.FileInfo]:
        """What is directly under it (nothing when it does not exist), by name."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        try:
            found = self.filesystem().get_file_info(selector)
        except OSError as exc:
            raise StorageUnreachable(f"{self.url}: {exc}") from exc
        return sorted(found, key=lambda info: info.base_name)

    def child_folders(self, prefix: str = "") -> list[str]:
        """The names of the folders directly under it that start with ``prefix``."""
        return [
            info.base_name
            for info in self.children()
            if info.type == pafs.FileType.Directory and info.base_name.startswith(prefix)
        ]

    def files(self, recursive: bool = False) -> list[str]:
        """The paths (in :meth:`filesystem`) of the files under it, skipping names that start with ``.`` or
        ``_`` (work in progress, bookkeeping), sorted."""
        return [info.path for info in self.file_infos(recursive)]

    def file_infos(self, recursive: bool = False) -> list[pafs.FileInfo]:
        """:meth:`files` with their sizes (``FileInfo.size``), by path."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=recursive)
        try:
            found = self.filesystem().get_file_info(selector)
        except OSError as exc:
            raise StorageUnreachable(f"{self.url}: {exc}") from exc
        root = self.path.rstrip("/") + "/"
        return sorted(
            (
                info
                for info in found
                if info.type == pafs.FileType.File
                and not any(part.startswith((".", "_")) for part in info.path.removeprefix(root).split("/"))
            ),
            key=lambda info: info.path,
        )

    def read_bytes(self) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        try:
            with self.filesystem().open_input_stream(self.path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
                raise FileNotFoundError(self.url) from exc
            raise StorageUnreachable(f"{self.url}: {exc}") from exc

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Write the file whole (see the module's note): a reader finds the old file or the new one, never part."""
        filesystem = self.filesystem()
        if self.is_local:
            path = self.local_path
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
            try:
                temporary.write_bytes(data)
                os.replace(temporary, path)
            finally:
                temporary.unlink(missing_ok=True)
            return
        try:
            with filesystem.open_output_stream(self.path) as stream:
                stream.write(data)
        except OSError as exc:
            raise StorageUnreachable(f"{self.url}: {exc}") from exc

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def delete(self) -> None:
        """Remove the file or folder and everything under it (nothing to remove: nothing done)."""
        info = self.info()
        filesystem = self.filesystem()
        try:
            if info.type == pafs.FileType.Directory:
                filesystem.delete_dir(self.path)
            elif info.type == pafs.FileType.File:
                filesystem.delete_file(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageUnreachable(f"{self.url}: {exc}") from exc

    def check_reachable(self, setting: str) -> None:
        """Raise StorageError naming the setting when the location cannot be listed (an object store that does not
        answer, a bucket that does not exist, credentials it refuses). A location that does not exist yet is
        fine: writing makes it."""
        try:
            self.children()
            if not self.is_local:
                bucket = Location(f"{self.scheme}://{self.path.split('/', 1)[0]}/x")
                if bucket.filesystem().get_file_info(bucket.path.split("/", 1)[0]).type == pafs.FileType.NotFound:
                    raise StorageError(setting, self.url, "an existing bucket (create it first)")
        except (StorageUnreachable, OSError) as exc:
            raise StorageError(setting, self.url, f"a location this host can list: {exc}") from None


ENDPOINT_VARIABLE = "KHIPU_S3_ENDPOINT"
ENDPOINT_EXPECTED = "an http:// or https:// URL of an S3 API with a host and at most a port, e.g. http://127.0.0.1:9000"


def s3_endpoint(environ: Mapping[str, str]) -> str:
    """``KHIPU_S3_ENDPOINT`` as ``scheme://host[:port]`` ('' when unset: AWS's own S3); StorageError naming it when
    it is not an http(s) URL of a host, or carries a path, options or credentials (which would make a secret a
    Spark setting)."""
    value = environ.get(ENDPOINT_VARIABLE, "").strip()
    if not value:
        return ""
    parts = urlsplit(value)
    try:
        _ = parts.port  # a port that is not a number in [0, 65535] raises here
    except ValueError:
        raise StorageError(ENDPOINT_VARIABLE, value, ENDPOINT_EXPECTED) from None
    if parts.username is not None or parts.password is not None:
        expected = f"{ENDPOINT_EXPECTED}; credentials come from the environment (AWS_ACCESS_KEY_ID, ...), never the URL"
        raise StorageError(ENDPOINT_VARIABLE, "<a URL with credentials>", expected)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise StorageError(ENDPOINT_VARIABLE, value, ENDPOINT_EXPECTED)
    return f"{parts.scheme}://{parts.netloc}"


@functools.lru_cache(maxsize=16)
def _object_store(scheme: str, bucket: str, endpoint_url: str) -> pafs.FileSystem:
    if scheme == "s3a":
        for name, value in AWS_SDK_DEFAULTS.items():
            os.environ.setdefault(name, value)
        options: dict[str, object] = {"region": os.environ.get("AWS_REGION", "us-east-1")}
        if endpoint_url:
            endpoint = urlsplit(endpoint_url)
            options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme, force_virtual_addressing=False)
        return pafs.S3FileSystem(**options)  # type: ignore[arg-type]
    filesystem, _ = pafs.FileSystem.from_uri(f"{'abfs' if scheme == 'abfss' else scheme}://{bucket}")
    return filesystem
