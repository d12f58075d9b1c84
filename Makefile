# The two commands a user needs: `make up` and `make test`. Everything runs from .venv, which
# ops/venv.sh builds from the pinned requirements.lock (reusing a shared install keyed by its hash).

PY := .venv/bin/python
DATA_DIR ?= .resontech
PYTEST_ARGS ?=
LINTED := $(wildcard schemas core projections gateway agent ops tests)

.PHONY: up down test lint bench bench-quick venv clean

venv: .venv/.stamp

.venv/.stamp: requirements.lock ops/venv.sh
	@./ops/venv.sh
	@touch $@

up: venv
	@.venv/bin/resontech --data-dir $(DATA_DIR) up

down: venv
	@.venv/bin/resontech --data-dir $(DATA_DIR) down

test: venv
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy

bench: venv
	$(PY) -m ops.bench.log
	$(PY) -m ops.bench.schedule

bench-quick: venv
	$(PY) -m ops.bench.log --quick
	$(PY) -m ops.bench.schedule --quick

clean:
	rm -rf .venv
