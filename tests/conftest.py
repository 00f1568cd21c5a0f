"""Shared test fixtures: real krexd processes on private sockets and cgroup names.

``krexd_factory(fake_gpus=1, slots=4, config={table: {key: value}}, extra="",
env=None, wait=True, args=None, name=None)`` starts a real
``krexd --foreground`` (over ``--fake-gpus``) on a socket in a fresh temporary
directory, with a cgroup name no other test or krexd uses, waits until it
answers ``ping``, and returns a :class:`Krexd` handle:

* ``.socket`` – the control socket path; ``.env`` – environment for
  ``krex run`` / clients (``KREX_SOCKET`` set); ``.krex`` – argv prefix of
  the ``krex`` command; ``.pid``, ``.log()``, ``.status()``;
* ``.stop()`` – SIGTERM, wait, then assert the socket and every cgroup
  directory krexd made are gone; returns krexd's exit code.

Every krexd still running at the end of a test is stopped (and checked).

Built parts, once per session (helpers in :mod:`tests.support`):
``shim_build`` (the shim, the gate library and the C programs of tests/shim;
points ``krexd.gate`` at that library), ``fakecuda_build`` (the fake driver),
``built`` (both), and ``fc``, a private fake device per test.

Markers: tests marked ``root`` are skipped when not root, ``gpu`` without a
GPU; a test that uses a fixture needing root (``ROOT_FIXTURES``: a krexd, a
gate the shim maps) is marked ``root`` here, one that uses a build fixture
``needs_build``, one that uses a fixture installing packages with apt
(``INSTALL_FIXTURES``) ``packages``, so
``make check`` (``-m "not root and not gpu and not needs_build and not
slow and not packages"``) runs only the quick tests that need neither root nor a
built C part; ``make test`` runs the others (``slow`` ones included) but the
``packages`` ones, which ``make test-packages`` runs (CI: ``make ci``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fakecuda.harness import Build, FakeCuda
from tests.support import GPU_APIS, GpuApi, ShimBuild, clean_env, make
from tests.support.krexd import REPO, Krexd, make_config, render_toml

_counter = itertools.count()


#: Fixtures that build C parts: a test using one (directly or not) is ``needs_build``.
BUILD_FIXTURES = frozenset({"shim_build", "fakecuda_build", "fakehip_build", "built", "gpu_api"})
#: Fixtures that need root: a krexd (cgroups) or a gate file the shim maps (it maps only
#: a root-owned one, libkrex_shim/gate/gate.c).  A test using one (directly or not) is
#: ``root``, so it is skipped with the reason wherever it could not pass.
ROOT_FIXTURES = frozenset({"krexd_factory", "gate", "shared_gpu", "krex_cluster", "restarter"})
#: Fixtures that install what they miss with apt (only under ``make test-packages``,
#: tests.support.installs_allowed): a test using one is ``packages``, run by that target.
INSTALL_FIXTURES = frozenset({"packages", "systemd_analyze", "hip_include"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``needs_build``; skip ``root`` tests when not root, ``gpu`` ones without an
    NVIDIA GPU, ``amd_gpu`` ones without an AMD GPU (``/dev/kfd``)."""
    not_root = os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup")
    no_gpu = not os.path.exists("/dev/nvidiactl")
    no_amd_gpu = not os.path.exists("/dev/kfd")
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if BUILD_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.needs_build)
        if ROOT_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.root)
        if INSTALL_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.packages)
        if not_root and "root" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs root and cgroups"))
        if no_gpu and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if no_amd_gpu and "amd_gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs an AMD GPU (/dev/kfd)"))


@pytest.fixture
def krexd_factory() -> Iterator[Callable[..., Krexd]]:
    """Factory of real krexd processes; all are stopped and checked after the test."""
    started: list[Krexd] = []
    dirs: list[str] = []

    def start(
        fake_gpus: int = 1,
        slots: int = 4,
        config: dict[str, dict[str, Any]] | None = None,
        extra: str = "",
        env: dict[str, str] | None = None,
        wait: bool = True,
        args: list[str] | None = None,
        name: str | None = None,
    ) -> Krexd:
        workdir = tempfile.mkdtemp(prefix="krex-")
        dirs.append(workdir)
        os.chmod(workdir, 0o755)
        socket = os.path.join(workdir, "krexd.sock")
        name = name or f"krextest{os.getpid()}n{next(_counter)}"
        config_path = os.path.join(workdir, "krex.toml")
        with open(config_path, "w") as f:
            f.write(render_toml(make_config(socket, name, slots, config)) + extra)
        log_path = os.path.join(workdir, "krexd.log")
        # KREX_SOCKET would override the config's socket: a test passes it in ``env``.
        # krexd locks the GPU's processes through the fake driver, reading the same
        # simulated device as the tenants that tests.support.fake_driver_env sets up
        # in this workdir (a test's ``env`` overrides either).
        fake_lib = os.path.join(REPO, "build", "fakecuda", "libcuda.so.1")
        defaults = {"KREX_FAKE_STATE": os.path.join(workdir, "fakestate")}
        if fake_gpus and os.path.exists(fake_lib):  # real GPUs: the host's driver
            defaults["KREX_DRIVER_LIB"] = fake_lib
        proc_env = clean_env(**{**defaults, **(env or {})})
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "krexd",
                    "--foreground",
                    "--config",
                    config_path,
                    "--fake-gpus",
                    str(fake_gpus),
                    *(args or []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=proc_env,
                cwd=REPO,
            )
        k = Krexd(proc, socket, workdir, name, log_path)
        started.append(k)
        if wait:
            k.wait_ready()
            st = k.status()
            cg = st["cgroups"]
            pools = ((st.get("warm") or {}).get("cgroups")) or {}  # v1 memory of warm pools
            trees = (
                cg["root"],
                cg.get("cpuset_root"),
                cg.get("pids_root"),
                pools.get("memory_root"),
            )
            k.cgroup_dirs = [d for d in trees if d]
        return k

    yield start
    failures = []
    for k in started:
        if k.proc.poll() is None:
            try:
                k.stop()
            except BaseException as exc:  # report after stopping the others
                failures.append(exc)
    if not os.environ.get("KREX_KEEP_TEST_DIRS"):  # set it to read krexd logs afterwards
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    if failures:
        raise failures[0]


@pytest.fixture(scope="session")
def shim_build() -> ShimBuild:
    """Build the shim, the gate library and the test programs (once per test run)."""
    make("shim-tests")
    b = ShimBuild()
    os.environ["KREX_GATE_LIB"] = str(b.gate_lib)
    return b


@pytest.fixture(scope="session")
def fakecuda_build() -> Build:
    """The fake driver and its programs, built once per test session."""
    make("fakecuda")
    return Build.default()


@pytest.fixture(scope="session")
def built(shim_build: ShimBuild, fakecuda_build: Build) -> None:
    """The shim, the gate library and the fake driver (once)."""


@pytest.fixture(params=sorted(GPU_APIS))
def gpu_api(request: pytest.FixtureRequest, built: None) -> GpuApi:
    """Each fake in turn (``cuda``, ``hip``): a protocol suite over both
    (tests.support.GpuApi), its build made."""
    api: GpuApi = GPU_APIS[request.param]
    make(api.make_target)
    return api


@pytest.fixture
def fc(fakecuda_build: Build, tmp_path: Any) -> FakeCuda:
    """A fake device whose timeline and memory state belong to this test only."""
    return FakeCuda(fakecuda_build, tmp_path)
