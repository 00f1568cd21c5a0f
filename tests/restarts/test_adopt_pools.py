"""An adopted region freezes the warm pools, as an ordinary region does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.warm_support import Pools, warm_config
from tests.restarts.conftest import Restarter
from tests.restarts.test_kill_steps import HOLDER
from tests.support import fake_driver_env, wait_for
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]


def pools_frozen(k: Krexd) -> bool:
    """Whether the kernel reports krexd's ``pools`` directory frozen."""
    events = Path(k.status()["warm"]["cgroups"]["dir"], "cgroup.events").read_text()
    return "frozen 1" in events


def test_an_adopted_region_keeps_the_warm_pools_frozen(
    krexd_factory: Factory, restarter: Restarter, tmp_path: Path, built: None
) -> None:
    k = krexd_factory(config=warm_config())
    pools = Pools(k, tmp_path)
    pools.ready()  # a zygote runs in the pools' directory
    env = fake_driver_env(k.env, k.workdir)
    holder = subprocess.Popen(
        [*k.krex, "run", "--cold", "--", sys.executable, HOLDER, "1", "6000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: k.status()["gpus"][0]["holder"] is not None, what="the region")
        wait_for(lambda: pools_frozen(k), 5, "pools frozen by the region")
        restarter.kill(k)
        k2 = restarter.start_again(k)
        assert k2.status()["gpus"][0]["holder"] is not None, "the region was not adopted"
        wait_for(lambda: pools_frozen(k2), 2, "pools frozen by the adopted region")
        assert holder.wait(60) == 0, (holder.stderr.read() or b"").decode()[-1500:]
        wait_for(lambda: not pools_frozen(k2), 5, "pools thawed at the region's end")
        assert k2.status()["gpus"][0]["holder"] is None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    k2.stop()
