# Airflow image of the Khipu reference stack (docker-compose.yaml builds it with the repository root
# as context). Official Airflow 3.3.2 on Python 3.11, plus:
#   - a Java runtime, because the SparkSubmitOperator runs spark-submit in client mode inside the
#     Airflow task process (the Spark driver lives here, the executors on the Spark worker);
#   - Khipu's pinned requirements and the khipu package itself (include/), installed editable from
#     /opt/khipu so that the ./include bind mount of docker-compose.yaml is the code that runs and
#     khipu.settings.project_root() resolves to /opt/khipu (config/ and spark/ are mounted beside it);
#   - Spark's Kafka connector and Hadoop's S3A (jvm/spark-kafka.pom.xml), fetched by Maven at build time into
#     /opt/khipu/.jvm/spark-kafka, where the DAGs hand them to spark-submit (spark.jars): the executors get
#     them from the driver.

# Build stage: the connector jars from Maven Central, never at run time.
FROM maven:3.9-eclipse-temurin-17 AS spark-kafka-jars
COPY jvm/spark-kafka.pom.xml /build/pom.xml
RUN mvn -B -q -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars

FROM apache/airflow:3.3.2-python3.11

USER root
# default-jre-headless is OpenJDK 17 on Debian bookworm (and 21 on trixie); Spark 4 supports both.
# /usr/share/man/man1 must exist for the JRE's post-install script on slim Debian images.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless procps \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/khipu/state \
    && chown -R airflow:0 /opt/khipu \
    && chmod -R g+rwX /opt/khipu
ENV JAVA_HOME=/usr/lib/jvm/default-java

USER airflow
WORKDIR /opt/khipu

# Dependencies first (cached layer). Pinning apache-airflow to the image's own version stops pip from
# moving Airflow; requirements.txt pins the same 3.3.2. constraints.txt pins everything they pull in, as
# `make install` does: pyspark, pyarrow and pandas here (the Spark driver) are those of the Spark executors
# (docker/khipu.Dockerfile installs with the same constraints).
COPY --chown=airflow:0 requirements.txt constraints.txt pyproject.toml README.md ./
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r requirements.txt -c constraints.txt

# The khipu package (include/khipu), editable: a .pth entry points at /opt/khipu/include.
COPY --chown=airflow:0 include/ ./include/
RUN pip install --no-cache-dir --no-deps -e .
COPY --from=spark-kafka-jars --chown=airflow:0 /jars/ ./.jvm/spark-kafka/

ENV KHIPU_STATE_DIR=/opt/khipu/state \
    PYSPARK_PYTHON=python3
WORKDIR /opt/airflow
