# The two commands that set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
EXTRAS ?= test,bench,ray

.PHONY: demo test test-gpu lint bench clean

# Torch is installed only when the venv has none, so an existing (CUDA) build is kept;
# it is pinned because an unpinned resolve pulls several GB of CUDA packages.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: $(VENV)/.installed
	$(PY) tools/demo.py

test: $(VENV)/.installed
	$(VENV)/bin/ruff check fastdata tests tools benchmarks
	$(VENV)/bin/ruff format --check fastdata tests tools benchmarks
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) -m pytest -q

# Only the `gpu`-marked tests, on a machine with CUDA (the venv needs a CUDA build of torch).
test-gpu: $(VENV)/.installed
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'test-gpu: no CUDA device')"
	$(PY) -m pytest -q -m gpu

# The documentation site (mkdocs.yml: guides in docs/, API reference from the docstrings) into
# site/; --strict fails on a broken reference, a page missing from the nav or a docstring warning.
.PHONY: docs
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check fastdata tests tools benchmarks
	$(VENV)/bin/ruff format --check fastdata tests tools benchmarks
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
