# The project's commands. Each creates its own virtualenv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/.installed  ## the main job: a governed-call demonstration
	$(BIN)/polygate-celery demo

test: $(BIN)/.installed  ## the test suite (pytest's exit 5, "no tests collected", is not a failure)
	$(BIN)/pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

lint: $(BIN)/.installed  ## ruff and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
