# krex top-level build.
#   make          build the C parts (shim, gate library, fake driver for tests)
#   make test     set up the virtualenv, build, run the test suite
#   make demo     set up, build, run the main job (short replay; fake driver without a GPU)
#   make packages build the .deb and .rpm into build/pkg/
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CUDA_INCLUDE ?= /usr/local/cuda/include
export CUDA_INCLUDE

.PHONY: all shim shim-tests fakecuda venv check test demo packages clean

all: shim fakecuda

shim:
	$(MAKE) -C libkrex_shim

# The shim, the gate library and the C programs of tests/shim.
shim-tests:
	$(MAKE) -C libkrex_shim tests

fakecuda:
	$(MAKE) -C tests/fakecuda

$(PY):
	$(PYTHON) -m venv $(VENV)

venv: $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'

test: venv all
	$(PY) -m pytest

demo: venv all
	$(PY) -m krexd.demo

packages: all
	packaging/build.sh

clean:
	rm -rf build
