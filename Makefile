# Developer entry points. `make test` on a fresh checkout creates .venv, installs the project
# with pinned versions, downloads the Delta Lake jars once (HTTPS, checksums pinned), then runs pytest.

PYTHON      ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test test-all demo bench bench-quick bench-profile bench-growth chaos neighbours airflow clean distclean

# Reinstall only when the venv is missing or the pins changed.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# uv installs the same pins as pip in half the time (parallel downloads and unpacking); pip
	# is the fallback wherever uv cannot run or reach the index (pip's find-links, say). Both leave
	# every module compiled (uv: --compile-bytecode), so no process compiles its imports again,
	# even where PYTHONDONTWRITEBYTECODE keeps Python from caching what it compiles: without it an
	# Airflow task or a `ckpt run` spent seconds compiling Airflow, GX, pandas and PySpark at each start.
	$(PY) -m pip install -q -c constraints.txt uv && $(VENV)/bin/uv pip install --python $(PY) --compile-bytecode \
		-c constraints.txt -e '.[all,dev]' || $(PY) -m pip install -c constraints.txt -e '.[all,dev]'
	touch $@

setup: $(STAMP)
	$(PY) -m compileall -q checkpoint_lib plugins dags > /dev/null  # ours too (the editable install's source)
	$(PY) -c "from checkpoint_lib.spark.jars import setup_main; raise SystemExit(setup_main())"
	$(PY) -m pip check

# Two pytest workers (pytest-xdist), each with its own SparkSession, each file's tests on one worker
# (its module fixtures built once): a small Spark job keeps about one core busy, so on 2 cores two
# workers run the CI tier in about 21 minutes of pytest where one took 41 (fresh clones, 2026-12-02).
# TEST_WORKERS=0 runs everything in this one process.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Every test, the ones marked slow included (CI runs `make test`).
test-all: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m '' $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/ckpt demo

# The side-by-side benchmarks (bench/compare.py): the tables of docs/benchmarks.md, regenerated.
# bench-quick (100k events, every section small) takes a few minutes on an idle machine; bench (1M, 5M,
# 20M events, the 1M-event enrichment graph, recovery, state growth to 5M accounts, the 5M-event cluster
# run, the warehouse on S3, 1M payments into PostgreSQL) takes hours. Skip a section with
# BENCH_ARGS=--skip-enrichment / --skip-recovery / --skip-state / --skip-cluster / --skip-object-store /
# --skip-postgres; a run that stopped goes on with BENCH_ARGS=--resume (bench/results.jsonl keeps every
# measured row).
BENCH_ARGS ?=
bench: setup
	$(PY) bench/compare.py --docs docs/benchmarks.md $(BENCH_ARGS)

bench-quick: setup
	$(PY) bench/compare.py --quick $(BENCH_ARGS)

# Where a step's time goes (bench/profile_step.py): every role's work timed on one run, outputs checked.
PROFILE_ARGS ?=
bench-profile: setup
	$(PY) bench/profile_step.py $(PROFILE_ARGS)

# Growth over 1,000 simulated hourly checkpoints, with and without `ckpt maintain` (bench/growth.py,
# no Spark, about 15 min): the Growth table of docs/reliability.md, regenerated.
bench-growth: setup
	$(PY) bench/growth.py --docs docs/reliability.md

# The chaos suite and hostile inputs (tests/chaos/run_chaos.py): the figures of docs/reliability.md,
# regenerated. 3-8 min per run on 2 cores (24 by default; CHAOS_ARGS="--jobs 2" runs two at once); an
# interrupted run continues where it stopped.
CHAOS_ARGS ?=
chaos: setup
	$(PY) tests/chaos/run_chaos.py --docs docs/reliability.md $(CHAOS_ARGS)

# The lakehouse-neighbours matrix (tests/run_neighbours.py): what other tools do to our tables, at every
# moment; rewrites its section of docs/reliability.md. About 60 min for the 135 cells on 2 cores; an
# interrupted run continues where it stopped (NEIGHBOURS_ARGS="--fresh" after a code change).
NEIGHBOURS_ARGS ?=
neighbours: setup
	$(PY) tests/run_neighbours.py --docs docs/reliability.md $(NEIGHBOURS_ARGS)

# Airflow natively (scheduler, dag-processor, triggerer, api-server on :8080, SQLite), with this
# repo's dags/ and plugins/. Log in with the password Airflow prints (and keeps in
# $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated); nothing is baked in.
AIRFLOW_HOME ?= $(CURDIR)/.airflow
CKPT_WAREHOUSE ?= $(CURDIR)/warehouse
airflow: setup
	AIRFLOW_HOME=$(AIRFLOW_HOME) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__CORE__PARALLELISM=4 CKPT_WAREHOUSE=$(CKPT_WAREHOUSE) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	$(VENV)/bin/airflow standalone

# Build and run leftovers; keeps .venv and the downloaded jars.
clean:
	rm -rf spark-warehouse metastore_db derby.log .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also the venv, its egg-info and the jar cache: the next `make setup` starts from scratch.
distclean: clean
	rm -rf $(VENV) .cache *.egg-info
