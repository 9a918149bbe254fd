# The project's commands, in one virtualenv made on first use. `make demo` installs what
# the demo needs (the `demo` extra); every other command, the development tools (`dev`).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-unit lint docs docs-check bench soak mutate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

$(BIN)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $@

# The development install holds the demo extra: the demo runs in it when it is there.
DEMO_INSTALL := $(if $(wildcard $(BIN)/.installed),$(BIN)/.installed,$(BIN)/.installed-demo)

demo: $(DEMO_INSTALL)  ## the main job: a governed-call demonstration (installs the demo extra alone)
	$(BIN)/polygate-celery demo

# --durations=15: the slowest tests, named at the end. They are the long, quiet stretch near
# the end of a run: few tests are left, each of them long.
test: $(BIN)/.installed  ## the test suite (pytest's exit 5, "no tests collected", is not a failure)
	$(BIN)/pytest -n 4 --dist loadfile --durations=15; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# The unit tier alone: the decision core, the governance loop, the stores and the CLI. Spread
# test by test over two processes (--dist load): one file's slow tests do not hold one worker.
test-unit: $(BIN)/.installed  ## the unit tests only (tests/unit), the fast check while working
	$(BIN)/pytest -n 2 --dist load --durations=5 tests/unit

docs: $(BIN)/.installed  ## the documentation site, built strictly into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Needs Debian's Chromium (apt-get install -y chromium); not part of .ci/run.
docs-check: docs  ## the built site in headless Chromium: pages, navigation, search, no console error; screenshots to docs/screenshots/
	$(BIN)/python tests/docs/browser_check.py --site site --out docs/screenshots

bench: $(BIN)/.installed  ## goodput against autoretry_for, tenacity and the openai client's retries (~30 min)
	$(BIN)/python benchmarks/goodput.py

SOAK_TESTS = tests/integration/test_fleet_cap.py tests/integration/test_fleet_reclaim.py \
             tests/integration/test_fleet_wakeups.py \
             tests/celery/test_worker_processes.py tests/celery/test_outage_run.py \
             tests/celery/test_redis_faults.py tests/celery/test_matrix.py \
             tests/celery/test_outage_recovery.py

soak: $(BIN)/.installed  ## heavy fault trials at full size (~1 h); writes benchmarks/results/soak.md and fleet.md
	POLYGATE_SOAK=1 $(BIN)/pytest -p no:cacheprovider -s --timeout 3600 $(SOAK_TESTS)
	$(BIN)/python benchmarks/fleet.py > benchmarks/results/fleet.md

MUTMUT_JOBS ?= 2

# PYTEST_TIMEOUT: a test that a mutant sends into an endless wait fails after 30 s (the
# slowest selected test takes about 3 s) instead of holding a worker for mutmut's timeout.
mutate: $(BIN)/.installed  ## named rules broken alone (~15 min), then mutmut over core/, governance/ and celery/ (~40 min); writes benchmarks/results/mutations.md and mutmut.md
	$(BIN)/python -m tests.mutation.rules; rules=$$?; \
	rm -rf mutants; \
	PYTEST_TIMEOUT=30 POLYGATE_TEST_REDIS=private $(BIN)/mutmut run --max-children $(MUTMUT_JOBS) \
	  && $(BIN)/python -m tests.mutation.mutmut_report; tool=$$?; \
	[ $$rules -eq 0 ] && [ $$tool -eq 0 ]

lint: $(BIN)/.installed  ## ruff and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
