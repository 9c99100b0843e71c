# The Makefile is the interface: CI runs exactly these targets (.ci/run -> make lint, make test).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY      := .venv/bin/python
UV_VERSION := 0.13.8
UV      := .tools/bin/uv
STAMP   := .venv/.installed
PYTEST_ARGS ?=

.PHONY: help setup stack-deps deps s3-server up down status airflow demo test test-fast test-faults test-redis-cluster test-properties test-integration bench load load-steps load-read-heavy tail history reports dual-write compare erasure-audit lint fmt clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

# Every process a target starts caches the bytecode it compiles (Python's default), whatever the
# caller's environment says: with PYTHONDONTWRITEBYTECODE set (as in this machine's environment)
# every process compiled every module it imported again (`import airflow.sdk` 3.2 -> 1.4 s, a
# job's start 1.1 -> 0.4 s; the suite starts hundreds). Cached on first import, only what runs
# is compiled: `uv sync --compile-bytecode` compiled the whole venv at install instead, 36 s of
# every fresh setup on this machine (2026-11-27), where a first import of everything a job, the
# API and Airflow use compiles 1,821 modules in 7.5 s (12.3 s, then 4.8 s).
unexport PYTHONDONTWRITEBYTECODE

# uv itself, pinned, outside the project's venv (so `uv sync` never removes it): .tools/bin/uv
$(UV):
	@PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --target .tools uv==$(UV_VERSION)

# The project as uv builds it: Python 3.11 (.python-version), the locked dependencies (uv.lock,
# from pyproject.toml), the project itself (editable) with its console entry points.
$(STAMP): pyproject.toml uv.lock .python-version | $(UV)
	@test -x $(PY) && $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || $(UV) venv -q --python 3.11 .venv
	$(UV) sync -q --locked --extra dev
	@touch $(STAMP)

setup: stack-deps s3-server ## install Python deps, fetch + verify JVM jars, dump the Spark class archive, ensure redis-server, build the S3 test server (and Prometheus with SOCIAL_PROMETHEUS=1; idempotent)

# What the stack itself needs (up, demo, airflow): setup without the S3 test server, which only the
# S3 lake's tests start (a user's own store is theirs: docs/running.md).
stack-deps: deps ## setup without the S3 test server: what `make up`, `make demo` and `make airflow` need
	@$(PY) -m social spark class-archive

# What every tier needs; no Go (the fast tier runs without it: tests/unit/conftest.py).
deps: $(STAMP) ## setup without the class archive and the S3 test server (make test dumps and builds them before the tiers that use them)
	@$(PY) -m social jars fetch
	@$(PY) -m social ensure-redis
	@$(PY) -m social ensure-prometheus

# versitygw, the S3-compatible server of tests/integration/test_external_lake.py, built with Go from
# its pinned module (infra/s3server.py): a prerequisite of the integration tier and of setup, not of
# the fast tier, which needs no Go (on a fresh clone `make test-fast` built it first: 172 s,
# docs/running.md).
s3-server: $(STAMP) ## build the S3 lake tests' S3-compatible server (versitygw, pinned, `go install`; skipped with one line without Go)
	@$(PY) -m social ensure-s3server

up: stack-deps ## start Kafka (KRaft), Redis, the speed layer, the API and the metrics exporter on 127.0.0.1
	@$(PY) -m social up

down: ## stop exactly what `make up` started
	@test -x $(PY) && $(PY) -m social down || true

status: ## what is running, and the headline metrics (lag, freshness, accounting: docs/metrics.md)
	@$(PY) -m social status
	@$(PY) -m social metrics --summary

airflow: stack-deps ## the Airflow UI with the DAGs (scheduler + API server) in the foreground: http://127.0.0.1:8080, no login
	@$(PY) -m social airflow standalone

# The demo's size: DEMO_EVENTS (history, 200000), DEMO_USERS (1000), DEMO_LIVE_SECONDS (30), or
# DEMO_ARGS="--no-airflow ..." (python -m stories.demo --help); tests/integration/test_demo.py runs
# it small on a stack of its own.
demo: stack-deps ## the whole story end to end on a fresh machine (DEMO_EVENTS=N for another size)
	@$(PY) -m social demo $(DEMO_ARGS)

# The integration tests start many short Spark jobs, each in its own JVM: without the C2 compiler
# each spends less CPU compiling than it would gain (flushall-restore test 214 s vs 266 s). The
# unit run keeps one JVM for minutes and keeps C2, as do the benchmarks and the stack. An
# explicitly set SOCIAL_SPARK_DRIVER_JAVA_OPTIONS wins.
# TieredStopAtLevel=1 also puts the JVM in client emulation, whose code cache is 48 MiB instead of
# 240 MiB: a long job (a rebuild, a verify) filled it with C1 code and Spark's generated classes
# and died of "Out of space in CodeCache for method handle intrinsic". Hence the explicit size.
# Both runs' data is tiny, so adaptive execution (re-planned after every stage) and code generation
# (Janino and the JIT compiling each new plan) cost more than they save: a verify of 4,000 events
# 61 -> 41 s, 73 -> 43 JVM CPU-seconds; the unit run alone 5:04 -> 4:18
# (docs/testing.md). SOCIAL_SPARK_CONF wins too.
# For the same reason their shuffles get one partition per core, not the stack's 4: a private
# stack, alternating, two rounds each (2026-11-26): a compaction 20.1 -> 15.4 CPU-s, a verify of
# 4,000 events 26.5 -> 22.8, an archive of 1,000 events 5.5 -> 4.5. And Delta rebuilds a table's
# snapshot in one task, not the stack's 4 (a private stack, alternating, 2026-11-26 night: a verify
# of 12,000 events 55.2/52.3/58.2 -> 49.2/48.1/57.2 CPU-s, a catch-up 52.2/51.6 -> 47.8/51.0).
SMALL_DATA := SOCIAL_SPARK_CONF="$${SOCIAL_SPARK_CONF-spark.sql.adaptive.enabled=false spark.sql.codegen.wholeStage=false spark.sql.codegen.factoryMode=NO_CODEGEN spark.databricks.delta.snapshotPartitions=1}" \
	SOCIAL_SPARK_SHUFFLE_PARTITIONS="$${SOCIAL_SPARK_SHUFFLE_PARTITIONS-2}"
# The test brokers get the same flags, and an idle stream looks at the log every 250 ms, not 50:
# an idle speed layer (waiting on an archive, a verify, a restart) then costs its JVM and the
# broker 0.05 of a core instead of 0.14 (1.5 vs 4.3 CPU-s per idle 30 s; SOCIAL_IDLE_POLL_MS).
# Tests check what the state is, not how soon; the benchmarks measure latency with the defaults.
# Every test JVM collects its garbage with the serial collector, not G1: their heaps are small and
# short-lived, and G1's write barriers and concurrent threads cost more than its short pauses save
# (side by side on 2026-11-26, G1 against serial: the unit run 415 -> 360 CPU-s; the stream ==
# replay test 167/185 -> 160/167; the broker restart test 106/92/97 -> 90/86/97). The stack and
# the benchmarks keep G1.
SERIAL_GC := -XX:+UseSerialGC
SHORT_JVM := -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m $(SERIAL_GC)
# The archiver and the analytics run level with everything else, not at nice 10 (their place
# behind the speed layer in the stack, SOCIAL_OFF_PATH_NICE): the tests wait on them, and with the
# integration workers and the unit run keeping both cores busy, a niced archiver (nice 10 on its
# autogroup too) got a sliver of a core: the FLUSHALL test's one archive of 12,000 events took
# 6-9 minutes, and that test went past its 15-minute timeout (2026-11-27). The CPU is the same.
SHORT_JOBS := SOCIAL_SPARK_DRIVER_JAVA_OPTIONS="$${SOCIAL_SPARK_DRIVER_JAVA_OPTIONS-$(SHORT_JVM)}" \
	SOCIAL_OFF_PATH_NICE="$${SOCIAL_OFF_PATH_NICE-0}" \
	SOCIAL_KAFKA_JAVA_OPTIONS="$${SOCIAL_KAFKA_JAVA_OPTIONS-$(SHORT_JVM)}" \
	SOCIAL_IDLE_POLL_MS="$${SOCIAL_IDLE_POLL_MS-250}" \
	$(SMALL_DATA)
# The local run's one JVM (tests/integration/local: a Spark session per module, no broker) keeps C2
# (it lives for minutes), with the serial collector.
LOCAL_JVM := SOCIAL_SPARK_DRIVER_JAVA_OPTIONS="$${SOCIAL_SPARK_DRIVER_JAVA_OPTIONS-$(SERIAL_GC)}"
# The integration files that start a stack go to INTEGRATION_WORKERS pytest-xdist workers (each with
# its own Kafka and Redis, a file at a time, longest first: tests/integration/conftest.py): most of
# their time one JVM at a time waits on a stream, a restart or real time, so one run alone left the
# cores idle.
INTEGRATION_WORKERS ?= 2
INTEGRATION := $(SHORT_JOBS) $(PY) -m pytest tests/integration --ignore=tests/integration/local -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder
# The local run goes beside them; its output follows theirs. On a fresh clone the Spark class archive
# (~45 s, one core: `make setup`) is dumped first in the local run's line, while the xdist run
# starts: its first drivers start without the archive (the driver checks it exists; it appears
# whole, by a rename), and the local run, which checks the archive, starts once it is there. The
# tests began ~45 s later when setup dumped it first (2026-11-26 night: setup 84 s of a 21.2-min run).
LOCAL := ( $(PY) -m social spark class-archive && \
	  $(LOCAL_JVM) $(SMALL_DATA) $(PY) -m pytest tests/integration/local $(PYTEST_ARGS) ) > var/test-local.log 2>&1

# The fast tier first (tests/unit: no JVM, no Go, a real redis-server; under 2 minutes), so a broken
# view fails in minutes; then the integration tier, which takes half an hour.
test: deps ## every test: the fast tier, then the integration tier
	@$(MAKE) --no-print-directory test-fast
	@$(MAKE) --no-print-directory test-integration

# The tests of the opt-in Prometheus (its alert rules, the alert on a live stack) need Debian's
# package, whatever SOCIAL_PROMETHEUS says: fetched once into .tools (infra/prometheus.py); where it
# cannot be, those tests are skipped, saying so, and the rest runs.
# The dashboard's browser test (tests/integration/test_dashboard.py) needs a headless Chromium:
# Debian's chromium-headless-shell, installed with apt-get when none is on PATH (infra/browser.py);
# Playwright's own browser download is not reachable, so it is not an option.
PROMETHEUS_FOR_TESTS := SOCIAL_PROMETHEUS=1 $(PY) -m social ensure-prometheus || \
	echo "prometheus: not installed; the Prometheus tests will be skipped"

test-fast: deps ## the fast tier: every test that needs no JVM and no Go, the property test included (minutes)
	@$(PROMETHEUS_FOR_TESTS)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: deps s3-server ## the integration tier: the stack's tests on INTEGRATION_WORKERS xdist workers, tests/integration/local beside them
	@$(PROMETHEUS_FOR_TESTS)
	@$(PY) -m social ensure-chromium || echo "chromium: not installed; the dashboard's browser test will fail"
	@mkdir -p var
	@$(LOCAL) & local=$$!; \
	$(INTEGRATION) $(PYTEST_ARGS); integration=$$?; \
	wait $$local; local=$$?; \
	echo "=== tests/integration/local (run beside the xdist run, log: var/test-local.log) ==="; \
	cat var/test-local.log; \
	exit $$(( integration || local ))

test-faults: setup ## fault runs on a 3-node Kafka cluster, 60 s each (make test runs them for 10 s) -> var/reports/faults/; a 3-master Redis Cluster's, a master down 30 s (5 s), 10 processor kills (3)
	SOCIAL_FAULT_RUN_S=$${SOCIAL_FAULT_RUN_S:-60} $(SHORT_JOBS) $(PY) -m pytest -m faults tests/integration $(PYTEST_ARGS)
	SOCIAL_REDIS_FAULT_DOWN_S=$${SOCIAL_REDIS_FAULT_DOWN_S:-30} SOCIAL_REDIS_FAULT_KILLS=$${SOCIAL_REDIS_FAULT_KILLS:-10} \
	$(PY) -m pytest -m "faults and redis_cluster" tests/unit $(PYTEST_ARGS)

# The tests that run against a real Redis Cluster (`-m redis_cluster`: the fast tier's and the
# integration tier's), on their own: `make test` runs them in their tiers; this is the subset to run
# after a change to the serving store's clients, layout or copy (docs/testing.md has its time).
test-redis-cluster: deps ## the Redis Cluster subset alone: the fast tier's cluster tests, then the stack's on three masters
	$(PY) -m pytest -m redis_cluster tests/unit $(PYTEST_ARGS)
	$(SHORT_JOBS) $(PY) -m pytest -m redis_cluster tests/integration $(PYTEST_ARGS)

# The property-based differential test as a soak (make test runs it with the CI counts set in the
# test files): PROPERTY_EXAMPLES Hypothesis examples per Redis property (the speed layer against
# the specification), PROPERTY_BATCHES Spark batches of PROPERTY_BATCH logs (replay and batch layer).
PROPERTY_EXAMPLES ?= 2000
PROPERTY_BATCHES ?= 40
PROPERTY_BATCH ?= 60
test-properties: setup ## property-based differential test, longer: PROPERTY_EXAMPLES examples per property (2000), PROPERTY_BATCHES Spark batches of 60 logs (40)
	SOCIAL_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) SOCIAL_PROPERTY_BATCHES=$(PROPERTY_BATCHES) \
	SOCIAL_PROPERTY_BATCH=$(PROPERTY_BATCH) $(SHORT_JOBS) $(PY) -m pytest tests/unit/test_properties.py \
	tests/integration/test_properties.py --timeout=0 $(PYTEST_ARGS)

bench: setup ## side-by-side benchmarks -> var/reports/bench/latest.json
	@$(PY) -m social bench

tail: setup ## the event log, record by record (Kafka's console consumer; TAIL_ARGS=--from-beginning)
	@$(PY) -m social tail $(TAIL_ARGS)

history: setup ## Spark History Server over var/spark-events (finished jobs): http://127.0.0.1:18080
	@$(PY) -m social history

reports: setup ## var/reports/index.html: every report with its time and verdict
	@$(PY) -m social reports

load: setup ## headless Locust run (locust.conf, LOCUST_*); fails when the serving target is missed -> var/reports/load/
	@$(PY) -m social load -- $(LOCUST_ARGS)

load-steps: setup ## step load: where the read target stops holding, plotted -> var/reports/load/steps.html
	@$(PY) -m social load --steps -- $(LOCUST_ARGS)

load-read-heavy: setup ## make load with the read-heavy mix: 50 timeline reads per post (LOAD_PROFILE=read_heavy)
	@LOAD_PROFILE=read_heavy $(PY) -m social load -- $(LOCUST_ARGS)

dual-write: setup ## dual writes (the anti-pattern) vs. the log, same workload and faults -> var/reports/dual_write/
	@$(PY) -m social dual-write $(DUAL_WRITE_ARGS)

compare: setup ## Lambda (batch layer) vs Kappa (replay) on one generated log -> var/reports/compare/
	@$(PY) -m social compare $(COMPARE_ARGS)

erasure-audit: setup ## erase a canary user on a scratch stack, then search every store for it -> var/reports/erasure_audit/
	@$(PY) -m social erasure-audit $(AUDIT_ARGS)

lint: $(STAMP) ## ruff (check, format), the floors (lint-imports: [tool.importlinter] in pyproject.toml), types (mypy: [tool.mypy]), one client factory
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports
	$(PY) -m mypy
	$(PY) -m pytest -q --no-header --durations=0 --durations-min=1 tests/unit/test_clients.py

fmt: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean: down ## remove runtime state (var/); keeps the venv and the jar cache
	rm -rf var
