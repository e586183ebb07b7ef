# Attention as Transport -- the two commands a newcomer runs:
#   make book   set up .venv (once), execute every lab, build the HTML into _build/html
#   make test   same set-up and a browser, then every check CI runs (lint, unit tests, labs, book, browser)
# Both are idempotent: the venv is reused until requirements*.txt or pyproject.toml change.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
# On CPU machines torch must be installed before anything that depends on it, or pip pulls the
# multi-GB CUDA build. Override on a GPU machine, e.g. `make book TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
HTML     := _build/html

# Without a GPU, run the Triton kernels through Triton's interpreter (tests and labs use small shapes).
HAS_GPU  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
# The versions the checks run with and the committed compile results were made with (constraints.txt);
# a GPU machine keeps the torch and triton it has.
CONSTRAINTS ?= $(if $(HAS_GPU),,-c constraints.txt)
KERNEL_ENV := $(if $(HAS_GPU),,TRITON_INTERPRET=1)
# Notebooks executed here (the labs run, the book build) show no tqdm bars: the built pages would keep them as
# text. tqdm (>= 4.66) reads TQDM_DISABLE when it is imported; a reader running a lab still sees them.
NB_ENV   := $(KERNEL_ENV) TQDM_DISABLE=1
PIP      := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: help install book test check-artifacts artifacts lint unit checks notebooks labs site-assets book-build browser-setup browser bench seeds clean

help:
	@echo "make book   -- build the book into $(HTML) (creates $(VENV) if missing)"
	@echo "make test   -- lint, unit tests, every lab once, book build (-W), browser check"
	@echo "make bench  -- every GPU benchmark, fwd and fwd+bwd (writes benchmarks/results/*.json)"
	@echo "make seeds  -- every lab over seeds 0-4 with a CPU-bound process beside it (slow)"

$(PY):
	python3 -m venv $(VENV)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml attnlib/pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(CONSTRAINTS) "$(TORCH_SPEC)"
	$(PIP) $(CONSTRAINTS) -r requirements-dev.txt
	$(PIP) --no-deps -e ./attnlib -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(STAMP)

book: install labs book-build
	@echo
	@echo "The book is built: open $(abspath $(HTML))/index.html"

# Every lab executed once, into the book's execution cache (_build/.jupyter_cache), which the book build
# then renders instead of executing the labs again. `make test` runs them through nbval, two at a time
# (notebooks/conftest.py stores what nbval executed; the cache starts empty); `make book` through
# execute_labs.py (in scripts/), which skips labs already cached. Either way the cache is emptied when
# attnlib, the committed results or the packages change, so a page never shows numbers from older code.
JOBS     ?= $(if $(HAS_GPU),1,2)
notebooks: install
	$(NB_ENV) $(VENV)/bin/pytest --nbval-lax -p no:cacheprovider -n $(JOBS) --dist loadfile notebooks \
	  --lab-cache --fresh-lab-cache

labs: install
	$(NB_ENV) $(PY) scripts/execute_labs.py

# plotly.js and MathJax, served once for the whole site from book/_static/
site-assets: install
	$(PY) scripts/site_assets.py

# --all: Sphinx re-reads every page, so pages take the cache's new outputs even when no source changed
# (the HTML from the cached outputs takes seconds).
book-build: site-assets
	$(NB_ENV) $(VENV)/bin/jupyter-book build . --all --warningiserror --keep-going

# The committed compile results (the kernel report, the register counts, every autotuning candidate run):
# `check-artifacts` says in a second whether each is of this code and these versions (the first step of
# `make test`); `artifacts` makes the stale ones again -- tens of CPU-minutes -- to commit with a kernel change.
check-artifacts: install
	$(PY) -m benchmarks._artifacts

artifacts: install
	$(PY) -m benchmarks._artifacts --regenerate

lint: install
	$(VENV)/bin/ruff check attnlib tests benchmarks scripts notebooks conftest.py
	$(VENV)/bin/actionlint .github/workflows/*.yml

unit: install
	HYPOTHESIS_PROFILE=ci $(VENV)/bin/pytest -p no:cacheprovider -n $(JOBS) --dist loadfile tests

# `make test`'s middle step: the unit tests and every lab in one pytest run, so that the two workers share
# the cores to the end (a file or lab at a time each, the costliest first: conftest.py); the labs read
# their committed training runs (ATTNBOOK_RUNS=require: a stale one fails, naming the command) and go into
# the book's execution cache as `notebooks` puts them. The JUnit file feeds scripts/test_budget.py.
checks: install
	$(NB_ENV) HYPOTHESIS_PROFILE=ci ATTNBOOK_RUNS=require $(VENV)/bin/pytest --nbval-lax -p no:cacheprovider \
	  -n $(JOBS) --dist loadfile --no-loadscope-reorder tests notebooks --lab-cache --fresh-lab-cache \
	  -o junit_family=xunit1 --junitxml=_build/test_budget/checks.xml --durations=15

# A Chromium for the browser check: on PATH, or Playwright's; installed when missing (the system
# package as root with apt, else Playwright's installer), or one line naming the command to run.
browser-setup: install
	@$(PY) scripts/browser_check.py --install-browser

browser: install
	$(PY) scripts/browser_check.py $(HTML) --jobs $(JOBS)

# Each step timed by scripts/test_budget.py, which prints where the time went against the budget (10 minutes
# on two cores) at the end, passed or not. The committed results are checked first: a kernel change whose
# results were not made again fails here, in seconds, naming `make artifacts`.
BUDGET   := $(PY) scripts/test_budget.py
TEST_STEPS := check-artifacts browser-setup lint checks book-build browser

test: install
	@$(BUDGET) begin
	@status=0; for step in $(TEST_STEPS); do \
	  $(BUDGET) step $$step -- $(MAKE) --no-print-directory $$step || { status=1; break; }; \
	done; \
	$(BUDGET) report; \
	if [ $$status = 0 ]; then echo "make test: all checks passed"; else echo "make test: FAILED at $$step"; fi; \
	exit $$status

# Every benchmark script in turn ([i/n] here, a tqdm bar over the shapes inside each); each writes its JSON
# into benchmarks/results/ after every shape, so a run cut short keeps what it measured.
BENCHMARKS := $(sort $(filter-out benchmarks/_%,$(wildcard benchmarks/*.py)))

bench: install
	@n=$(words $(BENCHMARKS)); i=0; \
	for script in $(BENCHMARKS); do \
	  i=$$((i + 1)); echo "[bench $$i/$$n] $$script"; \
	  $(PY) $$script; \
	done

# Every lab's asserts must hold on any seed and on a busy machine: run each over seeds 0-4 (via
# ATTNBOOK_SEED) with one busy-looping process beside it, and print a pass/fail table.
seeds: install
	$(PY) scripts/check_seeds.py --seeds 0-4 --burners 1

clean:
	rm -rf _build .pytest_cache .hypothesis
