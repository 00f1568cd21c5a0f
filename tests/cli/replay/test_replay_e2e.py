"""End-to-end replays of a small trace of simulated benchmarking commands.

native runs need nothing but Python; the krex run needs root, the built
shim and fake driver, and the krexd/krex commands.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from krex_cli.replay import report, trace
from krex_cli.replay.results import load_results

pytestmark = pytest.mark.slow  # full replays of simulated commands (seconds each)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BENCH = ROOT / "workloads" / "simulated.py"
# (task, candidate, kernel µs): three candidates per task, 5-20 % apart.
CANDIDATES = [
    ("t_short", "a", 1500.0),
    ("t_short", "b", 1700.0),
    ("t_short", "c", 1800.0),
    ("t_long", "x", 4000.0),
    ("t_long", "y", 4400.0),
    ("t_long", "z", 5000.0),
]


def write_trace(path: Path, fail: bool = False) -> list[trace.TraceEntry]:
    """A mixed-order trace of simulated commands (plus one failing command if asked)."""
    order = [0, 3, 1, 4, 2, 5]
    entries = []
    for i in order:
        task, cand, us = CANDIDATES[i]
        argv = [
            "python",
            str(BENCH),
            "--task",
            task,
            "--candidate",
            cand,
            "--kernel-us",
            str(us),
            "--reps",
            "15",
        ]
        entries.append(trace.TraceEntry(tuple(argv), task, cand, trace.band_of(us / 1000)))
    if fail:
        entries.insert(
            2,
            trace.TraceEntry(
                (
                    "python",
                    str(BENCH),
                    "--task",
                    "t_short",
                    "--candidate",
                    "broken",
                    "--kernel-us",
                    "10",
                    "--fail",
                ),
                "t_short",
                "broken",
                "<0.1ms",
            ),
        )
    trace.dump(entries, path)
    return entries


def replay(
    *args: str, timeout: float = 120.0, sleep: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m krex_cli.replay ARGS``; ``sleep``: kernels are sleeps, not fake launches."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "python_client"), env.get("PYTHONPATH", "")]
    )
    env.pop("SIMULATED_SLEEP", None)
    if sleep:
        env["SIMULATED_SLEEP"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "krex_cli.replay", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_native_runs_repeat_and_report(tmp_path: Path) -> None:
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr, fail=True)
    runs = tmp_path / "runs"
    p1 = replay(str(tr), "--mode", "native", "--fake-gpus", "2", "--out", str(runs / "native"))
    assert p1.returncode == 0, p1.stderr
    recs = load_results(runs / "native" / "results.jsonl")
    assert len(recs) == len(entries)
    assert sorted(r["seq"] for r in recs) == list(range(len(entries)))
    assert {r["gpu"] for r in recs} == {0, 1}
    broken = [r for r in recs if r["candidate"] == "broken"]
    assert broken[0]["exit_code"] == 3 and broken[0]["result"] is None
    assert "failing on purpose" in broken[0]["stderr_tail"]
    ok = [r for r in recs if r["candidate"] != "broken"]
    for r in ok:
        assert r["exit_code"] == 0 and r["end"] > r["start"]
        res = r["result"]
        # A sleep of N µs takes at least N µs: the command's own timing is real.
        want_ms = dict(((t, c), us / 1000) for t, c, us in CANDIDATES)[(r["task"], r["candidate"])]
        assert want_ms <= res["median_ms"] < want_ms * 2.0  # loose: a busy host oversleeps
        assert res["phases"]["exit_ms"] >= 0.0
        assert "admit_ms" not in res["phases"]  # natively nobody admits
    meta = json.loads((runs / "native" / "meta.json").read_text())
    assert meta["mode"] == "native" and meta["commands_run"] == len(entries)
    assert meta["commands_failed"] == 1

    # A second native run is the "native repeat"; --duration loops over the trace.
    p2 = replay(
        str(tr),
        "--mode",
        "native",
        "--fake-gpus",
        "1",
        "--duration",
        "3",
        "--out",
        str(runs / "repeat"),
    )
    assert p2.returncode == 0, p2.stderr
    recs2 = load_results(runs / "repeat" / "results.jsonl")
    assert len(recs2) > len(entries)  # looped past one pass
    assert max(r["pass"] for r in recs2) >= 1

    out = runs / "repeat" / "report"
    data = json.loads((out / "metrics.json").read_text())
    assert data["reference"] == "native"
    rep = data["runs"]["repeat"]
    assert rep["role"] == "native repeat"
    assert rep["throughput_cmds_per_min"] > 0
    for stat in ("median", "mean"):
        f = rep["stats"][stat]["fidelity"]
        assert f["n"] >= len(CANDIDATES)
        assert math.isfinite(f["P"]) and math.isfinite(f["median_ratio"])
        # Sleep-timed kernels repeat closely (loose bounds: a loaded CI machine oversleeps).
        assert 0.8 < f["median_ratio"] < 1.25
        flips = rep["stats"][stat]["flips"]
        assert sum(b["pairs"] for b in flips.values()) == 6  # 3 pairs per task
        assert set(rep["stats"][stat]["kendall_tau_b"]) == {"t_short", "t_long"}
    for name in (
        "report.md",
        "throughput.png",
        "phases.png",
        "ratio_cdf_median.png",
        "ratio_by_band_mean.png",
        "flip_rate_median.png",
        "kendall_cdf_mean.png",
    ):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "native repeat" in md and "Timing fidelity (median" in md

    # The explicit report command over both runs gives the same reference.
    p3 = replay(
        "report", str(runs / "native"), str(runs / "repeat"), "--out", str(tmp_path / "rep")
    )
    assert p3.returncode == 0, p3.stderr
    again = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert again["reference"] == "native"


def test_trace_without_bands_replays_and_bands_by_native_time(tmp_path: Path) -> None:
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr)
    tr.write_text(
        "".join(
            json.dumps({k: v for k, v in e.to_json().items() if k != "band"}) + "\n"
            for e in entries
        )
    )
    runs = tmp_path / "runs"
    for name in ("native", "repeat"):
        p = replay(str(tr), "--mode", "native", "--fake-gpus", "1", "--out", str(runs / name))
        assert p.returncode == 0, p.stderr
    recs = load_results(runs / "repeat" / "results.jsonl")
    assert len(recs) == len(entries) and all(r["band"] is None for r in recs)
    data = json.loads((runs / "repeat" / "report" / "metrics.json").read_text())
    bands = data["runs"]["repeat"]["stats"]["median"]["fidelity"]["bands"]
    # CANDIDATES: three 1.5-1.8 ms and three 4-5 ms kernels, all in the 1-10 ms band natively.
    assert bands["1-10ms"]["n"] == len(entries)


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    tr = tmp_path / "bad.jsonl"
    tr.write_text('{"argv": ["python"], "task": "t", "candidate": "c", "band": "huge"}\n')
    p = replay(str(tr), "--mode", "native", "--fake-gpus", "1", "--out", str(tmp_path / "o"))
    assert p.returncode == 1
    assert "bad.jsonl:1" in p.stderr and "'band'" in p.stderr
    good = tmp_path / "good.jsonl"
    write_trace(good)
    p = replay(
        str(good),
        "--mode",
        "serial",
        "--concurrency",
        "4",
        "--fake-gpus",
        "1",
        "--out",
        str(tmp_path / "o"),
    )
    assert p.returncode == 1 and "one command per GPU" in p.stderr
    p = replay("report", "--out", str(tmp_path / "r"))
    assert p.returncode == 1 and "at least one run directory" in p.stderr
    p = replay("report", str(tmp_path), "--out", str(tmp_path / "r"))
    assert p.returncode == 1 and "not a replay run directory" in p.stderr


def _krex_ready() -> str | None:
    """Why the krex-mode replay cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (cgroups)"
    for mod in ("krexd.cli.krexd", "krex_cli.main"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} does not exist yet"
    for lib in ("build/lib/libkrex_shim.so", "build/fakecuda/libcuda.so.1"):
        if not (ROOT / lib).is_file():
            return f"{lib} is not built (run make)"
    return None


@pytest.mark.root
def test_krex_replay_with_fake_gpu(tmp_path: Path) -> None:
    why = _krex_ready()
    if why is not None:
        pytest.skip(why)
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr)
    runs = tmp_path / "runs"
    p1 = replay(
        str(tr), "--mode", "native", "--fake-gpus", "1", "--out", str(runs / "native"), sleep=False
    )
    assert p1.returncode == 0, p1.stderr
    p2 = replay(
        str(tr),
        "--mode",
        "krex",
        "--concurrency",
        "3",
        "--fake-gpus",
        "1",
        "--out",
        str(runs / "krex"),
        timeout=240.0,
        sleep=False,
    )
    assert p2.returncode == 0, p2.stderr + (runs / "krex" / "krexd.log").read_text()
    recs = load_results(runs / "krex" / "results.jsonl")
    assert len(recs) == len(entries)
    assert all(r["exit_code"] == 0 for r in recs), [r.get("stderr_tail") for r in recs]
    meta = json.loads((runs / "krex" / "meta.json").read_text())
    assert meta["krexd_exit_code"] is not None and not meta["krexd_died"]
    data = json.loads((runs / "krex" / "report" / "metrics.json").read_text())
    k = data["runs"]["krex"]
    for stat in ("median", "mean"):
        f = k["stats"][stat]["fidelity"]
        assert f["n"] == len(entries) and math.isfinite(f["P"])
    assert (runs / "krex" / "report" / "report.md").is_file()
    assert report.find_runs(runs) == [runs / "krex", runs / "native"]
    for r in recs:  # krex run reports its admission wait (KREX_ADMIT_MS)
        assert r["result"]["phases"]["admit_ms"] >= 0.0
    # Each command's own region log (docs/design/region-log.md), summarized in the report.
    for r in recs:
        logged = (runs / "krex" / r["region_log"]).read_text().splitlines()
        assert len(logged) == 1 and json.loads(logged[0])["region_ms"] > 0.0
    assert k["regions"]["regions"] == len(entries)
    assert k["regions"]["region_ms"]["p50"] > 0.0
    assert data["runs"]["native"]["regions"]["regions"] == 0
    assert "## Regions" in (runs / "krex" / "report" / "report.md").read_text()


@pytest.mark.root
def test_socket_replay_fills_the_running_krexds_slots(
    krexd_factory: Callable[..., Any], tmp_path: Path
) -> None:
    k = krexd_factory(slots=4)
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr)
    for conc, out in ((None, "default"), ("2", "asked")):
        extra = [] if conc is None else ["--concurrency", conc]
        args = ["--mode", "krex", "--socket", k.socket, *extra, "--out", str(tmp_path / out)]
        p = replay(str(tr), *args, "--no-report")
        assert p.returncode == 0, p.stderr
        meta = json.loads((tmp_path / out / "meta.json").read_text())
        want = 4 if conc is None else 2
        assert meta["concurrency"] == want and meta["workers"] == want
        recs = load_results(tmp_path / out / "results.jsonl")
        assert len(recs) == len(entries) and all(r["exit_code"] == 0 for r in recs)


@pytest.mark.root
def test_replay_of_auto_slots_fills_the_started_krexds_derived_slots(tmp_path: Path) -> None:
    """slots_per_gpu = "auto" (shipped): the workers are the slots the started krexd derived.

    The memory rule gives 2 on the fake GPU's 80 GiB ((80 - 1) // 30), fewer than
    the cores' floor of 4 (what a replay used before it asked krexd).
    """
    why = _krex_ready()
    if why is not None:
        pytest.skip(why)
    config = tmp_path / "krex.toml"
    config.write_text(
        '[admission]\nslots_per_gpu = "auto"\n[memory]\ndefault_need = "30G"\n', encoding="utf-8"
    )
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr)
    out = tmp_path / "auto"
    args = ["--mode", "krex", "--fake-gpus", "1", "--config", str(config), "--no-report"]
    p = replay(str(tr), *args, "--out", str(out), timeout=240.0, sleep=False)
    assert p.returncode == 0, p.stderr
    assert "--concurrency 2: the slots per GPU its krexd derived" in p.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["concurrency"] == 2 and meta["workers"] == 2
    assert len(load_results(out / "results.jsonl")) == len(entries)


TEMPFAIL_ONCE = """
import json, os, sys

marker = sys.argv[1]
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(75)  # as krex run does when co-tenants' memory failed the command
print(json.dumps({"task": "t", "candidate": "c", "median_ms": 1.0, "mean_ms": 1.0,
                  "correct": True, "phases": {}}))
"""


@pytest.mark.root
def test_krex_replay_retries_co_tenant_memory_failures_and_passes_mem(tmp_path: Path) -> None:
    script = tmp_path / "tempfail_once.py"
    script.write_text(TEMPFAIL_ONCE)
    tr = tmp_path / "trace.jsonl"
    tr.write_text(
        json.dumps(
            {
                "argv": ["python", str(script), str(tmp_path / "marker")],
                "task": "t",
                "candidate": "c",
                "band": "1-10ms",
                "mem": "64M",
            }
        )
        + "\n"
    )
    out = tmp_path / "krex"
    p = replay(
        str(tr), "--mode", "krex", "--concurrency", "1", "--fake-gpus", "1", "--out", str(out)
    )
    assert p.returncode == 0, p.stderr
    (rec,) = load_results(out / "results.jsonl")
    assert rec["retries"] == 1 and rec["exit_code"] == 0 and rec["result"]["median_ms"] == 1.0
    # natively, 75 is just the command's own exit code: no retry
    (tmp_path / "marker").unlink()
    nat = tmp_path / "native"
    p = replay(str(tr), "--mode", "native", "--fake-gpus", "1", "--out", str(nat))
    (rec,) = load_results(nat / "results.jsonl")
    assert rec["retries"] == 0 and rec["exit_code"] == 75


@pytest.mark.root
def test_replay_alternates_warm_and_cold_starts(
    krexd_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli.warm_support import short_runtime_dir

    k = krexd_factory(slots=2, config={"warm": {"modules": ["json"], "idle_s": 60.0}})
    xdg = short_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    tr = tmp_path / "trace.jsonl"
    entries = write_trace(tr)
    out = tmp_path / "alt"
    args = ["--mode", "krex", "--socket", k.socket, "--repeat", "4", "--warm", "alternate"]
    p = replay(str(tr), *args, "--out", str(out), timeout=240.0)
    assert p.returncode == 0, p.stderr
    recs = load_results(out / "results.jsonl")
    assert len(recs) == 4 * len(entries) and all(r["exit_code"] == 0 for r in recs)
    asked = [r for r in recs if r["warm"]["asked"]]
    assert len(asked) == len(recs) // 2  # every other command, by pass and index
    assert all(r["warm"]["asked"] == ((r["pass"] + r["index"]) % 2 == 1) for r in recs)
    served = [r for r in asked if r["warm"]["served"]]
    assert served, [r["warm"] for r in asked]  # the first one started the pool
    assert all(r["warm"]["why"] for r in asked if not r["warm"]["served"])
    assert json.loads((out / "meta.json").read_text())["warm"] == "alternate"
    data = json.loads((out / "report" / "metrics.json").read_text())
    starts = data["runs"]["alt"]["starts"]
    assert starts["warm"]["commands"] == len(served)
    assert starts["cold"]["commands"] == len(recs) - len(served)
    assert "## Warm and cold starts" in (out / "report" / "report.md").read_text()
    p = replay(
        str(tr),
        "--mode",
        "native",
        "--fake-gpus",
        "1",
        "--warm",
        "on",
        "--out",
        str(tmp_path / "n"),
    )
    assert p.returncode != 0 and "krexd-backed modes only" in p.stderr


_PARENT = (
    "import json, os; "
    "print(json.dumps({'median_ms': 1.0, 'parent': open(f'/proc/{os.getppid()}/cmdline', "
    "'rb').read().decode(errors='replace')}))"
)


@pytest.mark.root
def test_replay_warm_off_starts_cold_whatever_krexd_s_default(
    krexd_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--warm off`` passes ``--cold``: under a krexd whose [warm] start is "warm" (as
    shipped) the replay's commands neither use nor start a warm pool."""
    from tests.cli.warm_support import Pools, short_runtime_dir, warm_config

    k = krexd_factory(slots=2, config=warm_config(start="warm"))
    xdg = short_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    pools = Pools(k, tmp_path)
    pools.env["XDG_RUNTIME_DIR"] = str(xdg)
    pools.ready()  # krex run without a flag would start warm here
    logs = sorted(pools.dir.glob("*.log"))
    tr = tmp_path / "trace.jsonl"
    entry = trace.TraceEntry((sys.executable, "-c", _PARENT), "t", "c", "<0.1ms")
    trace.dump([entry, entry], tr)
    out = tmp_path / "off"
    p = replay(str(tr), "--mode", "krex", "--socket", k.socket, "--warm", "off", "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = load_results(out / "results.jsonl")
    assert len(recs) == 2 and all(r["exit_code"] == 0 for r in recs), recs
    parents = [r["result"]["parent"] for r in recs]
    assert not any("krexpool" in x for x in parents), parents  # not forked from a pool
    # A warm start of the replay's own pool key would have started a pool for it.
    assert sorted(pools.dir.glob("*.log")) == logs


def _replay_by_default(
    krexd_factory: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start: str,
    *args: str,
) -> Path:
    """Two commands replayed with no ``--warm`` against a krexd whose [warm] start is
    ``start``; the run's folder (the replay must have succeeded)."""
    from tests.cli.warm_support import short_runtime_dir, warm_config

    k = krexd_factory(slots=2, config=warm_config(start=start))
    xdg = short_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    tr = tmp_path / "trace.jsonl"
    entry = trace.TraceEntry((sys.executable, "-c", _PARENT), "t", "c", "<0.1ms")
    trace.dump([entry, entry], tr)
    out = tmp_path / "auto"
    p = replay(str(tr), "--mode", "krex", "--socket", k.socket, "--out", str(out), *args)
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.root
def test_replay_by_default_starts_as_krexd_says(
    krexd_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--warm``: the replay measures krex as ``krex run`` users get it.  Under a krexd
    whose [warm] start is "warm" (as shipped) its commands start from a warm pool (the
    first starts the pool), and the records and the report say so."""
    out = _replay_by_default(krexd_factory, tmp_path, monkeypatch, "warm", "--repeat", "4")
    recs = load_results(out / "results.jsonl")
    assert len(recs) == 8 and all(r["exit_code"] == 0 for r in recs), recs
    assert all(r["warm"]["asked"] == "krexd" for r in recs), [r["warm"] for r in recs]
    served = [r for r in recs if r["warm"]["served"]]
    assert served, [r["warm"] for r in recs]  # the first command started the pool
    for r in recs:  # forked from a pool exactly when the record says so
        assert ("krexpool" in r["result"]["parent"]) == r["warm"]["served"], r
        assert r["warm"]["served"] or r["warm"]["why"], r["warm"]
    assert json.loads((out / "meta.json").read_text())["warm"] == "auto"
    data = json.loads((out / "report" / "metrics.json").read_text())
    assert data["runs"]["auto"]["starts"]["warm"]["commands"] == len(served)
    assert "## Warm and cold starts" in (out / "report" / "report.md").read_text()


@pytest.mark.root
def test_replay_by_default_starts_cold_under_a_cold_krexd(
    krexd_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--warm`` under a krexd whose [warm] start is "cold": cold, and the records say
    krexd decided it."""
    out = _replay_by_default(krexd_factory, tmp_path, monkeypatch, "cold", "--no-report")
    recs = load_results(out / "results.jsonl")
    assert len(recs) == 2 and all(r["exit_code"] == 0 for r in recs), recs
    assert not any("krexpool" in r["result"]["parent"] for r in recs)
    want = {"asked": "krexd", "served": False, "why": 'krexd\'s [warm] start is "cold"'}
    assert all(r["warm"] == want for r in recs), [r["warm"] for r in recs]
