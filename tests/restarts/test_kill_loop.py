"""krexd killed (or restarted) at random instants under a region loop: nothing lost.

Real krexd, real cgroups, ``krex run`` with the real shim over the fake
driver.  Two siblings launch kernels all the time; the holder enters short
regions (20 ms, 30 ms apart) in a loop.  krexd is SIGKILLed, or restarted
with SIGTERM after ``krexd --prepare-restart``, at a few random instants
and started again 0.5 s later.  The holder loops until 2 s after the
last restart (however long the restarts took on a busy host).  Then
every command exits with its own code
(0), no region is left held, no tenant frozen, and the fake driver's
timeline shows no sibling kernel inside any region the holder completed.
The seed is printed; ``KREX_KILL_SEED`` repeats a run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.fakecuda import timeline
from tests.restarts.conftest import Restarter
from tests.restarts.test_kill_steps import FAKEGPU, HOLDER, frozen_tenants
from tests.support import GpuApi, wait_for
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]
KILLS = 4


def sibling(k: Krexd, env: dict[str, str], i: int) -> subprocess.Popen[bytes]:
    """A sibling launching kernels until SIGTERM (which ``krex run`` forwards; it exits 0)."""
    argv = [sys.executable, FAKEGPU, "--seconds", "90", "--kernel-ns", str(100_000 + 50_000 * i)]
    return subprocess.Popen(
        [*k.krex, "run", "--", *argv, "--sync-every", "4"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("how", ["sigkill", "restart"])
def test_random_kills_under_a_region_loop(
    how: str, krexd_factory: Factory, restarter: Restarter, gpu_api: GpuApi
) -> None:
    seed = int(os.environ.get("KREX_KILL_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    k = krexd_factory(slots=4, args=list(gpu_api.krexd_args))
    env = gpu_api.env(k.env, k.workdir)
    sibs = [sibling(k, env, i) for i in range(2)]
    wait_for(lambda: len(k.status()["tenants"]) == 2, what="two siblings")
    stop_file = os.path.join(k.workdir, "stop-loop")
    holder = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, HOLDER, "120", "20", "30", stop_file],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs = [*sibs, holder]
    try:
        wait_for(lambda: k.status()["gpus"][0]["holder"] is not None, what="a first region")
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.2, 1.0))
            if how == "restart":
                restarter.prepare_restart(k)
                restarter.kill(k, signal.SIGTERM)
            else:
                restarter.kill(k)
            time.sleep(0.5)
            k = restarter.start_again(k, args=gpu_api.krexd_args)
        last_restart_ns = time.monotonic_ns()
        time.sleep(2.0)
        open(stop_file, "w").close()
        code = holder.wait(60)
        for s in sibs:
            s.send_signal(signal.SIGTERM)
        codes = [code] + [s.wait(30) for s in sibs]
        errs = [(p.stderr.read() or b"").decode()[-2000:] for p in procs]
        assert codes == [0, 0, 0], (seed, errs)
        assert k.status()["gpus"][0]["holder"] is None
        assert not frozen_tenants(k)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = json.loads((holder.stdout.read() if holder.stdout else b"").decode().splitlines()[-1])
    records = timeline.read(os.path.join(k.workdir, "timeline"))
    assert sum(1 for r in records if r.pid != out["pid"]) > 100, "siblings did not run"
    inside = sum(
        len(timeline.overlapping(records, s, e, exclude_pid=out["pid"])) for s, e in out["regions"]
    )
    assert inside == 0, f"seed {seed}: {inside} sibling kernel(s) inside regions"
    # It made progress, also after the last restart (a busy host runs fewer of 50 ms).
    assert len(out["regions"]) > 8
    assert sum(1 for s, _ in out["regions"] if s > last_restart_ns) >= 5
    k.stop()
