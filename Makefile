# krex top-level build.
#   make          build the C parts (shim, gate library, fake CUDA driver and HIP runtime for tests)
#   make check    the fast lane: ruff, ruff format --check, mypy --strict and the tests
#                 that need neither root, a GPU nor a built C part (no build; under a minute)
#   make test     make check, then build and run every other test but the package-system
#                 ones: installs nothing; outside the checkout only temporary files,
#                 krexd's cgroups and sockets (removed) and ~/.cache/krex (the developer's)
#   make test-packages  the package-system tests (marker `packages`): installs what they
#                 need with apt (packaging/install-build-deps.sh --test --hip), builds the
#                 .deb and .rpm, a Debian 12 root with mmdebstrap, and boots it (root)
#   make ci       make test, then make test-packages (CI runs this: .ci/run)
#   make demo     set up, build, run the main job (short replay; fake driver without a GPU)
#   make packages build the .deb and .rpm into build/pkg/
# The same commands work as root (nothing escalates) and as a user who may use sudo: the
# venv and the build stay the caller's, and only the steps that start krexd (it manages
# cgroups) or install packages run through $(AS_ROOT), which is sudo when not root and the
# user may use sudo (below), else empty (the demo and the package tests then say in one
# line, first, that they need root; the other tests that need root are skipped).
# `AS_ROOT=` forces an unprivileged run.  Whatever a root step leaves in the checkout
# owned by root goes back to the checkout's owner (root_step), so it stays the user's.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Installed once per change of pyproject.toml (which lists ruff, mypy and pytest).
STAMP  := $(VENV)/.krex-installed
# The fast lane's tests: a test is needs_build when it uses a build fixture
# (tests/conftest.py); `make test` runs the complement after building.
FAST   := not root and not gpu and not needs_build and not slow and not packages
# A user "may use sudo" when sudo runs for them without a password now (NOPASSWD, or
# credentials cached) or they are in the group sudoers usually names (sudo, wheel, admin):
# sudo being installed is not enough.
ifeq ($(origin AS_ROOT),undefined)
AS_ROOT := $(shell if [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && \
	{ sudo -n true 2>/dev/null || id -Gn | grep -qwE 'sudo|wheel|admin'; }; then echo sudo; fi)
endif
# Empty when this make can run root steps (root, or sudo to run them through).
NO_ROOT := $(shell [ "$$(id -u)" = 0 ] || [ -n "$(AS_ROOT)" ] || echo 1)
NO_ROOT_TESTS := make test: not root and no sudo: the tests that need root (krexd, cgroups) are skipped, with that reason
# Python's bytecode and pytest's rewritten test modules go to build/pycache, never beside
# the sources: a test run's every krexd, krex and test process would otherwise compile
# what it imports afresh (half the fast lane's CPU time where bytecode is not written).
PYENV = env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache
# A root step: $(call root_step,CMD) runs CMD through $(AS_ROOT) (bytecode to build/pycache),
# then (also when it fails or is interrupted) hands what it left in the checkout owned by
# root back to the checkout's owner: pytest's cache, build/pycache, build/pkg,
# build/pkgtest, a rebuilt C part.  Not the unpacked Debian root KREX_PKGTEST_KEEP=1 keeps,
# which is root's.
GIVE_BACK = o=$$(stat -c %u:%g .); [ "$${o%%:*}" = 0 ] || [ -n "$(NO_ROOT)" ] || \
	$(AS_ROOT) find . -xdev -path ./build/pkgtest/root -prune -o -user 0 -exec chown -h "$$o" {} +
root_step = trap '$(GIVE_BACK)' EXIT; trap 'exit 130' INT TERM; \
	$(AS_ROOT) $(PYENV) KREX_ROOT_STEP=1 $(1)
CUDA_INCLUDE ?= /usr/local/cuda/include
# Test processes of `make test` (pytest-xdist, a file per process at a time): the suite
# mostly waits on krexd and simulated kernels, so 3 fill two cores. Tests marked
# `serial` (the package-system tests' OS image, a Ray cluster, the attack witness)
# run afterwards, alone.
TEST_WORKERS ?= 3
export CUDA_INCLUDE

# `sudo make ...` by the checkout's owner would leave root's files in it: refused first
# (make runs its root steps through sudo itself).  Not inside a root step, whose tests run
# make, nor for `make clean`.
ifneq ($(SUDO_UID),)
ifeq ($(KREX_ROOT_STEP),)
ifeq ($(shell stat -c %u .),$(SUDO_UID))
ifneq ($(MAKECMDGOALS),clean)
$(error run make as $(SUDO_USER), without sudo: it runs the steps that need root through sudo itself, and the checkout stays yours)
endif
endif
endif
endif

# Without root or sudo the demo and the package tests cannot work: said in one line, first.
ifneq ($(NO_ROOT),)
ifneq ($(filter demo,$(MAKECMDGOALS)),)
$(error make demo: krexd manages cgroups and must run as root: run it as root or as a user who may use sudo)
endif
ifneq ($(filter ci test-packages,$(MAKECMDGOALS)),)
$(error make $(firstword $(filter ci test-packages,$(MAKECMDGOALS))): needs root (krexd, apt, mmdebstrap, systemd-nspawn): run it as root or as a user who may use sudo; make test runs the rest without)
endif
endif

.PHONY: all shim shim-tests fakecuda fakehip venv check test test-packages ci demo packages clean

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
	$(PYENV) $(PY) -m pytest -q -m '$(FAST)' -n 2 --dist loadfile

test:
	$(if $(NO_ROOT),@echo "$(NO_ROOT_TESTS)")
	$(MAKE) check all shim-tests
	$(call root_step,$(abspath $(PY)) -m pytest -m 'not ($(FAST)) and not packages and not serial' -n $(TEST_WORKERS) --dist loadfile --durations=15)
	$(call root_step,$(abspath $(PY)) -m pytest -m 'not ($(FAST)) and not packages and serial' --durations=5)

# KREX_TEST_INSTALL=1 lets the tests install with apt what they miss (never set by make test).
test-packages:
	$(MAKE) venv
	$(call root_step,KREX_TEST_INSTALL=1 $(abspath $(PY)) -m pytest -m packages --durations=5)

ci:
	$(MAKE) test
	$(MAKE) test-packages

demo:
	$(MAKE) venv all
	$(call root_step,$(abspath $(PY)) -m krex_cli.demo)

packages: all
	packaging/build.sh

clean:
	rm -rf build
