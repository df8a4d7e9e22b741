# The README's commands. Everything installs into .venv; nothing global is touched.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shardlab-installed
DEVICES ?= cpu:8
PYTEST_ARGS ?=
# two workers (pytest-xdist): a test file each, the browser and notebook tests as one unit
PYTEST_WORKERS ?= 2
LAB_ARGS ?=
# the Python the linters check: the package, the benchmarks and model zoo at the root, the tests
LINTED := python benchmarks examples tests
# JupyterLab refuses to run as root without this (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# The JupyterLab extension: TypeScript in labextension/, built with jlpm (JupyterLab's yarn,
# in the venv) into the Python package, from where the wheel ships it.
LABEXT := python/shardlab/labextension
LABEXT_SOURCES := package.json tsconfig.json $(wildcard yarn.lock) \
	$(shell find labextension -type f -not -name '*.test.ts' 2>/dev/null)
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/shardlab
JLPM := PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jlpm
HAVE_NODE = $(shell command -v node >/dev/null 2>&1 && echo yes)

.PHONY: setup browser lab test test-js lint format bench clean labextension node

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# the build backend and JupyterLab (for jlpm) first: the extension is built before the
	@# package is installed, so that the install finds it
	$(BIN)/python -m pip install --quiet -c constraints.txt hatchling editables hatch-jupyter-builder jupyterlab
	$(MAKE) labextension
	@# pip removes the files of a previous install through the develop link: drop the link
	test ! -L $(LABEXT_LINK) || rm $(LABEXT_LINK)
	@# built above (or skipped without Node.js): the install's build hook has nothing to do
	SKIP_JUPYTER_BUILDER=1 $(BIN)/python -m pip install --quiet -c constraints.txt \
		--no-build-isolation -e ".[dev]"
	touch $(STAMP)

## set-up: venv, package (editable) with dev extras, the lab extension, the shardlab kernelspec
setup: $(STAMP) labextension
	@# Lab loads the extension from the build output (as `jupyter labextension develop`
	@# links it): a rebuild needs no reinstall
	test ! -f $(LABEXT)/package.json || test -L $(LABEXT_LINK) || \
		{ rm -rf $(LABEXT_LINK) && mkdir -p $(dir $(LABEXT_LINK)) && ln -s "$(CURDIR)/$(LABEXT)" $(LABEXT_LINK); }
	$(BIN)/python -m shardlab install --sys-prefix --name shardlab --devices $(DEVICES)

## Node.js (Debian's, as root) for the extension build
node:
	bash tools/install-node.sh

## the lab extension, rebuilt when its sources changed (skipped, with a warning, without Node.js)
labextension: node
	@$(MAKE) --no-print-directory $(if $(HAVE_NODE),$(LABEXT)/install.json,labextension-skipped)

$(LABEXT)/install.json: $(LABEXT_SOURCES)
	$(JLPM) install
	$(JLPM) run build
	touch $@

.PHONY: labextension-skipped
labextension-skipped:
	@echo "make: Node.js not found; the JupyterLab extension is not built (run tools/install-node.sh as root)" >&2

## the extension's TypeScript unit tests (labextension/test, vitest)
test-js: labextension
	@if [ -x node_modules/.bin/vitest ]; then $(JLPM) test; \
	elif [ -n "$$CI" ]; then echo "test-js: node_modules missing in CI" >&2; exit 1; \
	else echo "test-js: skipped (no Node.js, the extension is not built)" >&2; fi

## JupyterLab on notebooks/ with the shardlab kernel (8 simulated CPU devices by default)
lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) \
		--MappingKernelManager.default_kernel_name=shardlab $(LAB_ARGS)

## Debian's chromium for the browser tests (tests/browser); installs only as root, else they skip
browser:
	bash tools/install-browser.sh

## lint, then every test
test: setup lint browser test-js
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=25 $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/pyright

format: setup
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

## benchmarks (benchmarks/, run from the root: not part of the package); writes docs/benchmarks.md
bench: setup
	$(BIN)/python -m benchmarks --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-artifacts node_modules lib tsconfig.tsbuildinfo $(LABEXT)
