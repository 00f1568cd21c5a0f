"""Bounded freeze without krexd: the watchdog thaws tenants and reopens gates."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.conftest import Krexd
from tests.restarts.conftest import Restarter, wait_for
from tests.restarts.test_kill_steps import FAKEGPU, HOLDER, frozen_tenants
from tests.support import fake_driver_env

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]
BOUND_S = 3.0


@pytest.mark.parametrize("how", ["sigkill", "hang"])
def test_no_tenant_stays_frozen_longer_than_the_bound(
    how: str, krexd_factory: Factory, restarter: Restarter, built: None
) -> None:
    k = krexd_factory(slots=4, config={"daemon": {"freeze_bound_s": BOUND_S}})
    env = fake_driver_env(k.env, k.workdir)
    sibs = [
        subprocess.Popen(
            [
                *k.krex,
                "run",
                "--",
                sys.executable,
                FAKEGPU,
                "--seconds",
                "12",
                "--kernel-ns",
                "100000",
                "--sync-every",
                "4",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    wait_for(lambda: len(k.status()["tenants"]) == 2, what="two siblings")
    holder = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, HOLDER, "1", "9000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: len(frozen_tenants(k)) == 2, what="siblings frozen by the region")
        if how == "sigkill":
            restarter.kill(k)
        else:
            k.proc.send_signal(signal.SIGSTOP)  # a hung krexd: alive, no heartbeat
        gone_at = time.monotonic()
        wait_for(lambda: not frozen_tenants(k), BOUND_S + 2.0, "thawed by the watchdog")
        thawed_after = time.monotonic() - gone_at
        print(f"{how}: siblings thawed {thawed_after:.2f} s after krexd stopped beating")
        assert 0.5 < thawed_after <= BOUND_S + 1.0
        if how == "hang":
            k.proc.send_signal(signal.SIGKILL)
            k.proc.wait(10)
        k2 = restarter.start_again(k)
        codes = [p.wait(60) for p in [*sibs, holder]]
        errs = [(p.stderr.read() or b"").decode()[-1500:] for p in [*sibs, holder]]
        assert codes == [0, 0, 0], errs
        k2.stop()
    finally:
        for p in [*sibs, holder]:
            if p.poll() is None:
                p.kill()
                p.wait()
