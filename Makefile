# krex top-level build.
#   make          build the C parts (shim, gate library, fake CUDA driver and HIP runtime for tests)
#   make check    the fast lane: ruff, ruff format --check, mypy --strict and the tests
#                 that need neither root, a GPU nor a built C part (no build; under a minute)
#   make test     make check, then build and run every other test (CI runs this)
#   make demo     set up, build, run the main job (short replay; fake driver without a GPU)
#   make packages build the .deb and .rpm into build/pkg/
# The same commands work as root (nothing escalates) and as a user who may use sudo: the
# venv and the build stay the caller's, and only the steps that start krexd (it manages
# cgroups) run through $(AS_ROOT), which is sudo when not root and sudo exists, else empty
# (the demo then says it needs root; tests that need root are skipped).  `AS_ROOT=` forces
# an unprivileged run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Installed once per change of pyproject.toml (which lists ruff, mypy and pytest).
STAMP  := $(VENV)/.krex-installed
# The fast lane's tests: a test is needs_build when it uses a build fixture
# (tests/conftest.py); `make test` runs the complement after building.
FAST   := not root and not gpu and not needs_build and not slow
AS_ROOT ?= $(shell [ "$$(id -u)" = 0 ] || ! command -v sudo >/dev/null 2>&1 || echo sudo)
CUDA_INCLUDE ?= /usr/local/cuda/include
# Test processes of `make test` (pytest-xdist, a file per process at a time): the suite
# mostly waits on krexd and simulated kernels, so 3 fill two cores. Tests marked
# `serial` (the package-system tests' OS image, a Ray cluster, the attack witness)
# run afterwards, alone.
TEST_WORKERS ?= 3
export CUDA_INCLUDE

.PHONY: all shim shim-tests fakecuda fakehip venv check test demo packages clean

all: shim fakecuda fakehip

shim:
	$(MAKE) -C libkrex_shim

# The shim, the gate library and the C programs of tests/shim.
shim-tests:
	$(MAKE) -C libkrex_shim tests

fakecuda:
	$(MAKE) -C tests/fakecuda

# The fake HIP runtime links the fake CUDA driver's objects: built after it.
fakehip: fakecuda
	$(MAKE) -C tests/fakehip

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

check: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -m '$(FAST)'

test: check all shim-tests
	$(AS_ROOT) $(abspath $(PY)) -m pytest -m 'not ($(FAST)) and not serial' -n $(TEST_WORKERS) --dist loadfile --durations=15
	$(AS_ROOT) $(abspath $(PY)) -m pytest -m 'not ($(FAST)) and serial' --durations=5

demo: venv all
	$(AS_ROOT) $(abspath $(PY)) -m krex_cli.demo

packages: all
	packaging/build.sh

clean:
	rm -rf build
