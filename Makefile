# The two commands that set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Each target installs the extras it needs: a demo-only venv stays small (no DALI, Ray, ...).
DEMO_EXTRAS ?= demo
TEST_EXTRAS ?= test
BENCH_EXTRAS ?= bench,ray,dali

.PHONY: demo test test-gpu docs lint bench clean

# $(VENV)/.installed-<extras>: the package installed editable with those extras.
# Torch is installed only when the venv has none, so an existing (CUDA) build is kept;
# it is pinned because an unpinned resolve pulls several GB of CUDA packages. The extras are
# then installed against a constraint on the torch that is there, so that no extra (e.g.
# torchvision, which pins one torch release) can replace it.
$(VENV)/.installed-%: pyproject.toml setup.py fastdata/_lookup.c Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[$*]"
	touch $@

# Everything the test suite needs (other targets may depend on this one stamp).
$(VENV)/.installed: $(VENV)/.installed-$(TEST_EXTRAS)
	touch $@

demo: $(VENV)/.installed-$(DEMO_EXTRAS)
	$(PY) tools/demo.py

test: $(VENV)/.installed-$(TEST_EXTRAS)
	$(VENV)/bin/ruff check fastdata tests tools benchmarks examples
	$(VENV)/bin/ruff format --check fastdata tests tools benchmarks examples
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) -m pytest -q

# The `gpu`-marked tests of the whole tree, on a machine with CUDA. Installs nothing and needs
# no registry: it runs with the Python that already has a CUDA build of torch (and
# torchvision for nvJPEG), this checkout first on PYTHONPATH, and reports in one line each
# what is present and what is absent (absent optional packages: their tests skip).
#   make test-gpu PY=python3            # e.g. the system Python of a GPU machine
#   make test-gpu                       # .venv/bin/python if there is one, else python3
# GPU_TEST_ARGS: pytest paths/options; "--allow-cpu" runs the same path without CUDA (a dry
# run where every gpu test skips). For the extras, where a registry is reachable:
# `make .venv/.installed-test,gpu` then `make test-gpu`.
GPU_PY = $(if $(filter command line,$(origin PY)),$(PY),$(if $(wildcard $(PY)),$(PY),$(PYTHON)))
GPU_TEST_ARGS ?=
test-gpu:
	$(GPU_PY) tools/gpu_tests.py $(GPU_TEST_ARGS)

# The documentation site (mkdocs.yml: guides in docs/, API reference from the docstrings) into
# site/; --strict fails on a broken reference, a page missing from the nav or a docstring warning.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

lint: $(VENV)/.installed-$(TEST_EXTRAS)
	$(VENV)/bin/ruff check fastdata tests tools benchmarks examples
	$(VENV)/bin/ruff format --check fastdata tests tools benchmarks examples
	$(VENV)/bin/mypy

# Each run writes benchmarks/results/runs/ (git-ignored); `make bench BENCH_ARGS=--publish`
# also replaces the tracked benchmarks/results/*.json the README quotes.
BENCH_ARGS ?=
bench: $(VENV)/.installed-$(BENCH_EXTRAS)
	for b in benchmarks/bench_*.py; do $(PY) $$b $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
