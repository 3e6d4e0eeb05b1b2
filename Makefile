# Khipu — the two commands a new user needs:  `make up`  and  `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.khipu-installed
JVM := .jvm
KAFKA_JARS := $(JVM)/kafka/.installed
SPARK_KAFKA_JARS := $(JVM)/spark-kafka/.installed
OBJECT_STORE_JARS := $(JVM)/s3proxy/.installed
TRACING_JAR := $(JVM)/tracing/khipu-tracing.jar
TRACING_SOURCES := $(shell find jvm/tracing/src -type f 2>/dev/null) jvm/tracing/pom.xml
MVN := mvn -B -q
export PATH := $(BIN):$(PATH)
export PYSPARK_PYTHON := $(BIN)/python

.PHONY: help install up down status test test-jvm-apps lint bench lock clean postgres chromium graphviz screenshots

help:
	@echo "make up      install (first time), then start broker + Airflow + demo pipeline"
	@echo "make test    run the test suite (unit, integration on real broker/Airflow, static checks)"
	@echo "make down    stop everything 'make up' started"
	@echo "make status  show what runs, the UI URL and how to log in"
	@echo "make bench   print the tracing-overhead figures"
	@echo "make lint    ruff + mypy only"
	@echo "make screenshots  retake the Khipu view's screenshots in docs/screenshots"
	@echo "make install the venv (PyPI), the JVM jars (Maven Central: Kafka broker, Spark's Kafka connector and S3A, S3Proxy) and the JVM interceptors"

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: no python3.11 found; Khipu needs Python 3.11 (set PYTHON=/path/to/python3.11)"; exit 2; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "make: $(PYTHON) is not Python 3.11; set PYTHON=/path/to/python3.11"; exit 2; }
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)
	@echo "installed Khipu into $(VENV)"

# JVM artifacts come from Maven Central at install time, never at run time (jvm/*.pom.xml).
$(KAFKA_JARS): jvm/kafka-broker.pom.xml
	@command -v mvn >/dev/null || { echo "make: Maven (mvn) is needed to fetch Apache Kafka's jars"; exit 2; }
	@rm -rf $(JVM)/kafka
	$(MVN) -f jvm/kafka-broker.pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/kafka
	@touch $@
	@echo "installed Apache Kafka's jars into $(JVM)/kafka"

$(SPARK_KAFKA_JARS): jvm/spark-kafka.pom.xml
	@command -v mvn >/dev/null || { echo "make: Maven (mvn) is needed to fetch Spark's Kafka connector"; exit 2; }
	@rm -rf $(JVM)/spark-kafka
	$(MVN) -f jvm/spark-kafka.pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/spark-kafka
	@touch $@
	@echo "installed Spark's Kafka connector and Hadoop's S3A into $(JVM)/spark-kafka"

# The local stack's S3-API object store (S3Proxy over a folder; docs/local-stack.md), in a JVM of its own.
$(OBJECT_STORE_JARS): jvm/object-store.pom.xml
	@command -v mvn >/dev/null || { echo "make: Maven (mvn) is needed to fetch S3Proxy, the local object store"; exit 2; }
	@rm -rf $(JVM)/s3proxy
	$(MVN) -f jvm/object-store.pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/s3proxy
	@touch $@
	@echo "installed S3Proxy (the local object store) into $(JVM)/s3proxy"

# Khipu's tracing interceptors for JVM clients (docs/tracing-jvm.md), built from jvm/tracing; `make test` runs its tests.
$(TRACING_JAR): $(TRACING_SOURCES)
	@command -v mvn >/dev/null || { echo "make: Maven (mvn) is needed to build Khipu's JVM interceptors"; exit 2; }
	$(MVN) -f jvm/tracing/pom.xml -DskipTests package
	@mkdir -p $(JVM)/tracing && cp jvm/tracing/target/khipu-tracing.jar $@
	@echo "built Khipu's JVM tracing interceptors into $@"

install: $(STAMP) $(KAFKA_JARS) $(SPARK_KAFKA_JARS) $(OBJECT_STORE_JARS) $(TRACING_JAR)

# What only the tests run, as real processes (tests/integration/tracing/test_jvm_interceptors.py): plain Java
# applications and a Kafka Streams one (jvm/testapps), kafka-clients 3.9.1, and MirrorMaker 2 (connect-mirror 4.3.1).
TESTAPPS := $(JVM)/testapps/.installed
CLIENTS_3 := $(JVM)/clients-3/.installed
MIRROR := $(JVM)/mirror/.installed
$(TESTAPPS): jvm/testapps/pom.xml $(shell find jvm/testapps/src -type f 2>/dev/null)
	@rm -rf $(JVM)/testapps
	$(MVN) -f jvm/testapps/pom.xml package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/testapps
	@cp jvm/testapps/target/khipu-testapps.jar $(JVM)/testapps/ && touch $@
$(CLIENTS_3): jvm/kafka-clients-3.pom.xml
	@rm -rf $(JVM)/clients-3
	$(MVN) -f jvm/kafka-clients-3.pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/clients-3
	@touch $@
$(MIRROR): jvm/mirror-maker.pom.xml
	@rm -rf $(JVM)/mirror
	$(MVN) -f jvm/mirror-maker.pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JVM)/mirror
	@touch $@
test-jvm-apps: $(TESTAPPS) $(CLIENTS_3) $(MIRROR)

postgres:
	@scripts/ensure-postgres

chromium:
	@scripts/ensure-chromium

# Graphviz's dot lays out the view's route maps (Debian's graphviz package; as root, once).
graphviz:
	@scripts/ensure-graphviz

up: install graphviz
	$(BIN)/khipu up

down:
	@if [ -x $(BIN)/khipu ]; then $(BIN)/khipu down; else echo "nothing to stop (not installed)"; fi

status: $(STAMP)
	$(BIN)/khipu status

test: install test-jvm-apps postgres chromium graphviz
	mvn -B -ntp -f jvm/tracing/pom.xml test   # the JVM interceptors' tests: Surefire's summary
	$(BIN)/pytest -n 2 --dist loadscope   # two workers, a scope each: tests/conftest.py

# Retake the Khipu view's screenshots in docs/screenshots (the browser tests take them).
screenshots: install chromium graphviz
	KHIPU_SCREENSHOT_DIR=$(CURDIR)/docs/screenshots $(BIN)/pytest -q tests/integration/view

lint: install
	$(BIN)/ruff check include plugins dags spark bench tests
	$(BIN)/mypy

bench: install test-jvm-apps
	$(BIN)/python bench/tracing_overhead.py
	$(BIN)/python bench/detector.py

lock: $(STAMP)
	@{ echo "# Generated by \`make lock\` from a working .venv: every installed package, pinned."; \
	   echo "# Installed with -c so a fresh clone resolves exactly what was tested."; \
	   $(BIN)/pip freeze --exclude-editable | grep -v '^khipu'; } > constraints.txt

clean: down
	rm -rf .khipu
