# The two commands: `make demo` and `make test`. Each creates .venv if missing and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck bench install clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
		echo "error: metaroles needs Python >= 3.11 (found: '$(PYTHON)'); run make PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/metaroles run debate

lint: $(STAMP)
	$(BIN)/ruff check metaroles actions environments scenarios tests bench
	$(BIN)/ruff format --check metaroles actions environments scenarios tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/bus.py

clean:
	rm -rf $(VENV) runs build *.egg-info
