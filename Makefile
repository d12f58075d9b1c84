# The two commands a user needs: `make up` and `make test`. Everything runs from .venv, which
# ops/venv.sh builds from the pinned requirements.lock (reusing a shared install keyed by its hash).

PY := .venv/bin/python
DATA_DIR ?= .resontech
PYTEST_ARGS ?=

.PHONY: up down test test-units test-faults lint bench bench-quick venv system browser web clean

venv: .venv/.stamp

.venv/.stamp: requirements.lock ops/venv.sh
	@./ops/venv.sh
	@touch $@

up: venv system web
	@.venv/bin/resontech --data-dir $(DATA_DIR) up

down: venv
	@.venv/bin/resontech --data-dir $(DATA_DIR) down

# Three workers on two cores: the suite mostly waits on real processes (agents, NVFlare, engines),
# and work stealing keeps the long federated tests from ending up queued behind one another at the
# end. Four kept the load average at 5-6 on a slower day, and tests that wait on an agent's restart or
# a federation's lease then timed out (the same tests fail on the commit before, alone they pass).
TEST_WORKERS ?= 3

test: venv browser web
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not faults" $(PYTEST_ARGS)

# The unit tests alone (everything outside tests/e2e/ and the fault tests): about a minute.
test-units: venv
	$(PY) -m pytest -n 2 -m "not e2e and not faults" $(PYTEST_ARGS)

# Fault injection on a 3-node NATS cluster (tests/e2e/faults/test_cluster_faults.py): two workers,
# each with a cluster of its own; more would only make the nodes' elections slower on two cores.
test-faults: venv
	$(PY) -m pytest -n 2 -m faults $(PYTEST_ARGS)

# Debian packages: bubblewrap (the workloads' sandbox) for everything; Chromium too for the tests (the
# dashboard's browser test drives it through Playwright, with no browser download).
system:
	@./ops/system.sh

browser:
	@./ops/system.sh --browser

# The dashboard's charting library (uPlot) from the npm registry, pinned by ops/web/package-lock.json.
web:
	@./ops/web.sh

lint: venv
	$(PY) -m ruff check schemas core projections gateway agent ops tests examples
	$(PY) -m ruff format --check schemas core projections gateway agent ops tests examples
	$(PY) -m mypy

bench: venv system
	$(PY) -m ops.bench.log
	$(PY) -m ops.bench.schedule
	$(PY) -m ops.bench.gateway
	$(PY) -m ops.bench.training
	$(PY) -m ops.bench.inference
	$(PY) -m ops.bench.sandbox

bench-quick: venv system
	$(PY) -m ops.bench.log --quick
	$(PY) -m ops.bench.schedule --quick
	$(PY) -m ops.bench.gateway --quick
	$(PY) -m ops.bench.training --quick
	$(PY) -m ops.bench.sandbox --quick

clean:
	rm -rf .venv
