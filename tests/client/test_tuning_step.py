"""Auto-regions for Triton's autotuner: one region per tuning step, compiles primed outside.

A stand-in ``triton.runtime.autotuner`` (:data:`TUNER_MODULE`) has Triton
3.6's ``run``/``prune_configs``/``_bench`` structure over the stub
``triton.testing`` of ``test_implicit``, with a ``do_bench`` that reports
what the timed call returned.  ``_event_log`` interleaves the region requests
and device synchronizations with each kernel call, marked ``:in`` or ``:out``
of a region, so each test reads the order in which a tuning step ran.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from krex_client import implicit, tuning_step, warmup
from krex_client.region import region

from .conftest import FakeConnection
from .test_implicit import _event_log, _install_stubs, _marker
from .warmfakes import Gpu, StandInShim, fake_pynvml

pytestmark = pytest.mark.usefixtures("clean_autoregion")

TUNER_MODULE = textwrap.dedent(
    """
    import builtins

    class OutOfResources(Exception):
        pass

    class Autotuner:
        def __init__(self, configs, kernel, own_benchmarker=None):
            self.configs, self.kernel, self.cache = configs, kernel, {}
            from triton.testing import do_bench as benchmarker  # Triton 3.2/3.3
            self.do_bench = own_benchmarker or benchmarker

        def prune_configs(self, kwargs):
            return [c for c in self.configs if c != kwargs.get("prune")]

        def _bench(self, *args, config, **meta):
            def kernel_call():
                return self.kernel(config)
            try:
                return self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))
            except OutOfResources:
                return [float("inf")] * 3

        def run(self, *args, **kwargs):
            key = args
            if key not in self.cache:
                pruned = self.prune_configs(kwargs)
                timings = {c: self._bench(*args, config=c, **kwargs) for c in pruned}
                self.timings = timings
                self.cache[key] = builtins.min(timings, key=timings.get)
            return self.kernel(self.cache[key], launch=True)
    """
)

MS = {"a": 3.0, "b": 1.0, "c": 2.0, "bad": 0.5}
"""Each stand-in configuration's time (ms): ``b`` is the fastest that runs."""


@pytest.fixture
def tuner_mod(monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection) -> types.ModuleType:
    stubs = _install_stubs(monkeypatch, fake_krex)

    def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):  # type: ignore[no-untyped-def]
        ms = fn()
        return [ms] * len(quantiles) if quantiles else ms

    stubs["testing"].do_bench = do_bench
    mod = types.ModuleType("triton.runtime.autotuner")
    exec(TUNER_MODULE, mod.__dict__)  # noqa: S102 - the test's own source
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection) -> list[str]:
    """The event log of ``_event_log``, with auto-regions turned on."""
    log = _event_log(monkeypatch, fake_krex)
    implicit.autoregion()
    return log


def _kernel(events: list[str], conn: FakeConnection, mod: types.ModuleType) -> Any:
    mark = _marker(events, conn)

    def kernel(config: str, launch: bool = False) -> float:
        mark(f"launch {config}" if launch else config)
        if config == "bad":
            raise mod.OutOfResources("shared memory")
        if config == "boom":
            raise ValueError("kernel failed")
        return MS[config]

    return kernel


PRIMED_STEP = [
    *("a:out", "sync", "b:out", "sync", "c:out", "sync"),
    *("region_enter", "a:in", "b:in", "c:in", "region_exit"),
]
"""A tuning step over a, b, c: each primed outside, then all timed in one region."""


def test_step_is_one_region_after_priming_every_configuration_outside(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    tuner = tuner_mod.Autotuner(["a", "b", "c"], _kernel(events, fake_krex, tuner_mod))
    assert tuner.run(4096) == 1.0
    assert events == [*PRIMED_STEP, "launch b:out"]
    assert tuner.timings == {"a": [3.0] * 3, "b": [1.0] * 3, "c": [2.0] * 3}
    events.clear()
    tuner.run(4096)  # cached: no step, no region
    assert events == ["launch b:out"]
    events.clear()
    tuner.run(2048, prune="a")  # a new key: a step over the pruned configurations
    assert events == [
        *("b:out", "sync", "c:out", "sync"),
        *("region_enter", "b:in", "c:in", "region_exit", "launch b:out"),
    ]


def test_config_scope_is_one_region_per_configuration(
    tuner_mod: types.ModuleType, fake_krex: FakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _event_log(monkeypatch, fake_krex)
    monkeypatch.setenv(tuning_step.SCOPE_VAR, "config")
    implicit.autoregion()
    tuner_mod.Autotuner(["a", "b"], _kernel(events, fake_krex, tuner_mod)).run(1)
    assert events == [
        *("a:out", "sync", "region_enter", "a:in", "region_exit"),
        *("b:out", "sync", "region_enter", "b:in", "region_exit", "launch b:out"),
    ]
    # Another value warns once and the default (one region per step) applies.
    monkeypatch.setenv(tuning_step.SCOPE_VAR, "bogus")
    monkeypatch.setattr(warmup, "_warned", set())
    with pytest.warns(RuntimeWarning, match="KREX_AUTOTUNE_REGION='bogus'"):
        tuner_mod.Autotuner(["a", "b"], _kernel(events, fake_krex, tuner_mod)).run(1)
    assert fake_krex.ops.count("region_enter") == 3


def _tolerant(mod: types.ModuleType, caught: type[Exception]) -> Any:
    """A subclass of the stand-in autotuner whose ``_bench`` times ``caught`` as infinite."""

    class Tolerant(mod.Autotuner):  # type: ignore[misc,name-defined]
        def _bench(self, *args: Any, config: str, **meta: Any) -> Any:
            try:
                return super()._bench(*args, config=config, **meta)
            except caught:
                return [float("inf")] * 3

    return Tolerant


def test_configuration_that_fails_to_compile_is_not_run_again_in_the_region(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    tuner = tuner_mod.Autotuner(["a", "bad", "c"], _kernel(events, fake_krex, tuner_mod))
    assert tuner.run(1) == 2.0
    assert events == [
        *("a:out", "sync", "bad:out", "c:out", "sync"),
        *("region_enter", "a:in", "c:in", "region_exit", "launch c:out"),
    ]
    assert tuner.timings["bad"] == [float("inf")] * 3  # what Triton's _bench returned


def test_exceptions_leave_no_region_and_no_step_behind(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    kernel = _kernel(events, fake_krex, tuner_mod)
    # Raised while priming: out of that configuration's own _bench, as out of its timing.
    with pytest.raises(ValueError, match="kernel failed"):
        tuner_mod.Autotuner(["a", "boom", "c"], kernel).run(1)
    assert events == [
        *("a:out", "sync", "boom:out", "c:out", "sync", "region_enter", "a:in", "region_exit")
    ]
    # The first configuration raised: no region at all.
    events.clear()
    with pytest.raises(ValueError, match="kernel failed"):
        tuner_mod.Autotuner(["boom", "a"], kernel).run(1)
    assert events == ["boom:out", "a:out", "sync"]
    # Raised inside the region (the configuration primed, then failed timed): region left.
    events.clear()
    calls = {"boom": 0}

    def flaky(config: str, launch: bool = False) -> float:
        if config == "boom":
            calls["boom"] += 1
            if calls["boom"] == 2:
                events.append(f"boom:{'in' if fake_krex.held else 'out'}")
                raise ValueError("kernel failed")
            return 1.0
        return kernel(config, launch)

    with pytest.raises(ValueError, match="kernel failed"):
        tuner_mod.Autotuner(["a", "boom"], flaky).run(1)
    assert events == ["a:out", "sync", "sync", "region_enter", "a:in", "boom:in", "region_exit"]
    assert not fake_krex.held and not region.inside()
    assert tuning_step._steps() == {}
    # The same tuner works afterwards, with a step of its own.
    events.clear()
    tuner = tuner_mod.Autotuner(["a", "b", "c"], kernel)
    tuner.run(1)
    assert events == [*PRIMED_STEP, "launch b:out"]


def test_explicit_region_covers_the_step_and_own_benchmarker_is_not_primed(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    kernel = _kernel(events, fake_krex, tuner_mod)
    with region.critical():
        tuner_mod.Autotuner(["a", "b"], kernel).run(1)
    assert events == ["region_enter", "a:in", "b:in", "launch b:in", "region_exit"]
    # A benchmarker krex did not patch: the step's region covers the compiles too.
    events.clear()
    own = lambda fn, quantiles: [fn()] * len(quantiles)  # noqa: E731
    tuner_mod.Autotuner(["a", "b"], kernel, own).run(1)
    assert events == ["region_enter", "a:in", "b:in", "region_exit", "launch b:out"]


def test_off_krex_a_step_changes_nothing(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    monkeypatch: pytest.MonkeyPatch,
    events: list[str],
) -> None:
    monkeypatch.delenv("KREX_SOCKET")
    monkeypatch.setattr(region, "_warned", False)
    with pytest.warns(RuntimeWarning, match="not running under"):
        tuner_mod.Autotuner(["a", "b"], _kernel(events, fake_krex, tuner_mod)).run(1)
    assert events == ["a:out", "b:out", "launch b:out"]  # each configuration called once


class _Settling(Gpu):
    """Cold (990 MHz) at entry; after the first slice at 1800 MHz: above 90% of
    the 1980 MHz maximum, below it."""

    def clock(self) -> int:
        return 1800 if self.warmed_us else self.cold_mhz


def test_step_region_warms_for_its_whole_budget(
    standin: tuple[StandInShim, FakeConnection],
    tuner_mod: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shim, conn = standin
    implicit.autoregion()
    log = tmp_path / "regions.jsonl"
    monkeypatch.setenv("KREX_REGION_LOG", str(log))
    monkeypatch.setattr(implicit, "_synchronize", lambda: None)
    gpus: list[_Settling] = []
    real_warm = shim.warm

    def warm(us: int) -> int:
        gpus[-1].warm(us)
        return real_warm(us)

    monkeypatch.setattr(shim, "warm", warm)

    def cold_gpu() -> None:
        gpus.append(_Settling())
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus[-1]))
        monkeypatch.setattr(region, "_device", None)
        monkeypatch.setattr(region, "_recorder", None)

    cold_gpu()
    tuner_mod.Autotuner(["a", "b"], lambda config, launch=False: MS.get(config, 0.0)).run(1)
    cold_gpu()
    sys.modules["triton.testing"].do_bench(lambda: None)  # a plain auto-region
    step, plain = (json.loads(line)["warmup"] for line in log.read_text().splitlines())
    # The step's region ran its whole 200 ms budget although the clock read 91% after
    # one slice; a do_bench region stopped there.
    assert step["stop"] == "budget" and step["ms"] >= warmup.STEP_MS, step
    assert step["budget_ms"] == warmup.STEP_MS
    assert plain["stop"] == "warm" and plain["slices"] == 1, plain
    assert conn.ops == ["region_enter", "region_exit"] * 2


def test_autotuned_kernel_launched_while_priming_is_tuned_on_its_own(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    """A hook of one configuration launches another autotuned kernel (a new key)."""
    kernel = _kernel(events, fake_krex, tuner_mod)
    inner = tuner_mod.Autotuner(["a", "b", "c"], kernel)

    def outer_kernel(config: str, launch: bool = False) -> float:
        inner.run("inner")  # tuned at the outer step's first (priming) call
        return MS[config]

    assert tuner_mod.Autotuner(["c", "b"], outer_kernel).run(1) == 1.0
    # The inner step timed its own configurations, not the priming's placeholders.
    assert inner.timings == {"a": [3.0] * 3, "b": [1.0] * 3, "c": [2.0] * 3}
    assert inner.cache[("inner",)] == "b"
    assert events[: len(PRIMED_STEP)] == PRIMED_STEP  # the inner step, inside the outer priming
    assert fake_krex.ops == ["region_enter", "region_exit"] * 2


def test_subclass_pruning_further_falls_back_to_one_region_per_configuration(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    """The step cannot see what an overriding ``prune_configs`` keeps of the base's list."""

    class Filtered(tuner_mod.Autotuner):  # type: ignore[misc]
        def prune_configs(self, kwargs: dict[str, Any]) -> list[str]:
            return [c for c in super().prune_configs(kwargs) if c != "boom"]

    kernel = _kernel(events, fake_krex, tuner_mod)
    assert Filtered(["a", "boom", "b"], kernel).run(1) == 1.0  # "boom" is never run
    assert events == [
        *("a:out", "sync", "region_enter", "a:in", "region_exit"),
        *("b:out", "sync", "region_enter", "b:in", "region_exit", "launch b:out"),
    ]


def test_configuration_pruned_twice_is_primed_once_and_the_region_ends_after_it(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    tuner_mod.Autotuner(["a", "b", "a"], _kernel(events, fake_krex, tuner_mod)).run(1)
    assert events == [
        *("a:out", "sync", "b:out", "sync"),
        *("region_enter", "a:in", "b:in", "a:in", "region_exit", "launch b:out"),
    ]


def test_exception_of_one_configuration_is_raised_from_its_own_bench(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    events: list[str],
) -> None:
    """A ``_bench`` override that tolerates failing configurations keeps the others' times."""

    kernel = _kernel(events, fake_krex, tuner_mod)
    tuner = _tolerant(tuner_mod, ValueError)(["a", "boom", "b"], kernel)
    assert tuner.run(1) == 1.0
    assert tuner.timings == {"a": [3.0] * 3, "boom": [float("inf")] * 3, "b": [1.0] * 3}
    assert events == [
        *("a:out", "sync", "boom:out", "b:out", "sync"),
        *("region_enter", "a:in", "b:in", "region_exit", "launch b:out"),
    ]


def test_refused_region_is_asked_again_by_the_next_configuration(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    monkeypatch: pytest.MonkeyPatch,
    events: list[str],
) -> None:
    """A ``_bench`` override that swallows a RegionError: no configuration runs unprotected."""
    from krex_client.region import RegionError

    request = fake_krex.request
    refusals = [RegionError("drain timed out")]

    def refusing(op: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if op == "region_enter" and refusals:
            events.append("refused")
            raise refusals.pop()
        return request(op, *args, **kwargs)

    monkeypatch.setattr(fake_krex, "request", refusing)

    kernel = _kernel(events, fake_krex, tuner_mod)
    tuner = _tolerant(tuner_mod, RegionError)(["a", "b", "c"], kernel)
    assert tuner.run(1) == 1.0
    assert events == [
        *("a:out", "sync", "b:out", "sync", "c:out", "sync", "refused"),
        *("region_enter", "b:in", "c:in", "region_exit", "launch b:out"),
    ]


def test_priming_stops_once_another_thread_holds_a_region(
    tuner_mod: types.ModuleType,
    fake_krex: FakeConnection,
    monkeypatch: pytest.MonkeyPatch,
    events: list[str],
) -> None:
    """As a single ``do_bench`` does: a first call would run alongside that region's timing."""
    kernel = _kernel(events, fake_krex, tuner_mod)
    monkeypatch.setattr(region, "busy", lambda: "a:out" in events)  # taken after a's priming
    tuner_mod.Autotuner(["a", "b", "c"], kernel).run(1)
    assert events == [
        *("a:out", "sync", "region_enter", "a:in", "b:in", "c:in", "region_exit", "launch b:out")
    ]
