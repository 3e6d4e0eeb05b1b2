"""Hadoop's S3A settings for a Spark job that reads or writes ``s3a://`` locations.

Spark reaches an object store through Hadoop's S3A file system (``hadoop-aws`` and the AWS SDK's S3 client,
installed beside Spark's Kafka connector in ``.jvm/spark-kafka/``). The store is named by the same environment
pyarrow reads (:mod:`khipu.storage.location`): ``KHIPU_S3_ENDPOINT`` for an S3 API other than AWS's own,
``AWS_REGION``, and the credentials ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``.

**No secret is ever a Spark setting.** Spark settings are shown in its UI, written to event logs and passed on
spark-submit's command line; so S3A is told to read the credentials from the environment of the JVM it runs in
(the AWS SDK's ``EnvironmentVariableCredentialsProvider``), and the settings below hold only where the store is.
In local mode the executors are threads of the driver's JVM, which inherits the launching process's environment.
On a cluster each executor's environment must carry the credentials too (the worker's ``spark-env.sh``, a
Kubernetes secret, YARN's container environment), never ``spark.executorEnv.*``, which is a Spark setting.
"""

from __future__ import annotations

from collections.abc import Mapping

from khipu.storage.location import ENDPOINT_VARIABLE, s3_endpoint

__all__ = ["ENDPOINT_VARIABLE", "hadoop_settings", "s3_endpoint"]  # the endpoint's variable and reading: one place

REGION_VARIABLE = "AWS_REGION"
# an S3 API of one's own signs for a region too; S3Proxy and MinIO accept any, AWS's own is us-east-1 by default
DEFAULT_REGION = "us-east-1"
ENVIRONMENT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
HADOOP = "spark.hadoop.fs.s3a."


def hadoop_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``spark.hadoop.fs.s3a.*`` settings for the object store the environment names.

    Credentials: never in the settings. With ``AWS_ACCESS_KEY_ID`` in the environment (an S3 API of one's own, keys
    handed to every host), read from the JVM's environment only; without it, S3A's default chain (an instance
    profile, a pod's web identity, the usual AWS files). With ``KHIPU_S3_ENDPOINT``: that endpoint, path-style
    requests (``http://host/bucket/key``: a local store has no per-bucket host names), TLS only for an https
    endpoint, and the region (``AWS_REGION``, else us-east-1). Without it, AWS's own S3: no endpoint settings, the
    region from ``AWS_REGION`` when set (else S3A finds the bucket's)."""
    settings: dict[str, str] = {}
    if environ.get("AWS_ACCESS_KEY_ID", "").strip():
        settings[f"{HADOOP}aws.credentials.provider"] = ENVIRONMENT_CREDENTIALS
    region = environ.get(REGION_VARIABLE, "").strip()
    endpoint = s3_endpoint(environ)
    if endpoint:
        settings.update(
            {
                f"{HADOOP}endpoint": endpoint,
                f"{HADOOP}path.style.access": "true",
                f"{HADOOP}connection.ssl.enabled": "true" if endpoint.startswith("https:") else "false",
            }
        )
        region = region or DEFAULT_REGION
    if region:
        settings[f"{HADOOP}endpoint.region"] = region
    return settings
