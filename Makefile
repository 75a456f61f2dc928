# holmes_ml: two commands set everything up on a fresh machine.
#   make demo   create .venv, install, simulate a faulty job, localize it, print the verdict
#   make test   install dev extras and run the whole suite (lint + types + tests + notebooks)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HOLMES := $(VENV)/bin/holmes

.PHONY: demo test lint typecheck bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e .
	touch $@

# torch==2.13.0 is the CPU build (a local wheel here); any other spec pulls a multi-GB CUDA build.
$(VENV)/.dev-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install --quiet -e ".[dev]"
	$(PIP) install --quiet torch==2.13.0
	touch $@

demo: $(VENV)/.installed
	$(HOLMES) demo --out demo-out

test: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check holmes_ml tests scripts
	$(VENV)/bin/mypy holmes_ml
	$(VENV)/bin/pytest -n 2 --durations=15 --doctest-modules --nbmake -m "not drill" holmes_ml tests notebooks
	$(VENV)/bin/pytest --durations=5 -m drill tests

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check holmes_ml tests scripts
	$(VENV)/bin/ruff format --check holmes_ml tests || true

typecheck: $(VENV)/.dev-installed
	$(VENV)/bin/mypy holmes_ml

bench: $(VENV)/.installed
	$(HOLMES) bench all --out bench-results

bench-quick: $(VENV)/.installed
	$(HOLMES) bench all --quick --out bench-results

clean:
	rm -rf $(VENV) demo-out bench-results .pytest_cache .ruff_cache .mypy_cache
