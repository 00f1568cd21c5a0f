"""Drop-in timing: ``triton.testing``'s ``do_bench`` family, each timed in one critical region.

Same parameters, defaults and return shapes as Triton 3.x (and KernelBench's
``time_trials``); each function calls ``fn`` once outside the region (the
compile), then runs estimate, warm-up and timed repetitions inside one
``region.critical()``, as Triton's own loops do (each function says what it
runs where; docs/design/region-log.md "Clock warm-up").  Off a GPU host they
time on the host clock (``krex_client._timing``); off krex the region is a
no-op that warns once.  PyTorch is imported at the first measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from krex_client import _timing
from krex_client._timing import (
    Backend,
    check_return_mode,
    current_backend,
    summarize,
)
from krex_client._timing import clear_grads as _clear_grads
from krex_client._timing import count as _count
from krex_client.region import region

__all__ = ["do_bench", "do_bench_cudagraph", "time_trials", "TrialTimes"]

_ESTIMATE_CALLS = _timing.ESTIMATE_CALLS
_GRAPH_REPLAYS = 10
_GRAPH_ZERO_ESTIMATE_CALLS = 1000  # Triton's count when the estimate reads 0 ms


def do_bench(
    fn: Callable[[], Any],
    warmup: float = 25,
    rep: float = 100,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
) -> float | list[float]:
    """Time ``fn`` as ``triton.testing.do_bench`` does, inside one critical region.

    Outside the region: one call of ``fn`` (it compiles or loads its
    kernels: CPU time that would keep the siblings frozen and cool the
    clocks the region's warm-up raised) and a synchronization, the one
    Triton makes first anyway, and the L2 buffer's allocation.  Inside:
    the estimate from five calls (each after an L2 flush), warm-up and
    repetition counts from the ``warmup`` and ``rep`` budgets, then every
    repetition timed by its own event pair after resetting
    ``grad_to_none``'s gradients and flushing L2.  Within an enclosing
    region, or while another thread of the process holds one
    (:func:`may_prime`), the whole call runs in the region.  An exception
    of the first call propagates with no region entered.

    Args:
        fn: callable launching the work to time on the current stream.
        warmup: warm-up budget in ms (at least one call).
        rep: measurement budget in ms (at least one repetition).
        grad_to_none: tensors whose ``.grad`` is set to ``None`` before each
            repetition (for a ``fn`` that runs a backward pass).
        quantiles: when given, return these quantiles (each in [0, 1]) of the
            per-repetition times instead of ``return_mode``'s statistic.
        return_mode: "mean" (default), "median", "min", "max", or "all".

    Returns:
        ms: a float; with ``quantiles``, a list of floats (a float when it has
        one element); with ``return_mode="all"``, the list of per-repetition ms.

    Raises:
        ValueError: unknown ``return_mode`` or a quantile outside [0, 1].
        krex_client.region.RegionError: krexd refused the region.
    """
    check_return_mode(return_mode)
    times = measure(current_backend(), fn, warmup, rep, grad_to_none)
    return summarize(times, quantiles, return_mode)


def may_prime() -> bool:
    """True when a first call may run outside the region (:func:`do_bench`).

    False inside a region of the calling thread (the enclosing region covers
    the whole call) and while another thread of the process holds a region
    (a first call would run beside its timed code).
    """
    return not region.inside() and not region.busy()


def measure(
    backend: Backend,
    fn: Callable[[], Any],
    warmup: float,
    rep: float,
    grad_to_none: Sequence[Any] | None,
) -> list[float]:
    """:func:`do_bench`'s measurement: the first call outside, the rest in one region.

    Args and units as :func:`bench_loop`'s; returns its per-repetition ms.
    Raises what ``fn`` raises (the first call's with no region entered) and
    ``RegionError`` when krexd refuses the region.
    """
    if not may_prime():
        with region.critical():
            return bench_loop(backend, fn, warmup, rep, grad_to_none)
    fn()
    backend.synchronize()
    cache = backend.flush_buffer()
    with region.critical():
        return bench_loop(backend, fn, warmup, rep, grad_to_none, primed=True, cache=cache)


def bench_loop(
    backend: Backend,
    fn: Callable[[], Any],
    warmup: float,
    rep: float,
    grad_to_none: Sequence[Any] | None,
    *,
    primed: bool = False,
    cache: Any = None,
) -> list[float]:
    """The timed loop of :func:`do_bench`; per-repetition ms (the caller holds the region).

    Args:
        backend: the timing backend (:mod:`krex_client._timing`).
        fn: the callable to time.
        warmup, rep: warm-up and measurement budgets in ms.
        grad_to_none: tensors whose ``.grad`` is reset before each repetition.
        primed: True when the caller already made the first call of ``fn``,
            synchronized and allocated ``cache``; by default the loop makes
            that call and allocates the buffer itself.
        cache: with ``primed``, the L2 buffer (:meth:`Backend.flush_buffer`).
    """
    if not primed:
        fn()
        backend.synchronize()
        cache = backend.flush_buffer()
    estimate_ms = _timing.estimate_ms(backend, fn, cache)
    n_warmup = _count(warmup, estimate_ms)
    n_repeat = _count(rep, estimate_ms)
    starts = [backend.event() for _ in range(n_repeat)]
    ends = [backend.event() for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_repeat):
        _clear_grads(grad_to_none)
        backend.flush(cache)
        starts[i].record()
        fn()
        ends[i].record()
    backend.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


def do_bench_cudagraph(
    fn: Callable[[], Any],
    rep: float = 20,
    grad_to_none: Sequence[Any] | None = None,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
) -> float | list[float]:
    """Time ``fn`` replayed from a CUDA graph, as ``triton.testing.do_bench_cudagraph`` does.

    On a side stream, outside the region: one call of ``fn``, an estimate
    from five plain calls, and the capture of ``n_repeat = rep / estimate``
    calls (1000 when the estimate reads 0) unrolled into one graph; inside:
    10 replays, each sample one replay divided by ``n_repeat`` (no L2 flush
    between calls, as in Triton).  The estimate only sizes the graph (a busy
    GPU makes it larger and the graph shorter); every sample is timed in the
    region.

    Args:
        fn: callable whose launches can be captured in a CUDA graph.
        rep: measurement budget in ms for one replay of the unrolled graph.
        grad_to_none: tensors detached, marked ``requires_grad`` and whose
            ``.grad`` is reset before capture and before each unrolled call.
        quantiles: as for :func:`do_bench`, over the 10 per-replay samples.
        return_mode: as for :func:`do_bench`.

    Returns:
        ms per call: the shapes of :func:`do_bench`'s return value.

    Raises:
        ValueError: unknown ``return_mode`` or a quantile outside [0, 1].
        krex_client.region.RegionError: krexd refused the region.
    """
    check_return_mode(return_mode)
    backend = current_backend()
    with backend.side_stream():
        if may_prime():
            graph, n_repeat = capture_graph(backend, fn, rep, grad_to_none)
            with region.critical():
                times = replays(backend, graph, n_repeat)
        else:
            with region.critical():
                graph, n_repeat = capture_graph(backend, fn, rep, grad_to_none)
                times = replays(backend, graph, n_repeat)
    return summarize(times, quantiles, return_mode)


def capture_graph(
    backend: Backend, fn: Callable[[], Any], rep: float, grad_to_none: Sequence[Any] | None
) -> tuple[Any, int]:
    """The first call of ``fn``, the estimate and the capture of :func:`do_bench_cudagraph`.

    Runs on the current stream (the caller makes a side stream current).

    Args:
        backend: the timing backend.
        fn: the callable to capture.
        rep: the budget in ms of one replay of the unrolled graph.
        grad_to_none: tensors detached, marked ``requires_grad`` and whose
            ``.grad`` is reset before capture and before each unrolled call.

    Returns:
        ``(graph, n_repeat)``: the graph of ``n_repeat`` unrolled calls.
    """
    fn()
    if grad_to_none is not None:
        for x in grad_to_none:
            x.detach_()
            x.requires_grad_(True)
            x.grad = None
    # Estimate from plain calls (capturing a graph costs far more than a call).
    start, end = backend.event(), backend.event()
    start.record()
    for _ in range(_ESTIMATE_CALLS):
        fn()
    end.record()
    backend.synchronize()
    estimate_ms = start.elapsed_time(end) / _ESTIMATE_CALLS
    n_repeat = _GRAPH_ZERO_ESTIMATE_CALLS if estimate_ms == 0 else _count(rep, estimate_ms)

    def unrolled() -> None:
        for _ in range(n_repeat):
            _clear_grads(grad_to_none)
            fn()

    graph = backend.capture(unrolled)
    backend.synchronize()
    return graph, n_repeat


def replays(backend: Backend, graph: Any, n_repeat: int) -> list[float]:
    """ms per call of each of the 10 timed replays of ``graph`` (``n_repeat`` calls each)."""
    return [_replay_ms(backend, graph) / n_repeat for _ in range(_GRAPH_REPLAYS)]


@dataclass(frozen=True)
class TrialTimes:
    """Per-trial times of :func:`time_trials` and their statistics (all in ms).

    ``std`` is the population standard deviation (``numpy.std``'s default,
    which KernelBench reports); ``num_trials == len(times_ms)``.
    """

    times_ms: list[float]
    mean: float
    std: float
    min: float
    max: float
    num_trials: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_trials", len(self.times_ms))

    def as_dict(self) -> dict[str, float | int]:
        """KernelBench's ``get_timing_stats`` keys: mean, std, min, max, num_trials."""
        return {
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "num_trials": self.num_trials,
        }


def time_trials(
    fn: Callable[[], Any],
    num_trials: int = 100,
    num_warmup: int = 3,
    *,
    flush_l2: bool = False,
) -> TrialTimes:
    """Time ``fn`` for ``num_trials`` trials after ``num_warmup`` untimed calls (KernelBench).

    Each trial records an event pair around one call and synchronizes.  The
    first warm-up call (it compiles) runs outside the region, the other
    warm-up calls and all trials inside one (as :func:`do_bench` primes);
    with ``num_warmup=0`` everything runs in the region.

    Args:
        fn: callable launching the work on the current stream.
        num_trials: timed calls (>= 1).
        num_warmup: untimed calls before them (>= 0).
        flush_l2: overwrite an L2-sized buffer before each trial (KernelBench
            does not; off by default to match it).

    Returns:
        :class:`TrialTimes`: per-trial ms, mean, std, min, max.

    Raises:
        ValueError: ``num_trials < 1`` or ``num_warmup < 0``.
        krex_client.region.RegionError: krexd refused the region.
    """
    if num_trials < 1 or num_warmup < 0:
        raise ValueError(
            f"need num_trials >= 1 and num_warmup >= 0, got {num_trials}, {num_warmup}"
        )
    backend = current_backend()
    primed = num_warmup > 0 and may_prime()
    if primed:
        fn()
        backend.synchronize()
    cache = backend.flush_buffer() if flush_l2 else None
    with region.critical():
        for _ in range(num_warmup - int(primed)):
            fn()
        backend.synchronize()
        times = _trials(backend, fn, num_trials, cache)
    return TrialTimes(
        times_ms=times,
        mean=statistics.fmean(times),
        std=statistics.pstdev(times),
        min=min(times),
        max=max(times),
    )


def _trials(backend: Backend, fn: Callable[[], Any], num_trials: int, cache: Any) -> list[float]:
    """ms of each of ``num_trials`` calls, each between two events and synchronized."""
    times: list[float] = []
    for _ in range(num_trials):
        if cache is not None:
            backend.flush(cache)
        start, end = backend.event(), backend.event()
        start.record()
        fn()
        end.record()
        backend.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def _replay_ms(backend: Backend, graph: Any) -> float:
    start, end = backend.event(), backend.event()
    start.record()
    graph.replay()
    end.record()
    backend.synchronize()
    return float(start.elapsed_time(end))
