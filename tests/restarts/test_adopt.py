"""A restarted krexd adopts its tenants: no command is lost (real krexd, cgroups, krex run)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import pytest

from krexd.restarts import saved_state
from tests.restarts.conftest import Restarter
from tests.support import wait_for
from tests.support.krexd import Krexd

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


def test_a_gpu_that_is_another_gpu_now_is_not_adopted(
    krexd_factory: Factory, restarter: Restarter
) -> None:
    """The saved state names each GPU by UUID: under a shifted index (a GPU left out at
    the next start) a tenant bound to one GPU is never adopted as another GPU's."""
    k = krexd_factory(slots=4)
    runs = start_runs(k, [0], 30.0)
    wait_for(lambda: running(k, 1), what="a running tenant")
    restarter.kill(k)
    path = os.path.join(k.workdir, f"{k.cgroup_name}.state")
    found = saved_state.newest(path)
    assert found is not None
    doc = found[1]
    saved_uuid = doc["gpus"]["0"]["uuid"]
    assert saved_uuid.startswith("GPU-")  # what krexd wrote: the GPU's UUID
    doc["gpus"]["0"]["uuid"] = "GPU-00000000-0000-0000-0000-0000000000ff"
    saved_state.StateFile(path).write(doc)
    k2 = restarter.start_again(k)
    assert f"GPU 0 was GPU-00000000-0000-0000-0000-0000000000ff and is {saved_uuid} now" in (
        k2.log()
    )
    assert k2.status()["tenants"] == []
    assert runs[0].wait(30) == 137  # killed by the cleanup, not adopted
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


def test_a_command_admitted_under_an_adopted_region_is_placed_after_it(
    krexd_factory: Factory, restarter: Restarter
) -> None:
    """A sibling admitted but not placed when krexd restarts under a held region stays
    admitted: once the adopted region ends, its first place attaches its slot memory.

    Found by benchmarks/soak.py: adoption marked every sibling of the saved region frozen,
    so the region's end thawed an admitted tenant to running, and the first place of its
    command was refused ("its slot memory is attached by its first place only").
    """
    import sys

    from krex_cli import slotmem
    from tests.restarts.test_kill_steps import HOLDER
    from tests.support import fake_driver_env

    k = krexd_factory(slots=4, config={"admission": {"place_timeout_s": 60.0}})
    env = fake_driver_env(k.env, k.workdir)
    holder = subprocess.Popen(
        # One region of 5 s: it outlasts krexd's kill and restart on a busy host (a 600 ms
        # one could end, its exit answered by the new krexd, before the check below).
        [*k.krex, "run", "--", sys.executable, HOLDER, "0.5", "5000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = None
    try:
        wait_for(lambda: k.status()["gpus"][0]["holder"] is not None, what="a held region")
        body = {"argv": ["sleep", "5"], "exclusive": False, "launcher_pid": os.getpid()}
        granted = k.request("admit", body)  # this test is the launcher; nothing placed yet
        tenant, token = int(granted["tenant"]), str(granted["token"])
        restarter.kill(k)
        k2 = restarter.start_again(k)
        assert k2.status()["gpus"][0]["holder"] is not None, "the region was not adopted"

        def state() -> str:
            return str({t["id"]: t for t in k2.status()["tenants"]}[tenant]["state"])

        assert state() == "admitted"
        assert holder.wait(60) == 0, holder.stderr.read() if holder.stderr else ""
        wait_for(lambda: k2.status()["gpus"][0]["holder"] is None, what="the region's end")
        assert state() == "admitted"
        slots = granted["slots"]
        fd = slotmem.create(int(slots["size"]), bytes(slots["header"]))
        child = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
        k2.request("place", {"pid": child.pid, "slots_fd": fd}, tenant=tenant, token=token)
        assert state() == "running"
        k2.request("release", {"exit_code": 0}, tenant=tenant, token=token)
        os.close(fd)
    finally:
        if child is not None:
            child.kill()
            child.wait()
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_tenant_saved_holding_without_a_region_is_adopted_running(
    krexd_factory: Factory, restarter: Restarter
) -> None:
    """A state saved while a region was ending (no region saved, its holder not yet moved
    back) is adopted with no tenant holding: the holder is running again, as it would be."""
    import json

    k = krexd_factory(slots=4)
    (run,) = start_runs(k, [7], 4.0)
    wait_for(lambda: running(k, 1), what="a running tenant")
    restarter.kill(k)
    path = saved_state.path_for(k.workdir, k.cgroup_name)
    _, doc = saved_state.newest(path) or ("", {})
    assert doc["tenants"] and all(g["region"] is None for g in doc["gpus"].values())
    doc["tenants"][0]["state"] = "holding"
    doc["seq"] += 1
    with open(path, "wb") as f:  # the newest slot: the other one is older
        f.write(saved_state.encode(doc))
    with open(path + ".alt", "wb") as f:
        f.write(saved_state.encode(doc))
    k2 = restarter.start_again(k)
    states_now = [t["state"] for t in k2.status()["tenants"]]
    assert states_now == ["running"], (states_now, json.dumps(doc["tenants"][0])[:300])
    assert run.wait(60) == 7
    k2.stop()
