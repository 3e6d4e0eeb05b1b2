"""Hadoop's S3A settings come from the environment that names the object store, and never hold a secret."""

from __future__ import annotations

import pytest

from khipu.storage.location import StorageError
from khipu.storage.spark import ENVIRONMENT_CREDENTIALS, hadoop_settings

PROVIDER = {"spark.hadoop.fs.s3a.aws.credentials.provider": ENVIRONMENT_CREDENTIALS}
KEYS = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
LOCAL = {
    "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
}

# (environment, settings, why)
CASES = [
    # 1. the local stack's S3Proxy: its endpoint, path-style, plain http, the region it is given
    ({**KEYS, "KHIPU_S3_ENDPOINT": "http://127.0.0.1:9000", "AWS_REGION": "us-east-1"},
     {**PROVIDER, **LOCAL, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}, "the local store"),
    # 2. an endpoint of one's own without a region: the SDK still signs for one; us-east-1, as pyarrow's default
    ({**KEYS, "KHIPU_S3_ENDPOINT": "http://127.0.0.1:9000"},
     {**PROVIDER, **LOCAL, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}, "region defaulted"),
    # 3. a trailing slash is the same endpoint
    ({**KEYS, "KHIPU_S3_ENDPOINT": "http://127.0.0.1:9000/", "AWS_REGION": "eu-west-1"},
     {**PROVIDER, **LOCAL, "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"}, "trailing slash"),
    # 4. an https endpoint (MinIO, Ceph behind TLS): TLS on
    ({**KEYS, "KHIPU_S3_ENDPOINT": "https://minio.internal:9443", "AWS_REGION": "eu-west-1"},
     {**PROVIDER, "spark.hadoop.fs.s3a.endpoint": "https://minio.internal:9443",
      "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "true",
      "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"}, "https endpoint"),
    # 5. AWS's own S3 with a region: no endpoint settings, the region
    ({**KEYS, "AWS_REGION": "eu-central-1"}, {**PROVIDER, "spark.hadoop.fs.s3a.endpoint.region": "eu-central-1"},
     "AWS"),
    # 6. AWS's own S3, no region: S3A finds the bucket's; nothing but where credentials come from
    (KEYS, PROVIDER, "AWS, region found by S3A"),
    # 7. an empty (or blank) endpoint is unset: AWS's own
    ({**KEYS, "KHIPU_S3_ENDPOINT": "  ", "AWS_REGION": ""}, PROVIDER, "blank is unset"),
    # 8. no keys in the environment (an instance profile, a pod's web identity): S3A's default chain, not the
    # environment's provider, which would find nothing
    ({"AWS_REGION": "eu-central-1"}, {"spark.hadoop.fs.s3a.endpoint.region": "eu-central-1"}, "a host's role"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "settings", "why"), CASES, ids=[case[2] for case in CASES])
def test_the_settings_name_the_endpoint_the_environment_names(
    environ: dict[str, str], settings: dict[str, str], why: str
) -> None:
    assert hadoop_settings(environ) == settings, why


def test_no_secret_of_the_environment_becomes_a_spark_setting() -> None:
    environ = {
        "KHIPU_S3_ENDPOINT": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "access-key-in-the-environment",
        "AWS_SECRET_ACCESS_KEY": "secret-key-in-the-environment",
        "AWS_SESSION_TOKEN": "session-token-in-the-environment",
    }
    settings = hadoop_settings(environ)
    shown = " ".join([*settings, *settings.values()])
    assert "in-the-environment" not in shown
    assert not any(key.endswith(("access.key", "secret.key", "session.token")) for key in settings)
    assert settings["spark.hadoop.fs.s3a.aws.credentials.provider"] == ENVIRONMENT_CREDENTIALS


REFUSED = [
    ("127.0.0.1:9000", "an http:// or https:// URL"),  # no scheme: Hadoop would take it as https
    ("s3://127.0.0.1:9000", "an http:// or https:// URL"),
    ("http://", "an http:// or https:// URL"),
    ("http://127.0.0.1:9000/khipu", "at most a port"),  # a bucket in the endpoint: it belongs in the URL
    ("http://127.0.0.1:9000?region=x", "at most a port"),
    ("http://127.0.0.1:port", "at most a port"),
    ("http://AKIA:topsecret@127.0.0.1:9000", "never the URL"),
]


@pytest.mark.parametrize(("endpoint", "expected"), REFUSED)
def test_a_bad_endpoint_is_refused_naming_the_variable_and_what_is_expected(endpoint: str, expected: str) -> None:
    with pytest.raises(StorageError) as raised:
        hadoop_settings({"KHIPU_S3_ENDPOINT": endpoint})
    message = str(raised.value)
    assert "'KHIPU_S3_ENDPOINT'" in message and expected in message
    assert "topsecret" not in message
