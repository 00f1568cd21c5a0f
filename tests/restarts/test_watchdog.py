"""Bounded freeze without krexd: the watchdog thaws tenants and reopens gates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from krexd.restarts import watchdog
from krexd.restarts.saved_state import process_start
from tests.restarts.conftest import Restarter
from tests.restarts.test_kill_steps import FAKEGPU, HOLDER, frozen_tenants
from tests.support import fake_driver_env, wait_for
from tests.support.krexd import REPO, Krexd

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


def test_a_stale_heartbeat_of_a_live_krexd_thaws_nothing(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """The watchdog confirms death before it thaws: a krexd that answers ping is spared.

    The heartbeat here is a file the watchdog reads and nobody writes (as when
    a disk stops taking krexd's writes); the tree is a plain directory whose
    ``cgroup.freeze`` file says whether the watchdog thawed it.
    """
    k = krexd_factory()
    start = process_start(k.pid)
    heartbeat, tree = tmp_path / "hb", tmp_path / "tree"
    tree.mkdir()
    (tree / "cgroup.freeze").write_text("1")
    heartbeat.write_text(f"{k.pid} {start} {watchdog.boottime_ns() - 60 * 10**9}\n")
    argv = [sys.executable, "-m", "krexd.restarts.watchdog", "--heartbeat", str(heartbeat)]
    argv += ["--tree", str(tree), "--bound", "1", "--pid", str(k.pid), "--socket", k.socket]
    dog = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        time.sleep(2.0)
        assert (tree / "cgroup.freeze").read_text() == "1", "a live krexd's tree was thawed"
        k.proc.send_signal(signal.SIGSTOP)  # hung: no answer
        wait_for(lambda: (tree / "cgroup.freeze").read_text() == "0", 5, "thawed when hung")
        k.proc.send_signal(signal.SIGCONT)
        heartbeat.unlink()  # the watchdog exits
        dog.wait(10)
    finally:
        k.proc.send_signal(signal.SIGCONT)
        if dog.poll() is None:
            dog.kill()
            dog.wait()
    err = dog.stderr.read() if dog.stderr else ""
    assert err.count("answers: not thawing") == 1, err
    assert "no heartbeat from krexd" in err


def test_the_heartbeat_is_written_in_place(tmp_path: Path) -> None:
    """Every beat overwrites the same bytes of the same file: no new disk blocks."""
    path = tmp_path / "hb"
    path.write_text("1 2 3 and an older, longer record\n")
    hb = watchdog.Heartbeat(str(path))
    inode = path.stat().st_ino
    first = watchdog.read_heartbeat(str(path))
    time.sleep(0.01)
    assert hb.beat()
    second = watchdog.read_heartbeat(str(path))
    assert first is not None and second is not None
    assert first[:2] == second[:2] == (os.getpid(), process_start(os.getpid()))
    assert second[2] > first[2]
    assert path.stat().st_ino == inode
    assert path.stat().st_size == watchdog.RECORD_BYTES
    hb.remove()
    assert not path.exists()
