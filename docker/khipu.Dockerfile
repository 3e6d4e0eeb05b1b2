# Khipu without Airflow (docker-compose.yaml builds it with the repository root as context): the image of the
# Spark master and workers, whose executors run Khipu's Python (the trace decoder, the detector's stateful
# processor, reconciliation's reads), and of the exporter.
#   - Python 3.11, as Khipu (pyproject.toml) and the Airflow image where the Spark driver runs: PySpark refuses
#     executors whose Python differs from the driver's.
#   - Spark is pyspark from PyPI at the version constraints.txt pins (its jars and bin/spark-class are in the
#     wheel), so master, workers and driver run one Spark; as the project's own test cluster does
#     (include/khipu/localstack/spark_cluster.py).
#   - Khipu's packages from docker/khipu-requirements.txt, pinned by constraints.txt, and the khipu package
#     (include/), editable from /opt/khipu so that the ./include bind mount of docker-compose.yaml is the code
#     the executors run, the same as the driver's.
#   - No S3A jars: the driver ships them to the executors (spark.jars, from .jvm/spark-kafka in the Airflow
#     image). No credentials: the object store's come from the container's environment.

FROM python:3.11-slim-bookworm

USER root
# default-jre-headless is OpenJDK 17 on bookworm, as in the Airflow image; procps for Spark's scripts (ps).
# /usr/share/man/man1 must exist for the JRE's post-install script on slim Debian images.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 185 --gid 0 --no-create-home --home-dir /opt/spark spark \
    && mkdir -p /opt/spark/work /opt/spark/local /opt/khipu/state \
    && chown -R 185:0 /opt/spark /opt/khipu/state
ENV JAVA_HOME=/usr/lib/jvm/default-java

WORKDIR /opt/khipu
# Dependencies first (a cached layer).
COPY requirements.txt constraints.txt pyproject.toml README.md ./
COPY docker/khipu-requirements.txt ./docker/
RUN pip install --no-cache-dir -r docker/khipu-requirements.txt -c constraints.txt

# The khipu package (include/khipu), editable: a .pth entry points at /opt/khipu/include.
COPY include/ ./include/
RUN pip install --no-cache-dir --no-deps -e .

# Spark from the pyspark wheel; executors start python3, this image's 3.11.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    SPARK_WORKER_DIR=/opt/spark/work \
    SPARK_LOCAL_DIRS=/opt/spark/local \
    PATH=/usr/local/lib/python3.11/site-packages/pyspark/bin:$PATH
USER 185
WORKDIR /opt/spark
