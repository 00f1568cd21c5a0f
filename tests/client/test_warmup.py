"""The clock warm-up's policy and loop, and its place in a region, without krexd.

The loop (:func:`krex_client.warmup.warm_up`) runs over a fake clock that
moves only when the stand-in shim call "warms", so budgets and slices are
exact.  The region-level tests use the fake control connection and a
stand-in shim that notes whether krexd had granted the region at each
call.  End to end (real krexd, shim and fake driver):
tests/cli/test_region_warm.py.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from krex_client import warmup
from krex_client.region import region
from tests.client.conftest import FakeConnection
from tests.client.warmfakes import Gpu, StandInShim, fake_pynvml


def test_a_cold_clock_is_warmed_in_slices_within_the_budget() -> None:
    gpu = Gpu()  # never warms
    res = warmup.warm_up(gpu.warm, warmup.Policy(budget_ms=5.0), gpu.clock, 1980, 990, gpu.now)
    assert gpu.slices == [2000, 2000, 1000]  # the last slice is what the budget leaves
    assert res.ms == pytest.approx(5.0) and res.sm_clock_mhz == 990


def test_the_warm_up_stops_when_the_clock_is_warm() -> None:
    gpu = Gpu(warm_after_us=4000)
    res = warmup.warm_up(gpu.warm, warmup.Policy(), gpu.clock, 1980, 990, gpu.now)
    assert gpu.slices == [2000, 2000] and res.sm_clock_mhz == 1980
    assert res.ms == pytest.approx(4.0)
    # Warm at entry (90% of 1980 is 1782): nothing runs.
    gpu = Gpu()
    assert warmup.warm_up(gpu.warm, warmup.Policy(), gpu.clock, 1980, 1800, gpu.now) == (
        warmup.Result(0.0, 1800, stop="warm_at_entry", first_mhz=1800)
    )
    assert gpu.slices == []
    # A lower threshold: 990 MHz is 50% of the maximum.
    policy = warmup.Policy(pct=50.0)
    assert warmup.warm_up(gpu.warm, policy, gpu.clock, 1980, 990, gpu.now).ms == 0.0


def test_without_nvml_only_an_explicit_budget_warms() -> None:
    gpu = Gpu()
    assert warmup.warm_up(gpu.warm, warmup.Policy(), now=gpu.now) == warmup.Result(
        0.0, None, stop="no_clock"
    )
    # NVML present but the SM clock unreadable: the same rule.
    assert warmup.warm_up(gpu.warm, warmup.Policy(), lambda: None, 1980, None, gpu.now).ms == 0.0
    assert gpu.slices == []
    explicit = warmup.Policy(budget_ms=7.5, explicit=True)
    res = warmup.warm_up(gpu.warm, explicit, now=gpu.now)
    assert res.ms == pytest.approx(7.5) and res.sm_clock_mhz is None
    assert gpu.slices == [7500]  # one fixed call: no clock to read between slices
    assert warmup.warm_up(gpu.warm, warmup.Policy(budget_ms=0.0, explicit=True)).ms == 0.0


def test_a_failed_or_empty_slice_stops_the_warm_up() -> None:
    gpu = Gpu()
    calls: list[int] = []

    def failing(us: int) -> int:
        calls.append(us)
        return -700  # CUDA_ERROR_ILLEGAL_ADDRESS

    res = warmup.warm_up(failing, warmup.Policy(), gpu.clock, 1980, 990, gpu.now)
    assert calls == [2000] and res.error == "CUresult 700" and res.stop == "failed"

    def nothing(us: int) -> int:
        calls.append(us)
        return 0  # no context: nothing to warm with

    calls.clear()
    res = warmup.warm_up(nothing, warmup.Policy(), gpu.clock, 1980, 990, gpu.now)
    assert calls == [2000] and res.error is None and res.stop == "nothing_to_warm"


def test_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warmup.PCT_VAR, raising=False)
    monkeypatch.delenv(warmup.MS_VAR, raising=False)
    assert warmup.Policy.from_env() == warmup.Policy(90.0, 100.0, explicit=False)
    monkeypatch.setenv(warmup.PCT_VAR, "75")
    monkeypatch.setenv(warmup.MS_VAR, "12.5")
    assert warmup.Policy.from_env() == warmup.Policy(75.0, 12.5, explicit=True)
    monkeypatch.setenv(warmup.MS_VAR, "0")
    assert warmup.Policy.from_env().budget_ms == 0.0
    monkeypatch.setenv(warmup.PCT_VAR, "150")
    monkeypatch.setenv(warmup.MS_VAR, "lots")
    monkeypatch.setattr(warmup, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warmup.Policy.from_env() == warmup.Policy(90.0, 100.0, explicit=False)
        warmup.Policy.from_env()
    assert sorted(str(w.message).split("=")[0] for w in caught) == [
        f"krex_client: {warmup.MS_VAR}",
        f"krex_client: {warmup.PCT_VAR}",
    ]  # once each


def test_a_region_warms_a_cold_clock_after_the_grant(
    standin: tuple[StandInShim, FakeConnection],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shim, conn = standin
    # The stand-in shim call does not sleep: the clock warms after 3 slices.
    gpu = Gpu()
    real_warm = shim.warm

    def warm(us: int) -> int:
        gpu.warm(us)
        if len(shim.warm_calls) >= 2:
            gpu.warm_after_us = 0
        return real_warm(us)

    monkeypatch.setattr(shim, "warm", warm)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpu))
    monkeypatch.setenv("KREX_REGION_LOG", str(tmp_path / "log"))
    with region.critical():
        assert len(shim.warm_calls) == 3  # before the region's code runs
    with region.critical():
        pass  # warm at entry: no warm-up
    assert shim.warm_calls == [(2000, True)] * 3  # each inside the granted region
    assert conn.ops == ["region_enter", "region_exit"] * 2
    first, second = (json.loads(line) for line in (tmp_path / "log").read_text().splitlines())
    assert first["entry"]["sm_clock_mhz"] == 990 and first["warmed"] == {"sm_clock_mhz": 1980}
    assert first["warmup_ms"] > 0.0 and first["warnings"] == []
    assert second["warmup_ms"] == 0.0 and second["warmed"] == {"sm_clock_mhz": 1980}
    assert region.stats()["warmup_ms"] == 0.0


def test_a_clock_still_cold_after_the_warm_up_warns(
    standin: tuple[StandInShim, FakeConnection],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shim, _ = standin
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(Gpu()))
    monkeypatch.setenv("KREX_REGION_LOG", str(tmp_path / "log"))
    monkeypatch.setenv(warmup.MS_VAR, "3")
    with region.critical():
        pass
    assert [us for us, _ in shim.warm_calls][:1] == [2000]
    (rec,) = (json.loads(line) for line in (tmp_path / "log").read_text().splitlines())
    assert rec["warmup_ms"] >= 3.0 and rec["warmed"] == {"sm_clock_mhz": 990}
    (warning,) = rec["warnings"]
    assert warning["kind"] == "cold_clock" and "after" in warning["message"]


def test_no_warm_up_without_nvml_or_when_turned_off(
    standin: tuple[StandInShim, FakeConnection], monkeypatch: pytest.MonkeyPatch
) -> None:
    shim, _ = standin
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with region.critical():
        pass
    assert shim.warm_calls == [] and region.stats()["warmup_ms"] == 0.0
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(Gpu()))
    monkeypatch.setattr(region, "_device", None)
    monkeypatch.setenv(warmup.MS_VAR, "0")
    with region.critical():
        pass
    assert shim.warm_calls == []


def test_tuning_step_policy_runs_its_whole_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warmup.PCT_VAR, raising=False)
    monkeypatch.delenv(warmup.MS_VAR, raising=False)
    assert warmup.Policy.for_tuning_step() == warmup.Policy(100.0, warmup.STEP_MS)
    # Set explicitly, the variables apply as to any region.
    monkeypatch.setenv(warmup.PCT_VAR, "75")
    assert warmup.Policy.for_tuning_step() == warmup.Policy(75.0, warmup.STEP_MS)
    monkeypatch.setenv(warmup.MS_VAR, "0")
    assert warmup.Policy.for_tuning_step() == warmup.Policy(75.0, 0.0, explicit=True)


def test_tuning_step_policy_ignores_an_invalid_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warmup.MS_VAR, raising=False)
    monkeypatch.setenv(warmup.PCT_VAR, "hot")
    monkeypatch.setattr(warmup, "_warned", set())
    with pytest.warns(RuntimeWarning, match="KREX_REGION_WARM_PCT='hot'"):
        assert warmup.Policy.for_tuning_step() == warmup.Policy(100.0, warmup.STEP_MS)
