# krex top-level build.
#   make          build the C parts (shim, gate library, fake driver for tests)
#   make test     set up the virtualenv, build, run the test suite
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
AS_ROOT ?= $(shell [ "$$(id -u)" = 0 ] || ! command -v sudo >/dev/null 2>&1 || echo sudo)
CUDA_INCLUDE ?= /usr/local/cuda/include
export CUDA_INCLUDE

.PHONY: all shim fakecuda venv test demo packages clean

all: shim fakecuda

shim:
	$(MAKE) -C libkrex_shim

fakecuda:
	$(MAKE) -C tests/fakecuda

$(PY):
	$(PYTHON) -m venv $(VENV)

venv: $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'

test: venv all
	$(AS_ROOT) $(abspath $(PY)) -m pytest

demo: venv all
	$(AS_ROOT) $(abspath $(PY)) -m krex_cli.demo

packages: all
	packaging/build.sh

clean:
	rm -rf build
