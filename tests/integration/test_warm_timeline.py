"""Warm commands are gated exactly as cold ones: the fake driver's timeline as the witness.

The pool's zygote loads the shim with ``KREX_SHIM_DEFER=1`` and imports
``fakegpu`` (no driver call); each command forked from it initialises the
shim from its own tenant variables at its first driver call.  Siblings and
the holder all start warm; no sibling kernel may run inside any region
(tests/integration/test_timeline.py does the same cold, and shows that the
check finds overlaps when regions are not enforced).  A pool whose imports
call the driver refuses to serve, and its commands start cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.warm_support import SERVED, Pools, warm_config
from tests.fakecuda import timeline
from tests.support import REPO, fake_driver_env
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]
FAKECUDA = REPO / "tests" / "fakecuda"
PROGS = Path(__file__).resolve().parent / "progs"
HOLDER = PROGS / "timeline_holder.py"


def _env(pools: Pools, workdir: str) -> dict[str, str]:
    return dict(
        fake_driver_env(pools.env, workdir),
        # The caller's PYTHONPATH, if any (CI runs the installed package without one).
        PYTHONPATH=os.pathsep.join(
            p for p in (pools.env.get("PYTHONPATH"), str(FAKECUDA), str(PROGS)) if p
        ),
    )


def test_warm_siblings_never_run_inside_a_warm_holders_region(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(slots=6, config=warm_config(modules=["fakegpu", "json"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    sibling = [
        sys.executable,
        str(FAKECUDA / "fakegpu.py"),
        "--seconds",
        "300",
        "--sync-every",
        "4",
    ]
    sibs = [
        subprocess.Popen(
            [
                *k.krex,
                "run",
                "--warm",
                "-v",
                "--",
                *sibling,
                "--kernel-ns",
                str(50_000 + 25_000 * i),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        run = pools.warm([sys.executable, str(HOLDER), "150", "7"], env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        for s in sibs:
            s.terminate()
        errs = [s.communicate(timeout=30)[1] for s in sibs]
    assert all(SERVED in e for e in errs), errs  # every sibling started warm
    out = json.loads(run.stdout.strip().splitlines()[-1])
    holder, regions = out["pid"], out["regions"]
    records = timeline.read(os.path.join(k.workdir, "timeline"))
    assert len(regions) == 150
    siblings = {r.pid for r in records if r.pid != holder}
    assert len(siblings) == 4, "all four warm siblings must have launched"
    assert sum(1 for r in records if r.pid != holder) > 200
    overlaps = sum(len(timeline.overlapping(records, s, e, exclude_pid=holder)) for s, e in regions)
    assert overlaps == 0


_ACTIVE = "import ctypes; print(ctypes.CDLL(None).krex_shim_active())"


def test_a_warm_command_initialises_the_shim_from_its_own_tenant(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config(modules=["fakegpu"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    prog = "import fakegpu; fakegpu.init().launch(1000); " + _ACTIVE
    warm = pools.warm([sys.executable, "-c", prog], env=env)
    cold = pools.cold([sys.executable, "-c", prog], env=env)
    assert warm.stdout == cold.stdout == "1\n", (warm.stderr, cold.stderr)


def test_a_pool_whose_imports_call_the_driver_refuses_to_serve(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config(modules=["json", "gpu_at_import"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    first = pools.warm([sys.executable, "-c", _ACTIVE], served=False, env=env)
    assert first.stdout == "1\n"
    refused = _wait_refused(pools)
    assert "CUDA driver" in refused
    again = pools.warm([sys.executable, "-c", _ACTIVE], served=False, env=env)
    assert again.stdout == "1\n"  # cold, gated
    assert any("refused to serve" in ln for ln in again.debug)  # type: ignore[attr-defined]
    assert pools.pools() == []


def test_a_pool_whose_imports_only_load_the_driver_serves(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    """``import torch`` maps libcuda.so on some builds without calling it: no reason to refuse."""
    k = krexd_factory(config=warm_config(modules=["driver_loaded_at_import", "fakegpu"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    prog = "import fakegpu; fakegpu.init().launch(1000); " + _ACTIVE
    warm = pools.warm([sys.executable, "-c", prog], env=env)
    assert warm.stdout == "1\n", warm.stderr  # served warm, and its shim gates


def _wait_refused(pools: Pools) -> str:
    deadline = time.monotonic() + 60
    while True:
        found: list[Any] = list(pools.dir.glob("*.refused"))
        if found:
            return str(found[0].read_text())
        assert time.monotonic() < deadline, pools.logs()
        time.sleep(0.1)


def test_a_pool_whose_threads_stop_at_a_fork_serves(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    """OpenBLAS (imported with torch through numpy) starts a thread per core but one."""
    k = krexd_factory(config=warm_config(modules=["pool_fork_aware"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    prog = "import threading; print(threading.active_count())"
    warm = pools.warm([sys.executable, "-c", prog], env=env)
    assert warm.stdout == "1\n", warm.stderr


def test_a_pool_whose_imports_leave_a_thread_running_refuses_to_serve(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config(modules=["pool_thread_stays"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.warm([sys.executable, "-c", "pass"], served=False, env=env)
    refused = _wait_refused(pools)
    assert "1 thread(s) running that do not stop at a fork" in refused, refused


_LONG_REGION = """
import json, os, time, fakegpu
from krex_client import region
gpu = fakegpu.init()
with region.critical():
    start = time.monotonic_ns()
    open(INSIDE, "w").close()
    time.sleep(1.5)
    gpu.launch(1000)
    gpu.synchronize()
    end = time.monotonic_ns()
print(json.dumps({"pid": os.getpid(), "start": start, "end": end}))
"""
_FIRST_LINE = (
    "import time; t = time.monotonic_ns(); import fakegpu; g = fakegpu.init(); "
    "g.launch(1000); g.synchronize(); print(t)"
)


def _inside_a_region(
    k: Krexd, env: dict[str, str], tmp_path: Path, act: Callable[[], None]
) -> dict[str, Any]:
    """Run ``act()`` while a cold holder is inside a 1.5 s region; the holder's report
    (``pid``, region ``start`` and ``end`` in CLOCK_MONOTONIC ns)."""
    inside = tmp_path / "inside"
    holder = subprocess.Popen(
        [*k.krex, "run", "--cold", "--", sys.executable, "-c"]
        + [f"INSIDE = {str(inside)!r}\n" + _LONG_REGION],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not inside.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.02)
        act()
        out, err = holder.communicate(timeout=30)
    finally:
        holder.kill()
    assert holder.returncode == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_a_pool_forking_during_a_region_starts_its_command_frozen(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    """The pool (outside every tenant) forks, krexd places and ``krex run`` says ``go`` while
    a holder is inside its region: the command's first line and kernel come after the region."""
    k = krexd_factory(config=warm_config(modules=["fakegpu", "json"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    seen: list[Any] = []
    warm = [sys.executable, "-c", _FIRST_LINE]
    region = _inside_a_region(k, env, tmp_path, lambda: seen.append(pools.warm(warm, env=env)))
    (sibling,) = seen
    assert sibling.returncode == 0, sibling.stderr
    assert int(sibling.stdout) > region["end"], "the warm command ran inside the region"
    records = timeline.read(os.path.join(k.workdir, "timeline"))
    assert timeline.overlapping(records, region["start"], region["end"], region["pid"]) == []


def _frozen(directory: str) -> bool:
    with open(os.path.join(directory, "cgroup.events")) as f:
        return "frozen 1" in f.read().split("\n")


def test_pools_stand_still_during_a_region(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    """A pool runs code from files commands can write (its imports), outside every tenant:
    every region freezes the pools with its siblings and thaws them with them."""
    k = krexd_factory(config=warm_config(modules=["fakegpu", "json"]))
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    pools.ready(env=env)
    (row,) = pools.pools()
    pools_dir = os.path.dirname(row["cgroup"])
    assert not _frozen(pools_dir)
    during: list[bool] = []
    _inside_a_region(
        k, env, tmp_path, lambda: during.append(_frozen(pools_dir) and _frozen(row["cgroup"]))
    )
    assert during == [True], "the pools ran during the region"
    assert not _frozen(pools_dir), "the pools stayed frozen after the region"
    assert pools.warm([sys.executable, "-c", "print(1)"], env=env).stdout == "1\n"


_SITE = """
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "log"), "a") as f:
    f.write(f"{os.getpid()} {open('/proc/self/cgroup').read().split(':')[-1].strip()}\\n")
"""


def test_a_pools_interpreter_start_up_runs_in_the_pool(
    built: None, krexd_factory: Factory, tmp_path: Path
) -> None:
    """sitecustomize and .pth files are the user's files, which commands can write: the
    zygote's interpreter starts only once krexd moved its process into the pool's cgroup."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    # krexd takes 1 s over the registration: time enough for an interpreter that
    # started before it to run its start-up outside the pool.
    k = krexd_factory(
        config=warm_config(modules=["json"]),
        env={"KREX_TEST_PAUSE_AT": "pool_register", "KREX_TEST_PAUSE_S": "1.0"},
    )
    pools = Pools(k, tmp_path)
    env = _env(pools, k.workdir)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    pools.ready(env=env)
    (row,) = pools.pools()
    lines = dict(ln.split(" ", 1) for ln in (site / "log").read_text().splitlines())
    assert str(row["pid"]) in lines, lines
    assert row["cgroup"].endswith(lines[str(row["pid"])]), (row["cgroup"], lines)
