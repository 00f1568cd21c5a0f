"""``KREX_SHIM_DEFER=1``: a warm pool's zygote loads the shim without initialising it.

The constructor skips initialisation; the first driver call of a process
forked from it initialises from the environment the child has by then (its
own gate, tenant and slot memory).  ``krex_shim_mode()`` reads the mode
without initialising (0 until then).  Over the fake driver: the child's
kernels are gated (they wait while the gate is closed for another tenant)
and the parent, never having called the driver, is still uninitialised.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from krexd.gate import Gate
from tests.fakecuda import timeline
from tests.fakecuda.harness import FakeCuda
from tests.support import REPO, ShimBuild, tenant_env

FAKECUDA_DIR = str(REPO / "tests" / "fakecuda")

HOLDER = 1

# The parent (a zygote) checks its mode, forks; the child takes the tenant's
# variables, launches one kernel when told, and reports.
_ZYGOTE = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
me = ctypes.CDLL(None)
before = me.krex_shim_mode()
child_env = json.loads(sys.argv[2])
pid = os.fork()
if pid == 0:
    os.environ.update(child_env)
    os.environ.pop("KREX_SHIM_DEFER")
    import fakegpu
    sys.stdin.readline()
    gpu = fakegpu.init()
    gpu.launch(1_000_000)
    gpu.synchronize()
    print(json.dumps({"child": os.getpid(), "mode": me.krex_shim_mode(),
                      "active": me.krex_shim_active()}), flush=True)
    os._exit(0)
print(json.dumps({"parent_before": before, "child_pid": pid}), flush=True)
_, status = os.waitpid(pid, 0)
print(json.dumps({"parent_after": me.krex_shim_mode(), "status": status}), flush=True)
"""


def _start(
    fc: FakeCuda, shim: ShimBuild, env_extra: dict[str, str], child_env: dict[str, str]
) -> subprocess.Popen[str]:
    env = fc.env(LD_PRELOAD=str(shim.shim), **env_extra)
    return subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE, FAKECUDA_DIR, json.dumps(child_env)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_deferred_shim_initialises_in_the_child_from_its_environment(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path
) -> None:
    # The zygote's own variables would refuse GPU work had it initialised from them.
    bogus = {"KREX_GATE": str(tmp_path / "missing.gate"), "KREX_TENANT": "2"}
    p = _start(fc, shim_build, {"KREX_SHIM_DEFER": "1", **bogus}, tenant_env(gate, 2))
    assert p.stdout is not None and p.stdin is not None
    try:
        first = json.loads(p.stdout.readline())
        assert first["parent_before"] == 0  # KREX_MODE_UNINIT: nothing initialised it
        gate.close(HOLDER, 1)  # a sibling's region: the child's kernel must wait
        p.stdin.write("\n")
        p.stdin.flush()
        time.sleep(0.5)
        child = first["child_pid"]
        assert timeline.by_pid(fc.records()).get(child, []) == [], "kernel ran in a region"
        assert [s.state for s in gate.registrations() if s.pid == child] == ["active"]
        opened_ns = time.monotonic_ns()
        gate.reopen(HOLDER, 1)
        done = json.loads(p.stdout.readline())
        assert done == {"child": child, "mode": 2, "active": 1}  # KREX_MODE_GATING
        last = json.loads(p.stdout.readline())
        assert last == {"parent_after": 0, "status": 0}
        ran = timeline.by_pid(fc.records())[child]
        assert len(ran) == 1 and ran[0].start_ns >= opened_ns
    finally:
        p.kill()
        p.wait()
    assert "GPU work refused" not in (p.stderr.read() if p.stderr else "")


def test_without_defer_the_constructor_initialises_at_load(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path
) -> None:
    bogus = {"KREX_GATE": str(tmp_path / "missing.gate"), "KREX_TENANT": "2"}
    p = _start(fc, shim_build, bogus, tenant_env(gate, 2))
    assert p.stdout is not None and p.stdin is not None
    try:
        first = json.loads(p.stdout.readline())
        assert first["parent_before"] == 3  # KREX_MODE_REFUSE: initialised from bogus values
    finally:
        p.kill()
        p.wait()
