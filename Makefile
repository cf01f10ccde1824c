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

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet torch --index-url $(TORCH_INDEX),)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/fleettune demo

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

unit: install
	$(PY) -m pytest tests/unit

integration: install
	$(PY) -m pytest tests/integration

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
