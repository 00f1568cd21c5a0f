"""krex_client.testing: Triton's do_bench family and KernelBench's loop, each in one region.

The loops run over :class:`SimDevice` (a simulated clock), so counts and
results are exact; ``fake_krex`` counts the regions they ask krexd for.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import time
import warnings
from typing import Any

import pytest

import krex_client
from krex_client import testing
from krex_client.region import region

from .conftest import FakeConnection, SimDevice

TRITON_DO_BENCH = "(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode='mean')"
TRITON_CUDAGRAPH = "(fn, rep=20, grad_to_none=None, quantiles=None, return_mode='mean')"


def _params(fn: Any) -> str:
    """The signature without annotations, as Triton (which has none) prints it."""
    sig = inspect.signature(fn)
    return str(
        sig.replace(
            parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
    )


def test_signatures_are_tritons() -> None:
    assert _params(testing.do_bench) == TRITON_DO_BENCH
    assert _params(testing.do_bench_cudagraph) == TRITON_CUDAGRAPH


def test_do_bench_loop_counts_and_mean(sim: SimDevice, fake_krex: FakeConnection) -> None:
    # 0.5 ms per call: estimate 0.5 -> 25/0.5 = 50 warm-up calls, 100/0.5 = 200 repetitions.
    fn = sim.kernel(0.5)
    inside: list[bool] = []
    ms = testing.do_bench(lambda: (inside.append(fake_krex.held), fn()))
    assert ms == pytest.approx(0.5)
    assert isinstance(ms, float)
    assert sim.log.count("fn") == 1 + 5 + 50 + 200
    assert sim.log.count("flush") == 5 + 200
    # The first (compile) call ran before the region; the rest, warm-up included, in the one region.
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert inside == [False] + [True] * 255


def test_do_bench_flushes_before_each_timed_call(sim: SimDevice) -> None:
    testing.do_bench(sim.kernel(2.0), warmup=2, rep=6)
    # After estimate and warm-up: (flush, record, fn, record) per repetition.
    timed = sim.log[sim.log.index("sync", sim.log.index("sync") + 1) + 1 :]
    reps = [timed[i : i + 4] for i in range(timed.index("flush"), len(timed) - 1, 4)]
    assert reps == [["flush", "record", "fn", "record"]] * 3


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, 2.0),
        ({"return_mode": "median"}, 2.0),
        ({"return_mode": "min"}, 1.0),
        ({"return_mode": "max"}, 3.0),
        ({"return_mode": "all"}, [1.0, 2.0, 3.0]),
        ({"quantiles": [0.5]}, 2.0),
        ({"quantiles": [0.25, 0.5, 1.0]}, [1.5, 2.0, 3.0]),
        ({"quantiles": (0.5,), "return_mode": "min"}, 2.0),  # quantiles win, as in Triton
    ],
)
def test_return_shapes(sim: SimDevice, kwargs: dict[str, Any], expected: Any) -> None:
    durations = iter([2.0] * (1 + 5) + [2.0] + [1.0, 2.0, 3.0])
    # estimate 2.0 ms: warmup=2 -> 1 call, rep=6 -> 3 repetitions of 1, 2, 3 ms.

    def fn() -> None:
        sim.now += next(durations)

    got = testing.do_bench(fn, 2, 6, None, **kwargs)  # Triton's positional order
    assert got == pytest.approx(expected)
    assert type(got) is type(expected)


def test_median_of_an_even_count_is_the_lower_middle_as_torch_median() -> None:
    """Triton's ``return_mode="median"`` is ``torch.median``: no averaging."""
    from krex_client._timing import summarize

    assert summarize([4.0, 1.0, 3.0, 2.0], None, "median") == 2.0
    assert summarize([3.0, 1.0, 2.0], None, "median") == 2.0
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "median"):
        assert torch.median(torch.tensor([4.0, 1.0, 3.0, 2.0])).item() == 2.0


def test_bad_return_mode_runs_nothing(sim: SimDevice) -> None:
    calls: list[int] = []
    with pytest.raises(ValueError, match="return_mode"):
        testing.do_bench(lambda: calls.append(1), return_mode="avg")
    with pytest.raises(ValueError, match="return_mode"):
        testing.do_bench_cudagraph(lambda: calls.append(1), return_mode=None)  # type: ignore[arg-type]
    assert calls == []


def test_grad_to_none_reset_before_each_repetition(sim: SimDevice) -> None:
    class Tensor:
        grad: Any = None

    x = Tensor()
    seen: list[Any] = []
    kernel = sim.kernel(1.0)

    def fn() -> None:
        seen.append(x.grad)
        x.grad = "accumulated"
        kernel()

    testing.do_bench(fn, warmup=1, rep=4, grad_to_none=[x])
    assert seen[-4:] == [None] * 4  # each timed repetition starts with no gradient


def test_cudagraph_one_region_side_stream_and_per_call_time(
    sim: SimDevice, fake_krex: FakeConnection
) -> None:
    streams: list[int] = []
    kernel = sim.kernel(0.5)

    def fn() -> None:
        streams.append(sim.side_stream_depth)
        kernel()

    ms = testing.do_bench_cudagraph(fn, rep=10)
    assert ms == pytest.approx(0.5)
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert set(streams) == {1}  # every call on the side stream
    # estimate from 5 plain calls (0.5 ms) -> 20 calls unrolled in the one timed graph.
    assert sim.log.count("capture") == 1
    assert sim.log.count("replay") == 10
    assert sim.log.count("fn") == 1 + 5 + 20 + 10 * 20
    assert "flush" not in sim.log  # Triton's graph timing does not flush L2
    assert testing.do_bench_cudagraph(fn, rep=10, return_mode="all") == [0.5] * 10


def test_cudagraph_grad_to_none(sim: SimDevice) -> None:
    class Tensor:
        def __init__(self) -> None:
            self.grad: Any = "old"
            self.calls: list[str] = []

        def detach_(self) -> None:
            self.calls.append("detach_")

        def requires_grad_(self, flag: bool) -> None:
            self.calls.append(f"requires_grad_({flag})")

    x = Tensor()
    testing.do_bench_cudagraph(sim.kernel(1.0), rep=3, grad_to_none=[x])
    assert x.calls == ["detach_", "requires_grad_(True)"]
    assert x.grad is None


def test_time_trials(sim: SimDevice, fake_krex: FakeConnection) -> None:
    durations = iter([9.0, 9.0, 9.0, 1.0, 2.0, 3.0, 4.0])
    calls: list[bool] = []

    def fn() -> None:
        calls.append(fake_krex.held)
        sim.now += next(durations)

    res = testing.time_trials(fn, num_trials=4, num_warmup=3)
    assert res.times_ms == [1.0, 2.0, 3.0, 4.0]
    assert (res.mean, res.min, res.max, res.num_trials) == (2.5, 1.0, 4.0, 4)
    assert res.std == pytest.approx(statistics.pstdev([1.0, 2.0, 3.0, 4.0]))
    assert res.as_dict() == {"mean": 2.5, "std": res.std, "min": 1.0, "max": 4.0, "num_trials": 4}
    assert calls == [False] + [True] * 6 and fake_krex.ops == ["region_enter", "region_exit"]
    assert "flush" not in sim.log
    testing.time_trials(sim.kernel(1.0), num_trials=2, num_warmup=0, flush_l2=True)
    assert sim.log.count("flush") == 2
    with pytest.raises(ValueError):
        testing.time_trials(fn, num_trials=0)


def _order_of(fake_krex: FakeConnection, kernel: Any) -> Any:
    """``kernel`` logging "fn" into ``fake_krex.ops``, so calls and region ops share one order."""

    def fn() -> None:
        fake_krex.ops.append("fn")
        kernel()

    return fn


@pytest.mark.parametrize(
    "measure",
    [
        lambda fn: testing.do_bench(fn, warmup=1, rep=3),
        lambda fn: krex_client.do_bench(fn, 1, 3),
        lambda fn: testing.time_trials(fn, num_trials=2, num_warmup=2),
    ],
    ids=["do_bench", "legacy_do_bench", "time_trials"],
)
def test_first_call_runs_before_the_region(
    sim: SimDevice, fake_krex: FakeConnection, measure: Any
) -> None:
    measure(_order_of(fake_krex, sim.kernel(1.0)))
    ops = fake_krex.ops
    assert ops[:2] == ["fn", "region_enter"], ops
    assert ops.count("region_enter") == 1 and ops[-1] == "region_exit"
    assert sim.log.index("sync") == sim.log.index("fn") + 1  # synchronized before the region


def test_cudagraph_first_call_and_capture_run_before_the_region(
    sim: SimDevice, fake_krex: FakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = sim.capture

    def logged_capture(fn: Any) -> Any:
        fake_krex.ops.append("capture")
        return capture(fn)

    monkeypatch.setattr(sim, "capture", logged_capture)
    ms = testing.do_bench_cudagraph(_order_of(fake_krex, sim.kernel(0.5)), rep=1)
    assert ms == pytest.approx(0.5)
    ops = fake_krex.ops
    enter = ops.index("region_enter")
    # First call, five estimate calls, capture (two unrolled calls recorded): all before entry.
    assert ops[:enter] == ["fn"] * 6 + ["capture"] + ["fn"] * 2
    assert ops[enter + 1 : -1] == ["fn"] * 20 and ops[-1] == "region_exit"  # 10 replays of 2


def test_first_call_raising_enters_no_region(sim: SimDevice, fake_krex: FakeConnection) -> None:
    def broken() -> None:
        raise RuntimeError("compile failed")

    for measure in (testing.do_bench, testing.do_bench_cudagraph, testing.time_trials):
        with pytest.raises(RuntimeError, match="compile failed"):
            measure(broken)
    assert fake_krex.ops == []


def test_legacy_do_bench_keeps_its_contract(sim: SimDevice, fake_krex: FakeConnection) -> None:
    durations = iter([1.0] * 6 + [1.0] * 25 + [5.0, 1.0, 1.0] + [1.0] * 200)

    def fn() -> None:
        sim.now += next(durations)

    # warmup_ms/rep_ms keywords, median by default (5 ms outlier ignored).
    assert krex_client.do_bench(fn, warmup_ms=25, rep_ms=3) == 1.0
    assert fake_krex.ops == ["region_enter", "region_exit"]
    assert krex_client.do_bench(sim.kernel(1.0), 1, 4, return_mode="all") == [1.0] * 4


def test_nested_in_explicit_region_is_one_region(sim: SimDevice, fake_krex: FakeConnection) -> None:
    with region.critical():
        testing.do_bench(sim.kernel(1.0), warmup=1, rep=2)
        testing.time_trials(sim.kernel(1.0), num_trials=2)
    assert fake_krex.ops == ["region_enter", "region_exit"]


def test_host_clock_fallback_times_real_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from krex_client import _timing

    monkeypatch.setattr(_timing, "_host_warned", False)
    monkeypatch.delenv("KREX_SOCKET", raising=False)
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present: the host clock is not used")
    except ImportError:
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ms = testing.do_bench(lambda: time.sleep(0.002), warmup=4, rep=20, return_mode="min")
        testing.do_bench(lambda: None, warmup=1, rep=1)
    assert 2.0 <= ms < 20.0
    host = [w for w in caught if "host clock" in str(w.message)]
    assert len(host) == 1, [str(w.message) for w in caught]


def test_signatures_match_installed_triton() -> None:
    triton_testing = pytest.importorskip("triton.testing")
    assert _params(triton_testing.do_bench) == _params(testing.do_bench)
    assert _params(triton_testing.do_bench_cudagraph) == _params(testing.do_bench_cudagraph)


def test_same_shapes_and_figures_as_triton_on_a_gpu() -> None:
    triton_testing = pytest.importorskip("triton.testing")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)

    def fn() -> None:
        a @ a

    for kwargs in (
        {},
        {"quantiles": [0.5]},
        {"quantiles": [0.5, 0.2, 0.8]},
        {"return_mode": "all"},
    ):
        ours, theirs = testing.do_bench(fn, **kwargs), triton_testing.do_bench(fn, **kwargs)
        assert type(ours) is type(theirs), kwargs
        if isinstance(ours, list):
            assert len(ours) == len(theirs) or kwargs.get("return_mode") == "all"
    ours_ms, theirs_ms = testing.do_bench(fn), triton_testing.do_bench(fn)
    assert ours_ms == pytest.approx(theirs_ms, rel=0.25)
    with torch.cuda.stream(torch.cuda.Stream()):
        theirs_graph = triton_testing.do_bench_cudagraph(fn)
    assert testing.do_bench_cudagraph(fn) == pytest.approx(theirs_graph, rel=0.25)
