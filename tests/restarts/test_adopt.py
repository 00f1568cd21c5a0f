"""A restarted krexd adopts its tenants: no command is lost (real krexd, cgroups, krex run)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import pytest

from krexd import state as saved_state
from tests.conftest import Krexd
from tests.restarts.conftest import Restarter
from tests.support import wait_for

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def start_runs(k: Krexd, codes: list[int], sleep_s: float) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [*k.krex, "run", "--", "sh", "-c", f"sleep {sleep_s}; exit {c}"],
            env=k.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in codes
    ]


def running(k: Krexd, n: int) -> bool:
    return sum(1 for t in k.status()["tenants"] if t["state"] == "running") == n


def test_sigkill_then_restart_loses_no_command(
    krexd_factory: Factory, restarter: Restarter
) -> None:
    k = krexd_factory(slots=4)
    runs = start_runs(k, [3, 5, 7], 3.0)
    wait_for(lambda: running(k, 3), what="three running tenants")
    restarter.kill(k)
    k2 = restarter.start_again(k)
    st = k2.status()
    assert sorted(t["id"] for t in st["tenants"]) == [1, 2, 3]
    codes = [p.wait(60) for p in runs]
    errs = [p.stderr.read() if p.stderr else "" for p in runs]
    assert codes == [3, 5, 7], errs
    assert not any("did not confirm" in e for e in errs), errs
    wait_for(lambda: k2.status()["tenants"] == [], what="tenants released")
    assert "adopted 3 tenant(s)" in k2.log()
    # Their slot memories (where their processes register) are attached to
    # the gate krexd mapped again, through each launcher's fd.
    assert k2.log().count("slot memory attached to gpu0's gate again") == 3, k2.log()
    # New ids continue the old ones.
    p = subprocess.run(
        [*k2.krex, "run", "--", "sh", "-c", "echo $KREX_TENANT"],
        env=k2.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and int(p.stdout) == 4
    k2.stop()


def test_sigterm_for_restart_keeps_commands(krexd_factory: Factory, restarter: Restarter) -> None:
    k = krexd_factory(slots=4)
    runs = start_runs(k, [0, 9], 3.0)
    wait_for(lambda: running(k, 2), what="two running tenants")
    restarter.prepare_restart(k)
    restarter.kill(k, signal.SIGTERM)
    assert k.proc.returncode == 0
    k2 = restarter.start_again(k)
    daemon = k2.status()["daemon"]  # counted for status and the metrics endpoint
    assert (daemon["restarts"], daemon["adopted_tenants"]) == (1, 2)
    assert [p.wait(60) for p in runs] == [0, 9]
    k2.stop()


def test_stop_ends_commands_and_says_so(krexd_factory: Factory) -> None:
    k = krexd_factory(slots=4)
    runs = start_runs(k, [0, 0], 30.0)
    wait_for(lambda: running(k, 2), what="two running tenants")
    k.stop()
    for p in runs:
        assert p.wait(30) == 137
        err = p.stderr.read() if p.stderr else ""
        lines = [line for line in err.splitlines() if "krexd was stopped" in line]
        assert len(lines) == 1, err
        assert "did not confirm" not in err, err


def test_refused_state_falls_back_to_cleanup(krexd_factory: Factory, restarter: Restarter) -> None:
    k = krexd_factory(slots=4)
    runs = start_runs(k, [0], 30.0)
    wait_for(lambda: running(k, 1), what="a running tenant")
    restarter.kill(k)
    path = os.path.join(k.workdir, f"{k.cgroup_name}.state")
    found = saved_state.newest(path)  # either slot may hold the newest state
    assert found is not None
    doc = found[1]
    doc["version"] = 99
    saved_state.StateFile(path).write(doc)  # written later: the newest slot now
    k2 = restarter.start_again(k)
    assert "newer: state version 99" in k2.log()
    assert k2.status()["tenants"] == []
    assert runs[0].wait(30) == 137  # killed by the cleanup
    k2.stop()


def test_a_restart_adopts_from_a_padded_slot(krexd_factory: Factory, restarter: Restarter) -> None:
    """A state shorter than its slot held is padded with newlines (no ftruncate): it is
    adopted all the same."""
    k = krexd_factory(slots=4)
    runs = start_runs(k, [3, 5], 4.0)
    wait_for(lambda: running(k, 2), what="two running tenants")  # tenants 1 and 2
    runs += start_runs(k, [0], 0.3)
    assert runs[2].wait(30) == 0
    wait_for(lambda: len(k.status()["tenants"]) == 2, what="the short command released")
    path = os.path.join(k.workdir, f"{k.cgroup_name}.state")
    found = saved_state.newest(path)
    assert found is not None and sorted(t["id"] for t in found[1]["tenants"]) == [1, 2]
    with open(found[0], "rb") as f:
        assert f.read().endswith(b"\n\n")  # padded over the state with three tenants
    restarter.kill(k)
    k2 = restarter.start_again(k)
    assert sorted(t["id"] for t in k2.status()["tenants"]) == [1, 2]
    assert [p.wait(60) for p in runs[:2]] == [3, 5]
    assert "adopted 2 tenant(s)" in k2.log()
    k2.stop()
