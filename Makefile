# Two commands for a newcomer: `make demo` and `make test`.
# Everything is installed into .venv; downloads (pip, Go modules) and the built
# control-plane binaries are cached outside the repository (~/.cache).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Optional: a PyTorch CPU wheel index (e.g. in a Docker build). When unset, torch comes
# from the default index.
TORCH_INDEX ?= $(FLEETTUNE_TORCH_INDEX)

.PHONY: install demo test lint unit integration clean

# The operator package with its test tools, and the development tools (dev/: local cluster,
# simulator, demo, benchmarks), a distribution of their own that the operator image leaves out.
$(VENV)/.installed: pyproject.toml dev/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet torch --index-url $(TORCH_INDEX),)
	$(PY) -m pip install --quiet -e '.[dev]' -e ./dev
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/fleettune demo

# The static checks, quiet when clean: style (ruff), the layer contracts (import-linter,
# [tool.importlinter] in pyproject.toml), the types of the runtime package (mypy, [tool.mypy]) and
# the documentation site (mkdocs.yml: a broken link or anchor between its pages fails the build).
lint: install
	@$(VENV)/bin/ruff check --quiet .
	@out=$$($(VENV)/bin/lint-imports --no-logo 2>&1) || { printf '%s\n' "$$out"; exit 1; }
	@$(VENV)/bin/mypy --no-error-summary
# (mkdocs without --quiet: --quiet drops the warnings before --strict counts them, so nothing fails.)
	@out=$$(NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .cache/site 2>&1) || \
		{ printf '%s\n' "$$out"; exit 1; }

# Two workers: the integration tests (one control plane) in one, the unit tests beside them
# (tests/conftest.py).
test: lint
	$(PY) -m pytest -n 2

unit: install
	$(PY) -m pytest tests/unit

integration: install
	$(PY) -m pytest tests/integration

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .grimp_cache .cache/site
