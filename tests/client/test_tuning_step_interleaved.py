"""A tuning step's configurations timed in interleaved repetitions, in its one region.

Over :class:`~tests.client.conftest.SimDevice` made the timing backend: each
stand-in configuration is a simulated kernel, and a finite ``drift_ms`` slows
the device as it works (the H200's clock under the step's own matmuls).  The
stand-in ``triton.testing.do_bench`` times on the same device, in turn, as
Triton's does (:func:`krex_client.testing.bench_loop`).
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from krex_client import implicit, testing, tuning_step, warmup
from krex_client._timing import summarize, use_backend

from .conftest import FakeConnection, SimDevice
from .test_implicit import _event_log
from .test_tuning_step import (
    _Settling,
    tuner_mod,  # noqa: F401 - the stand-in autotuner fixture
)
from .warmfakes import StandInShim, fake_pynvml

pytestmark = pytest.mark.usefixtures("clean_autoregion")

BASE_MS = {"first": 1.05, "second": 1.0, "third": 1.1}
"""Each configuration's time on a device that does not drift: ``second`` is fastest."""


class Tuned:
    """A stand-in autotuner over :data:`BASE_MS` on a :class:`SimDevice`, with a
    ``do_bench`` that times in turn and counts its calls."""

    def __init__(self, mod: types.ModuleType, dev: SimDevice, events: list[str]) -> None:
        self.dev, self.events, self.timed_in_turn = dev, events, 0
        self.fail_from: tuple[str, int] | None = None  # (configuration, n): its n-th call on raise
        self.calls: dict[str, int] = {}
        self.kernels = {name: dev.kernel(ms, name) for name, ms in BASE_MS.items()}
        self.mod = mod
        self.tuner: Any = None  # built once auto-regions are on (it takes its benchmarker then)

    def kernel(self, config: str, launch: bool = False) -> float:
        if launch:
            return BASE_MS[config]
        self.calls[config] = n = self.calls.get(config, 0) + 1
        if self.fail_from is not None and self.fail_from[0] == config and n >= self.fail_from[1]:
            raise self.mod.OutOfResources("shared memory")
        self.kernels[config]()
        return BASE_MS[config]

    def do_bench(
        self, fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"
    ):  # type: ignore[no-untyped-def]  # noqa: E501
        self.timed_in_turn += 1
        times = testing.bench_loop(self.dev, fn, warmup, rep, grad_to_none)
        return summarize(times, quantiles, return_mode)


@pytest.fixture
def tuned(
    tuner_mod: types.ModuleType,  # noqa: F811 - the imported fixture
    fake_krex: FakeConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Tuned]:
    events = _event_log(monkeypatch, fake_krex)
    dev = SimDevice(drift_ms=200.0)
    t = Tuned(tuner_mod, dev, events)
    monkeypatch.setattr(sys.modules["triton.testing"], "do_bench", t.do_bench)
    implicit.autoregion()
    t.tuner = tuner_mod.Autotuner(list(BASE_MS), t.kernel)
    with use_backend(dev):
        yield t


def test_step_times_its_configurations_interleaved_and_picks_by_speed(
    tuned: Tuned, fake_krex: FakeConnection
) -> None:
    assert tuned.tuner.run(1) == BASE_MS["second"]
    assert tuned.tuner.cache[(1,)] == "second"
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert tuned.timed_in_turn == 0  # every configuration's result came from the interleaving
    # Primed outside the region, one call each, then inside it the three estimates in
    # turn and the warm-up calls and repetitions of all three, interleaved.
    assert tuned.events[:4] == ["sync", "sync", "sync", "region_enter"]
    assert tuned.dev.log[:3] == list(BASE_MS)
    inside = tuned.dev.log[tuned.dev.log.index("record") :]
    reps = [op for op in inside if op in BASE_MS][15:]
    assert len(set(reps[:3])) == 3 and len(set(reps[-3:])) == 3
    # Triton's quantiles, median first, from each configuration's repetitions.
    for config, (median, q20, q80) in tuned.tuner.timings.items():
        assert q20 <= median <= q80 and median >= BASE_MS[config]


def test_sequential_order_lets_the_first_configuration_win_by_its_clock(
    tuned: Tuned, fake_krex: FakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What interleaving is for: the same step timed in turn picks ``first``."""
    monkeypatch.setenv(tuning_step.ORDER_VAR, "sequential")
    tuned.tuner.run(1)
    assert tuned.tuner.cache[(1,)] == "first"
    assert tuned.timed_in_turn == 3 and fake_krex.ops == ["region_enter", "region_exit"]


def test_unknown_order_warns_once_and_interleaves(
    tuned: Tuned, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tuning_step.ORDER_VAR, "shuffled")
    monkeypatch.setattr(warmup, "_warned", set())
    with pytest.warns(RuntimeWarning, match="KREX_AUTOTUNE_ORDER='shuffled'"):
        tuned.tuner.run(1)
    assert tuned.tuner.cache[(1,)] == "second" and tuned.timed_in_turn == 0


def test_configuration_failing_while_interleaved_is_timed_in_turn_and_fails_there(
    tuned: Tuned, fake_krex: FakeConnection
) -> None:
    """Its error comes out of its own ``_bench``, as it would have; the others are timed
    in turn in the same region."""
    tuned.fail_from = ("third", 4)  # primed (1st call), fails in its estimate (2nd-6th)
    tuned.tuner.run(1)
    assert tuned.tuner.timings["third"] == [float("inf")] * 3
    assert tuned.timed_in_turn == 3
    assert tuned.tuner.timings["second"][0] >= BASE_MS["second"]
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert tuned.dev.log.count("sync") >= 4  # the interrupted interleaving was synchronized


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (tuning_step.Priming("ran", lambda: None, {"warmup": 5}, "do_bench_cudagraph"), "graph"),
        (tuning_step.Priming("ran", lambda: None, {"use_stream": 1}, "do_bench"), "option"),
        (tuning_step.Priming("ran", lambda: None, {"return_mode": "p99"}, "do_bench"), "mode"),
        (tuning_step.Priming("ran", lambda: None, {"quantiles": (1.5,)}, "do_bench"), "q"),
        (tuning_step.Priming("ran", lambda: None, None, "do_bench"), "unbound"),
        (tuning_step.Priming("ran", lambda: None, {"device_type": "xpu"}, "do_bench"), "xpu"),
        (tuning_step.Priming("raised", lambda: None, {}, "do_bench"), "raised"),
        (tuning_step.Priming("ran", None, {}, "do_bench"), "no fn"),
    ],
)
def test_what_cannot_be_interleaved(record: tuning_step.Priming, why: str) -> None:
    assert record.interleavable() is None, why


def test_priming_keeps_the_call_and_its_budgets() -> None:
    fn: Any = lambda: None  # noqa: E731
    opts = {"warmup": 5, "rep": 40, "quantiles": (0.5, 0.2), "device_type": "cuda"}
    timed = tuning_step.Priming("ran", fn, opts, "do_bench").interleavable()
    assert timed is not None and timed.fn is fn
    assert (timed.warmup_ms, timed.rep_ms, timed.grad_to_none) == (5.0, 40.0, None)
    assert tuning_step.Priming("ran", fn, opts, "do_bench").result([1.0, 2.0, 3.0]) == [2.0, 1.4]


@pytest.mark.parametrize("order", ["interleaved", "sequential", "interleaved-then-failed"])
def test_interleaved_step_warms_as_any_region_and_in_turn_for_the_whole_budget(
    standin: tuple[StandInShim, FakeConnection],
    tuner_mod: types.ModuleType,  # noqa: F811 - the imported fixture
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    order: str,
) -> None:
    """Timed in turn, the first configurations would run at the clock the warm-up left;
    interleaved, all see the same clocks, and the ordinary warm-up (until warm) applies,
    also when a call failed in the loop and the configurations are then timed in turn."""
    shim, _ = standin
    gpu = _Settling()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpu))
    real_warm = shim.warm
    monkeypatch.setattr(shim, "warm", lambda us: (gpu.warm(us), real_warm(us))[1])
    monkeypatch.setattr(implicit, "_synchronize", lambda: None)
    log = tmp_path / "regions.jsonl"
    monkeypatch.setenv("KREX_REGION_LOG", str(log))
    monkeypatch.setenv(tuning_step.ORDER_VAR, order.split("-")[0])
    dev = SimDevice()
    kernels = {name: dev.kernel(ms, name) for name, ms in BASE_MS.items()}
    third_calls = []

    def kernel(config: str, launch: bool = False) -> float:
        if config == "third" and not launch and order.endswith("failed"):
            third_calls.append(1)
            if len(third_calls) == 4:  # primed, then fails in its estimate
                raise tuner_mod.OutOfResources("shared memory")
        kernels[config]()
        return BASE_MS[config]

    implicit.autoregion()
    tuner = tuner_mod.Autotuner(list(BASE_MS), kernel)
    with use_backend(dev):
        assert tuner.run(1) == BASE_MS["second"]
    assert len(third_calls) == (5 if order.endswith("failed") else 0)  # then timed in turn
    (rec,) = (json.loads(line) for line in log.read_text().splitlines())
    if order.startswith("interleaved"):
        assert rec["warmup"]["stop"] == "warm" and rec["warmup"]["slices"] == 1, rec["warmup"]
    else:
        assert rec["warmup"]["stop"] == "budget", rec["warmup"]
        assert rec["warmup"]["ms"] >= warmup.STEP_MS


def test_bench_override_timing_each_configuration_twice_gets_one_region(
    tuned: Tuned, fake_krex: FakeConnection
) -> None:
    """Triton calls ``_bench`` once per pruned entry and the step counts them; an
    override that calls the base twice (the better of two) must not end the step
    half-way and time the rest in regions of their own."""
    base = type(tuned.tuner)

    class TwiceTuner(base):  # type: ignore[misc, valid-type]
        def _bench(self, *args: Any, config: Any, **meta: Any) -> Any:
            first = super()._bench(*args, config=config, **meta)
            return min(first, super()._bench(*args, config=config, **meta))

    tuner = TwiceTuner(list(BASE_MS), tuned.kernel)
    assert tuner.run(1) == BASE_MS["second"]
    assert tuner.cache[(1,)] == "second"
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert tuned.timed_in_turn == 0


def test_bench_override_timing_twice_gets_a_fresh_result_each_time(
    tuned: Tuned, fake_krex: FakeConnection
) -> None:
    """Each ``do_bench`` returns a list of its own: an override that adjusts its first
    result in place (a launch overhead taken off) must not change the second."""
    base = type(tuned.tuner)
    seen: list[tuple[list[float], list[float]]] = []

    class InPlaceTuner(base):  # type: ignore[misc, valid-type]
        def _bench(self, *args: Any, config: Any, **meta: Any) -> Any:
            first = super()._bench(*args, config=config, **meta)
            served = list(first)
            first[0] -= 0.5  # in place, as an override may
            second = super()._bench(*args, config=config, **meta)
            seen.append((served, list(second)))
            return min(first, second)

    tuner = InPlaceTuner(list(BASE_MS), tuned.kernel)
    tuner.run(1)
    assert fake_krex.ops == ["region_enter", "region_exit"] and tuned.timed_in_turn == 0
    assert len(seen) == 3
    for served, second in seen:
        assert second == served


def test_same_autotuner_run_again_after_its_step_tunes_its_own_key(
    tuned: Tuned, fake_krex: FakeConnection
) -> None:
    """A step's interleaved results are its key's: the same autotuner run again for
    another key once the step ended (a launch hook of the kernel) is timed, not served."""
    other_ms = {"first": 5.0, "second": 9.0, "third": 7.0}  # key 2: ``first`` is fastest
    other = {name: tuned.dev.kernel(ms, name) for name, ms in other_ms.items()}
    inner: list[bool] = []

    def kernel(config: str, launch: bool = False) -> float:
        if launch:
            if not inner:
                inner.append(True)
                tuner.run(2)  # the same autotuner, another key
            return BASE_MS[config]
        (other if inner else tuned.kernels)[config]()
        return 0.0

    tuner = type(tuned.tuner)(list(BASE_MS), kernel)
    tuner.run(1)
    assert tuner.cache[(1,)] == "second"
    assert tuner.cache[(2,)] == "first", tuner.timings
