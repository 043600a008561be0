# Developer entry points. `make test` on a fresh checkout creates .venv, installs the project
# with pinned versions, downloads the Delta Lake jars once (Maven), then runs pytest.

PYTHON      ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test demo clean distclean

# Reinstall only when the venv is missing or the pins changed.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -c constraints.txt -e '.[all,dev]'
	touch $@

setup: $(STAMP)
	$(PY) -c "from checkpoint_lib.spark.jars import setup_main; raise SystemExit(setup_main())"
	$(PY) -m pip check

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/ckpt demo

# Build and run leftovers; keeps .venv and the downloaded jars.
clean:
	rm -rf spark-warehouse metastore_db derby.log .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also the venv, its egg-info and the jar cache: the next `make setup` starts from scratch.
distclean: clean
	rm -rf $(VENV) .cache *.egg-info
