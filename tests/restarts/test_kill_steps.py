"""SIGKILL krexd at each step, start it again: 0 commands lost, 0 left frozen, regions exclusive.

Real krexd, real cgroups, ``krex run`` with the real shim over the fake
driver (its device timeline is the witness).  Three siblings launch kernels
all the time; one holder enters regions in a loop.  krexd pauses at a step
(``KREX_TEST_PAUSE_AT``, krexd/system/testhooks.py) or is caught holding a region,
is SIGKILLed there and started again on the same config.  Then:

* every ``krex run`` ends with its command's own exit code (0);
* within 1 s of the new krexd serving, no tenant is frozen unless an adopted
  region keeps it so, and none is frozen once the holder is done;
* no sibling kernel ran inside any region the holder completed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.restarts.conftest import Restarter
from tests.support import GPU_APIS, GpuApi, wait_for
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
FAKEGPU = os.path.join(REPO, "tests", "fakecuda", "fakegpu.py")
HOLDER = os.path.join(HERE, "progs", "region_loop.py")


def frozen_tenants(k: Krexd) -> list[str]:
    root = os.path.join(k.cgroup_dirs[0], "gpu0")
    out = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, name, "cgroup.events")) as f:
                if "frozen 1" in f.read():
                    out.append(name)
        except (NotADirectoryError, FileNotFoundError):
            pass
    return out


def start_all(k: Krexd, env: dict[str, str]) -> tuple[list[subprocess.Popen[bytes]], Any]:
    sibs = [
        subprocess.Popen(
            [
                *k.krex,
                "run",
                "--",
                sys.executable,
                FAKEGPU,
                "--seconds",
                "4",
                "--kernel-ns",
                str(100_000 + 50_000 * i),
                "--sync-every",
                "4",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    holder = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, HOLDER, "5", "150"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return sibs, holder


@pytest.mark.parametrize(
    "step", ["admitted", "placed", "closed", "drained", "frozen", "granted", "held", "thawed"]
)
def test_sigkill_at_each_step(
    step: str, krexd_factory: Factory, restarter: Restarter, built: None
) -> None:
    kill_at(step, GPU_APIS["cuda"], krexd_factory, restarter)


# Over the fake HIP runtime, the steps where a region's gate is closed, drained or held.
@pytest.mark.parametrize("gpu_api", ["hip"], indirect=True)
@pytest.mark.parametrize("step", ["closed", "drained", "held"])
def test_sigkill_at_a_region_step_over_hip(
    step: str, gpu_api: GpuApi, krexd_factory: Factory, restarter: Restarter
) -> None:
    kill_at(step, gpu_api, krexd_factory, restarter)


def kill_at(step: str, api: GpuApi, krexd_factory: Factory, restarter: Restarter) -> None:
    """SIGKILL krexd paused at ``step`` (or holding a region), start it again, check."""
    pause = {} if step == "held" else {"KREX_TEST_PAUSE_AT": step}
    k = krexd_factory(slots=6, env=pause, args=list(api.krexd_args))
    env = api.env(k.env, k.workdir)
    sibs, holder = start_all(k, env)
    try:
        if step == "held":
            wait_for(lambda: k.status()["gpus"][0]["holder"] is not None, what="a held region")
        else:
            wait_for(lambda: f"test pause at {step}" in k.log(), what=f"pause at {step}")
        restarter.kill(k)
        k2 = restarter.start_again(k, args=api.krexd_args)
        served = time.monotonic()
        adopted = k2.status()["gpus"][0]["region"]["holder"]
        if adopted is None:
            # Not adopted: every tenant thawed within 1 s of the new krexd serving.
            wait_for(lambda: not frozen_tenants(k2), 1.0 - (time.monotonic() - served), "thawed")
        codes = [s.wait(60) for s in sibs] + [holder.wait(60)]
        errs = [(p.stderr.read() or b"").decode()[-2000:] for p in [*sibs, holder]]
        assert codes == [0, 0, 0, 0], errs
        assert not frozen_tenants(k2)
    finally:
        for p in [*sibs, holder]:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = json.loads((holder.stdout.read() if holder.stdout else b"").decode().splitlines()[-1])
    records = timeline.read(os.path.join(k.workdir, "timeline"))
    assert sum(1 for r in records if r.pid != out["pid"]) > 100, "siblings did not run"
    inside = sum(
        len(timeline.overlapping(records, s, e, exclude_pid=out["pid"])) for s, e in out["regions"]
    )
    assert inside == 0, f"{inside} sibling kernel(s) inside regions"
    assert len(out["regions"]) > 3
    k2.stop()
