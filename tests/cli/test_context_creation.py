"""benchmarks/context_creation.py: its arithmetic, its handling of a ``krex run``
without ``--warm``, and a smoke run over the fake driver with a real krexd.

The smoke run starts 2 probes at once per mode (``--workload fake``: the
driver API through ctypes, no torch): natively and through ``krex run``
(the shim preloaded, the probes krex tenants), and ``warm`` when this
``krex run`` knows ``--warm`` (else reported unavailable).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "context_creation.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("context_creation", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_percentiles_and_phases(bench: ModuleType) -> None:
    assert bench.percentile([3.0, 1.0, 2.0, 4.0], 50) == pytest.approx(2.5)
    assert bench.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert bench.percentile([7.0], 95) == 7.0
    assert bench.phases({"interp": 0.5, "imported": 2.0, "first_op": 2.25}) == {
        "start": 0.5,
        "import": 1.5,
        "first_op": 0.25,
        "total": 2.25,
    }


def test_a_krex_run_that_rejects_warm_makes_the_mode_unavailable(
    bench: ModuleType, tmp_path: Path
) -> None:
    # A stand-in krex: its help names --warm, but run rejects it as argparse would.
    stub = tmp_path / "krex_stub.py"
    stub.write_text(
        "import sys\n"
        "if '--help' in sys.argv:\n"
        "    print('usage: krex run [--warm] ...')\n"
        "    sys.exit(0)\n"
        "sys.stderr.write('krex run: error: unrecognized arguments: --warm\\n')\n"
        "sys.exit(2)\n"
    )
    args = bench._args(["--socket", str(tmp_path / "none.sock"), "--krex", f"python3 {stub}"])
    b = bench.Bench(args)
    batch = b.batch("warm", 2)
    assert batch["unavailable"] == "krex run rejected --warm" and len(batch["failures"]) == 2
    # A krex whose help does not name --warm: unavailable without starting anything.
    stub.write_text("import sys\nprint('usage: krex run ...')\n")
    b = bench.Bench(args)
    assert b.batch("warm", 2)["unavailable"] == "krex run does not know --warm"
    (row,) = bench.summarize([batch])
    assert row["unavailable"] and row["ok"] == 0


@pytest.mark.root
@pytest.mark.slow
def test_smoke_over_the_fake_driver(
    krexd_factory: Any, fc: Any, shim_build: Any, tmp_path: Path
) -> None:
    k = krexd_factory(fake_gpus=1, slots=4)
    out = tmp_path / "ctx.json"
    argv = [sys.executable, str(BENCH), "--counts", "2", "--modes", "native,krex,warm"]
    argv += ["--workload", "fake", "--socket", k.socket, "--pause", "0", "--json", str(out)]
    p = subprocess.run(argv, env=fc.env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout)
    data = json.loads(out.read_text())
    rows = {r["mode"]: r for r in data["rows"]}
    assert set(rows) == {"native", "krex", "warm"}
    for mode in ("native", "krex"):
        r = rows[mode]
        assert r["n"] == 2 and r["ok"] == 2 and r["failed"] == 0 and not r["unavailable"]
        assert 0 < r["start"]["p50"] < r["total"]["p50"] and r["first_op"]["p50"] > 0
        assert f"{mode:9s}   2    2" in p.stdout
    assert rows["native"]["tenants"] == 0 and rows["krex"]["tenants"] == 2
    # krex run starts its own interpreter and is admitted before the probe's starts.
    assert rows["krex"]["start"]["p50"] > rows["native"]["start"]["p50"]
    for b in data["batches"]:
        for res in b["results"]:
            assert 0 < res["interp"] <= res["imported"] <= res["first_op"], res
    warm = rows["warm"]
    assert warm["unavailable"] or (warm["ok"] == 2 and warm["tenants"] == 2), warm
