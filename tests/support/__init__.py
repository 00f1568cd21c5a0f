"""Helpers shared by every test package, defined once (``tests/conftest.py`` exposes the fixtures).

The package: this module (paths, builds, environments, waiting, reading
programs' output), :mod:`tests.support.krexd` (a real krexd's handle and the
test config) and :mod:`tests.support.fakes` (in-memory fakes of the
coordinator's ports).  Test modules import these, never a conftest.

* Paths of the built parts: :data:`REPO`, :data:`BUILD`, :class:`ShimBuild`
  (``libkrex_shim.so``, ``libkrex_gate.so``, the C programs of tests/shim),
  :data:`FAKE_DIR` (the fake driver of tests/fakecuda), :data:`HIP_DIR` (the
  fake HIP runtime of tests/fakehip).
* :func:`make`: build a top-level target of the Makefile, quietly, once per
  target and test session.
* :data:`SCRUB_ENV` and :func:`clean_env`: the caller's variables that would
  change a driver, a shim or a krex client under test, removed.
* :func:`json_lines` and :class:`JsonLineReader`: programs under test print
  one JSON document per line; read them whole or as they come.
* :func:`fake_driver_env`: an environment whose commands run over the fake
  driver, its device timeline written in a work directory.
* :class:`GpuApi` (:data:`GPU_APIS`): the two fakes a protocol suite runs
  over, CUDA's driver and HIP's runtime (``tests/conftest.py``'s ``gpu_api``
  fixture parametrizes a test over both).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
FAKE_DIR = BUILD / "fakecuda"
HIP_DIR = BUILD / "fakehip"


def wait_for(
    cond: Callable[[], Any],
    timeout_s: float = 20.0,
    what: str = "condition",
    every_s: float = 0.02,
) -> Any:
    """Poll ``cond()`` every ``every_s`` until it returns a true value, and return it.

    Raises:
        AssertionError: naming ``what``, when ``timeout_s`` passed first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s} s"
        time.sleep(every_s)


def fake_driver_env(base: dict[str, str], workdir: str) -> dict[str, str]:
    """``base`` plus the fake driver (tests/fakecuda) and its files in ``workdir``.

    The timeline (every kernel, memset and copy: tests/fakecuda/timeline.py)
    goes to ``workdir/timeline``, the simulated device's state to
    ``workdir/fakestate``.
    """
    return dict(
        base,
        LD_LIBRARY_PATH=str(FAKE_DIR),
        KREX_FAKE_TIMELINE=os.path.join(workdir, "timeline"),
        KREX_FAKE_STATE=os.path.join(workdir, "fakestate"),
    )


@dataclass(frozen=True)
class GpuApi:
    """One fake a protocol suite runs its tenants over.

    ``cuda``: the fake CUDA driver on simulated NVIDIA GPUs.  ``hip``: the
    fake HIP runtime (tests/fakehip, over the same simulated device and
    timeline) on simulated AMD GPUs (``krexd --fake-vendor amd``); the test
    tenants built on tests/fakecuda/fakegpu.py drive HIP
    (``KREX_TEST_GPU_API=hip``), so the programs are not copied.
    """

    name: str
    krexd_args: tuple[str, ...]  # what krexd_factory's ``args`` gets
    make_target: str  # the build the tenants need
    success: str  # the runtime's name for success, as a tenant reports it
    out_of_memory: str  # its out-of-memory error's name
    l2_bytes: int  # the simulated GPU's L2 (the region's flush buffer), as the runtime says

    def env(self, base: dict[str, str], workdir: str) -> dict[str, str]:
        """:func:`fake_driver_env`, then :meth:`runtime_env`."""
        return self.runtime_env(fake_driver_env(base, workdir))

    def runtime_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` (which runs over the fake driver) with, for HIP, the runtime first on the
        library path and the test tenants driving it."""
        if self.name == "hip":
            env = dict(env, LD_LIBRARY_PATH=f"{HIP_DIR}:{FAKE_DIR}", KREX_TEST_GPU_API="hip")
        return env


GPU_APIS = {
    # L2: tests/fakecuda/devinfo.c (an H100's 50 MiB), tests/fakehip/hip_device.c (4 MiB).
    "cuda": GpuApi("cuda", (), "fakecuda", "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY", 50 << 20),
    "hip": GpuApi(
        "hip", ("--fake-vendor", "amd"), "fakehip", "hipSuccess", "hipErrorOutOfMemory", 4 << 20
    ),
}


@dataclass(frozen=True)
class ShimBuild:
    """Paths of the built libraries and test programs."""

    shim: Path = BUILD / "lib" / "libkrex_shim.so"
    shim_test: Path = BUILD / "lib" / "libkrex_shim_test.so"  # pause points compiled in
    gate_lib: Path = BUILD / "lib" / "libkrex_gate.so"
    tests: Path = BUILD / "shim-tests"

    def prog(self, name: str) -> Path:
        """A test program of tests/shim/c."""
        return self.tests / name


# Variables of the caller's environment that change the fake device, the shim
# or a krex client: a process under test gets only what its test sets.
SCRUB_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "KREX_FAKE_GPUS",
    "KREX_FAKE_MEM_BYTES",
    "KREX_FAKE_STATE",
    "KREX_FAKE_TIMELINE",
    "LD_PRELOAD",
    "KREX_GATE",
    "KREX_TENANT",
    "KREX_SLOTS",
    "KREX_SLOTS_FD",
    "KREX_TOKEN",
    "KREX_SOCKET",
    "KREX_OOM_WAIT_S",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "INVOCATION_ID",
)

_made: set[str] = set()
_make_lock = threading.Lock()


def gone(pid: int) -> bool:
    """True when process ``pid`` no longer runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


#: Set by ``make test-packages``: tests may install with apt what they miss.
INSTALL_ENV = "KREX_TEST_INSTALL"


def installs_allowed() -> bool:
    """True when this run may install packages on the host (``make test-packages`` sets
    ``KREX_TEST_INSTALL=1``); ``make test`` and ``make check`` never do."""
    return os.environ.get(INSTALL_ENV) == "1"


def make(target: str) -> None:
    """``make -s TARGET`` at the top of the tree, once per session (CalledProcessError on failure).

    Targets: ``shim`` (libraries), ``shim-tests`` (libraries and the C
    programs of tests/shim), ``fakecuda`` (the fake driver and its programs),
    ``fakehip`` (the fake HIP runtime and hipbench).
    """
    with _make_lock:
        if target in _made:
            return
        subprocess.run(
            ["make", "-s", "-C", str(REPO), target], check=True, stdout=subprocess.DEVNULL
        )
        _made.add(target)


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without :data:`SCRUB_ENV`, ``overrides`` added last."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
    env.update(overrides)
    return env


def json_lines(text: str, only_objects: bool = False) -> list[dict[str, Any]]:
    """The JSON documents of ``text``, one a line (``only_objects``: skip lines not ``{...}``)."""
    lines = text.splitlines()
    if only_objects:
        lines = [ln for ln in lines if ln.startswith("{")]
    return [json.loads(ln) for ln in lines]


class JsonLineReader:
    """Collects the JSON lines of a text stream in a thread, as the program prints them.

    ``what`` names the program in failure messages; ``on_end`` (optional)
    gives a description of how it ended (exit code, stderr) for them.
    """

    def __init__(self, stream: IO[str], what: str, on_end: Callable[[], str] = str) -> None:
        self.what = what
        self.lines: list[dict[str, Any]] = []
        self._on_end = on_end
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._q.put(json.loads(line))
        self._q.put(None)

    def next(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next line (AssertionError after ``timeout_s`` or at the end of output)."""
        try:
            item = self._q.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line from {self.what} within {timeout_s} s") from None
        if item is None:
            self._q.put(None)
            raise AssertionError(f"{self.what} ended {self._on_end()}")
        self.lines.append(item)
        return item

    def drain(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every line to the end of the output (``lines`` then holds them all)."""
        while True:
            try:
                item = self._q.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(
                    f"output of {self.what} did not end in {timeout_s} s"
                ) from None
            if item is None:
                self._q.put(None)
                return self.lines
            self.lines.append(item)

    def empty(self) -> bool:
        """True when no line is waiting to be read."""
        return self._q.empty()


def tenant_env(gate: Any, tenant: int) -> dict[str, str]:
    """The gate variables of tenant ``tenant``'s processes on ``gate`` (a krexd.gate.Gate).

    As ``krex run`` does: the tenant's slot memory (a sealed memfd made by
    ``krex_cli.slotmem`` from krexd's spec) is created once per gate and
    tenant, kept open by this process (on the gate object, closed by
    :func:`forget_gate`) and attached to ``gate``; children reach it as
    ``/proc/<this pid>/fd/<n>`` (``KREX_SLOTS``), so they need no inherited fd.
    """
    from krex_cli import slotmem
    from krexd.gate import registration_memory_spec

    fds: dict[int, int] = gate.__dict__.setdefault("_test_slot_fds", {})
    fd = fds.get(tenant)
    if fd is None:
        size, header = registration_memory_spec(tenant)
        fd = slotmem.create(size, header)
        gate.attach(tenant, fd)
        fds[tenant] = fd
    return {
        "KREX_GATE": gate.path,
        "KREX_TENANT": str(tenant),
        "KREX_SLOTS": f"/proc/{os.getpid()}/fd/{fd}",
    }


def forget_gate(gate: Any) -> None:
    """Close the slot memory fds :func:`tenant_env` made for ``gate``."""
    for fd in gate.__dict__.pop("_test_slot_fds", {}).values():
        os.close(fd)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of krexd's ``/metrics`` on ``port`` (prometheus_client's own parser):
    ``{(name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` in a :func:`scrape`."""
    return samples[(name, tuple(sorted(labels.items())))]
