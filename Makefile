# The README's commands. Everything installs into .venv; nothing global is touched.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shardlab-installed
DEVICES ?= cpu:8
PYTEST_ARGS ?=
LAB_ARGS ?=
# JupyterLab refuses to run as root without this (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup browser lab test lint format bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

## set-up: venv, package (editable) with dev extras, and the shardlab kernelspec in the venv
setup: $(STAMP)
	$(BIN)/python -m shardlab install --sys-prefix --name shardlab --devices $(DEVICES)

## JupyterLab on notebooks/ with the shardlab kernel (8 simulated CPU devices by default)
lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) \
		--MappingKernelManager.default_kernel_name=shardlab $(LAB_ARGS)

## Debian's chromium for the browser tests (tests/browser); installs only as root, else they skip
browser:
	bash tools/install-browser.sh

## lint, then every test
test: setup lint browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check python tests
	$(BIN)/ruff format --check python tests
	$(BIN)/pyright

format: setup
	$(BIN)/ruff format python tests
	$(BIN)/ruff check --fix python tests

## benchmarks; writes docs/benchmarks.md
bench: setup
	$(BIN)/python -m shardlab.bench --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-artifacts
