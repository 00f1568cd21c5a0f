"""Warm pools as krexd and krex run keep them: placement, isolation, fallbacks, limits, failures.

Real krexd, real cgroups, real pools (modules: json).  Each test asserts on
what a command observed or on what krexd reports (``status``'s ``warm``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.warm_support import PROBE, PY, SERVED, Pools, pid_alive, probe, warm_config
from tests.support import scrape, value, wait_for
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def test_a_warm_command_is_placed_before_its_first_line(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config())
    pools = Pools(k, tmp_path)
    pools.ready()
    got = probe(pools.warm([PY, str(PROBE)]))
    lines = got["cgroup"].splitlines()
    v2 = [ln for ln in lines if ln.startswith("0::")][0]
    assert v2.endswith(f"/{k.cgroup_name}/gpu0/tN"), got["cgroup"]
    # Not left in its pool's cgroups (v2, or the v1 memory hierarchy of hybrid hosts).
    assert "/pools/" not in got["cgroup"]
    row = pools.pools()[0]
    assert row["commands"] >= 2 and row["cgroup"].endswith(f"/pools/u0-p{row['pid']}")


_FIRST = """
import json, os, random, sys
json.leak = "from the first command"
leak_global = 1
os.environ["LEAK"] = "1"
fd = os.open("/dev/null", os.O_RDONLY)
os.set_inheritable(fd, True)
sys.modules["leaked_module"] = json
os.chdir("/")
print(json.dumps({"fd": fd, "random": random.random(), "pid": os.getpid()}))
"""
_SECOND = """
import __main__, json, os, random, sys
print(json.dumps({
    "json_leak": hasattr(json, "leak"), "global": "leak_global" in vars(__main__),
    "env": "LEAK" in os.environ, "cwd": os.getcwd(), "module": "leaked_module" in sys.modules,
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")
                  if f != os.environ.get("KREX_SLOTS_FD")),  # krex run's number for it varies
    "random": random.random(), "pid": os.getpid(),
}))
"""


def test_consecutive_warm_commands_share_nothing(krexd_factory: Factory, tmp_path: Path) -> None:
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    first = json.loads(pools.warm([PY, "-c", _FIRST], cwd=tmp_path).stdout)
    second = json.loads(pools.warm([PY, "-c", _SECOND], cwd=tmp_path).stdout)
    cold = json.loads(pools.cold([PY, "-c", _SECOND], cwd=tmp_path).stdout)
    assert second["pid"] != first["pid"]
    assert not (second["json_leak"] or second["global"] or second["env"] or second["module"])
    assert second["cwd"] == str(tmp_path)
    assert second["fds"] == cold["fds"]  # the first one's descriptor is not there
    assert second["random"] != first["random"]  # random is reseeded in every fork


@pytest.mark.parametrize(
    ("argv", "env", "why"),
    [
        (["sh", "-c", "echo hi"], {}, "is not a Python interpreter"),
        ([PY, "-O", "-c", "print('hi')"], {}, "no pool listens"),  # other options: other pool
        ([PY, "-x", "-c", "print('hi')"], {}, "interpreter option -x"),
        ([PY, "-i", "-c", "print('hi')"], {}, "interpreter option -i"),
        ([PY, "-c", "print('hi')"], {"TORCH_WARM_TEST": "1"}, "no pool listens"),  # key differs
        ([PY, "-c", "print('hi')"], {"PYTHONPATH": "rel/dir"}, "relative entry"),
        ([PY, "-c", "print('hi')"], {"PYTHONINSPECT": "1"}, "PYTHONINSPECT is set"),
        ([PY, str(PROBE) + ".missing"], {}, "No such file"),
    ],
)
def test_what_a_pool_cannot_serve_runs_cold(
    krexd_factory: Factory, tmp_path: Path, argv: list[str], env: dict[str, str], why: str
) -> None:
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    cold = pools.cold(argv, env={**pools.env, **env}, input="")
    warm = pools.warm(argv, served=False, env={**pools.env, **env}, input="")
    assert (warm.returncode, warm.stdout, warm.stderr) == (
        cold.returncode,
        cold.stdout,
        cold.stderr,
    )
    assert any(why in line for line in warm.debug), warm.debug  # type: ignore[attr-defined]


def test_a_variable_outside_the_key_reaches_a_warm_command(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    p = pools.warm(
        [PY, "-c", "import os; print(os.environ['MY_VAR'])"], env={**pools.env, "MY_VAR": "x y"}
    )
    assert p.stdout == "x y\n"


def test_pools_per_user_are_bounded_and_idle_ones_exit(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config(max_pools_per_uid=1, idle_s=3.0))
    pools = Pools(k, tmp_path)
    pools.ready()
    first = pools.pools()
    assert len(first) == 1
    other = {**pools.env, "TORCH_WARM_TEST": "1"}  # another key: a second pool is refused
    pools.warm([PY, "-c", "pass"], served=False, env=other)
    wait_for(lambda: k.status()["warm"]["refused"] >= 1, 20, "a refused registration")
    assert [p["pid"] for p in pools.pools()] == [first[0]["pid"]]
    assert "max_pools_per_uid" in pools.logs()
    # Idle for idle_s: the pool exits, krexd forgets it, its socket goes.
    wait_for(lambda: pools.pools() == [], 20, "the idle pool's end")
    wait_for(lambda: not pid_alive(first[0]["pid"]), 5, "the zygote's exit")
    assert not list(pools.dir.glob("*.sock"))
    pools.ready(env=other)  # now the other key gets its pool
    assert len(pools.pools()) == 1


def test_krexctl_status_shows_pools(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(config=warm_config())
    pools = Pools(k, tmp_path)
    pools.ready()
    row = pools.pools()[0]
    text = subprocess.run(
        [*k.krexctl, "status"], env=k.env, capture_output=True, text=True, timeout=30
    ).stdout
    line = [ln for ln in text.splitlines() if ln.startswith(str(row["pid"]))]
    assert line and "json" in line[0] and row["key"][:12] in line[0], text
    assert "warm pools" in text


def test_a_pool_killed_mid_command_gives_a_clear_line(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    zygote = pools.pools()[0]["pid"]
    started, done = tmp_path / "started", tmp_path / "done"
    prog = (
        f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(1.5); "
        f"pathlib.Path({str(done)!r}).touch()"
    )
    run = subprocess.Popen(
        [*pools.k.krex, "run", "--warm", "--", PY, "-c", prog],
        env=pools.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(started.exists, 20, "the command's start")
    os.kill(zygote, signal.SIGKILL)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 70, err
    assert "died while it ran: its exit status is unknown" in err
    assert done.exists()  # the command itself ran to its end
    wait_for(lambda: pools.pools() == [], 10, "krexd forgetting the dead pool")
    assert pools.k.status()["tenants"] == []


def test_timeout_kills_a_warm_command(krexd_factory: Factory, tmp_path: Path) -> None:
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    t0 = time.monotonic()
    p = pools.run("--warm", [PY, "-c", "import time; time.sleep(30)"], options=("--timeout", "1"))
    assert time.monotonic() - t0 < 15
    assert p.returncode == 124 and "timeout" in p.stderr, p.stderr
    assert SERVED in p.stderr


def test_auto_regions_act_in_a_pool_that_imported_krex_client(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    pools = Pools(krexd_factory(config=warm_config(modules=["json", "krex_client"])), tmp_path)
    probe_code = "import krex_client.implicit as i; print(i.enabled())"
    for extra, want in (((), "False\n"), (("--autoregion",), "True\n")):
        deadline = time.monotonic() + 60
        while True:  # the first run of each key starts its pool
            p = pools.run("--warm", [PY, "-c", probe_code], options=extra)
            if SERVED in p.stderr:
                break
            assert time.monotonic() < deadline, pools.logs()
            time.sleep(0.2)
        assert p.stdout == want, (extra, p.stderr)
        assert pools.run("--cold", [PY, "-c", probe_code], options=extra).stdout == want


def test_a_pool_is_held_to_its_memory_limit(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(config=warm_config(memory_max="256M"))
    pools = Pools(k, tmp_path)
    pools.ready()
    row = pools.pools()[0]
    cg = k.status()["warm"]["cgroups"]
    leaf = f"u0-p{row['pid']}"
    if cg["memory"] == "v2":
        limit = Path(row["cgroup"], "memory.max").read_text()
    elif cg["memory"] == "v1":
        limit = Path(cg["memory_root"], "pools", leaf, "memory.limit_in_bytes").read_text()
    else:
        pytest.skip("no memory controller on this host")
    assert int(limit) == 256 << 20
    with open(f"/proc/{row['pid']}/cgroup") as f:  # v2, and the v1 memory and pids trees
        want = 1 + (cg["memory"] == "v1") + (cg["pids"] == "v1")
        assert f.read().count(f"/pools/{leaf}") == want
    assert row["memory_bytes"] and row["memory_bytes"] > 1 << 20  # the zygote is charged


def test_krex_run_starts_warm_by_default_and_cold_on_request(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """``[warm] start = "warm"`` (the shipped default): no flag means warm, ``--cold`` cold."""
    k = krexd_factory(config=warm_config(start="warm"))
    pools = Pools(k, tmp_path)
    pools.ready()
    plain = pools.run("-v", [PY, "-c", "print(1)"])
    assert plain.returncode == 0 and plain.stdout == "1\n", plain.stderr
    assert SERVED in plain.stderr
    cold = pools.run("--cold", [PY, "-c", "print(1)"], options=("-v",))
    assert cold.returncode == 0 and cold.stdout == "1\n", cold.stderr
    assert SERVED not in cold.stderr and "krex: warm:" not in cold.stderr


def test_a_krexd_that_starts_cold_by_default_is_obeyed(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(config=warm_config(start="cold"))
    pools = Pools(k, tmp_path)
    pools.ready()  # a pool exists: only the default keeps this command cold
    plain = pools.run("-v", [PY, "-c", "print(1)"])
    assert plain.returncode == 0 and SERVED not in plain.stderr, plain.stderr
    # -v says so, as for a warm start krexd decided (krex replay records it).
    assert 'krex: warm: cold start: krexd\'s [warm] start is "cold"\n' in plain.stderr


def test_krexd_counts_cold_starts_by_the_reason_krex_run_gave(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """Each cold start's category reaches krexd with ``place``: status and the metrics."""
    k = krexd_factory(config={**warm_config(), "metrics": {"enabled": True, "port": 0}})
    pools = Pools(k, tmp_path)

    def reasons() -> dict[str, int]:
        return dict(k.status()["warm"]["cold_reasons"])

    first = pools.run("--warm", [PY, "-c", "pass"])
    assert first.returncode == 0 and SERVED not in first.stderr, first.stderr
    assert reasons() == {"no_pool": 1}  # no pool for its key yet: one starts
    pools.ready()
    before = reasons()
    assert pools.cold([PY, "-c", "pass"]).returncode == 0
    assert pools.warm(["sh", "-c", "true"], served=False).returncode == 0
    after = reasons()
    grew = {r: n - before.get(r, 0) for r, n in after.items() if n != before.get(r, 0)}
    assert grew == {"asked": 1, "command": 1}, (before, after)
    assert k.status()["warm"]["cold_starts"] == sum(after.values())
    m = scrape(k.status()["metrics"]["port"])
    for reason, n in after.items():
        assert value(m, "krex_cold_starts_by_reason_total", reason=reason) == n
    text = subprocess.run(
        [*k.krexctl, "status"], env=k.env, capture_output=True, text=True, timeout=30
    ).stdout
    starts = [ln for ln in text.splitlines() if ln.startswith("starts: ")]
    assert starts and "asked 1" in starts[0] and "command 1" in starts[0], text


def test_a_pool_at_its_task_limit_starts_the_command_cold(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    # pids_max = 1: the zygote itself is the one task its cgroup may hold, so no fork
    # succeeds; each command must start cold, with the reason, and run all the same.
    k = krexd_factory(config=warm_config(pids_max=1))
    if k.status()["warm"]["cgroups"]["pids"] == "none":
        pytest.skip("no pids controller for pools on this host")
    pools = Pools(k, tmp_path)
    first = pools.warm([PY, "-c", "print(6)"], served=False)  # starts the pool
    assert first.returncode == 0 and first.stdout == "6\n", first.stderr
    deadline = time.monotonic() + 30
    while not pools.pools():
        assert time.monotonic() < deadline, pools.logs()
        time.sleep(0.1)
    p = pools.warm([PY, "-c", "print(7)"], served=False)
    assert p.returncode == 0 and p.stdout == "7\n", p.stderr
    assert any("cannot fork" in ln for ln in p.debug), p.debug  # type: ignore[attr-defined]
    assert pools.pools(), "the pool outlived the refused fork"
