"""Warm pools across krexd restarts and stops: no stale pool ever serves.

A restarted krexd knows no pool (registrations are not saved): the old
pool's keeper sees another krexd answer, the pool stops accepting, lets its
running command end (its krex run still gets the exit status) and exits; a
command that reaches it meanwhile is refused at ``place`` and starts cold.
A stopped krexd kills its pools with its cgroup tree.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.warm_support import PY, SERVED, Pools, pid_alive, warm_config
from tests.restarts.conftest import Restarter
from tests.support import wait_for
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def test_a_restart_retires_the_pool_without_losing_its_command(
    krexd_factory: Factory, restarter: Restarter, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config())
    pools = Pools(k, tmp_path)
    pools.ready()
    old = pools.pools()[0]
    started = tmp_path / "started"
    prog = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(3); exit(7)"
    running = subprocess.Popen(
        [*k.krex, "run", "--warm", "-v", "--", PY, "-c", prog],
        env=pools.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(started.exists, what="the warm command's start")
    restarter.prepare_restart(k)
    restarter.kill(k, signal.SIGTERM)
    k2 = restarter.start_again(k)
    pools.k = k2
    assert k2.status()["warm"]["pools"] == []  # the new krexd never registered it
    # Reaching the old pool now: krexd refuses to place its child; the command starts cold.
    p = pools.warm([PY, "-c", "print('cold')"], served=False)
    assert p.stdout == "cold\n"
    _, err = running.communicate(timeout=60)
    assert running.returncode == 7, err  # the old pool still reported its command's end
    assert SERVED in err
    wait_for(lambda: not pid_alive(old["pid"]), 20, "the old pool's exit")
    # Its keeper saw the new krexd ("krexd restarted"), or pinged in the gap between the
    # two ("krexd is gone", on a busy host): either way the pool stopped accepting.
    logs = pools.logs()
    assert "krexd restarted" in logs or "krexd is gone" in logs, logs
    assert "the pool stops accepting" in logs, logs
    pools.ready()  # a new pool, registered with the new krexd
    new = pools.pools()[0]
    assert new["pid"] != old["pid"]
    assert not Path(old["cgroup"]).exists()  # swept when the new pool registered
    k2.stop()


def test_a_stopped_krexd_ends_its_pools(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(config=warm_config())
    pools = Pools(k, tmp_path)
    pools.ready()
    row = pools.pools()[0]
    k.stop()  # checks that every cgroup directory krexd made is gone
    wait_for(lambda: not pid_alive(row["pid"]) and not pid_alive(row["keeper_pid"]), 20)
    assert not list(pools.dir.glob("*.sock"))
