"""Time several callables in interleaved repetitions, as one ``do_bench`` each would.

The SM clock moves while a region runs, so callables timed one after the
other meet different clocks; spreading every callable's repetitions evenly
over one loop (:func:`schedule`) times each under the same mix
(docs/design/region-log.md "Clock warm-up").  The caller has made Triton's
first call of each and holds the region.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from krex_client import _timing
from krex_client._timing import Backend, clear_grads, count

EVENT_PAIRS = 4096
"""Most repetitions timed between two synchronizations: their events are reused
after each, so a large step holds at most this many pairs."""


@dataclass(frozen=True)
class Timed:
    """One callable to time and its ``do_bench`` budgets.

    ``warmup_ms`` and ``rep_ms``: ``do_bench``'s ``warmup`` and ``rep`` (ms);
    ``grad_to_none``: tensors whose ``.grad`` is reset before each repetition.
    """

    fn: Callable[[], Any]
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    grad_to_none: Sequence[Any] | None = None


def schedule(counts: Sequence[int]) -> list[int]:
    """The order of ``sum(counts)`` calls: callable ``i`` appears ``counts[i]`` times.

    Callable ``i``'s ``k``-th call sits at position ``(k + 0.5) / counts[i]``
    of the loop; calls are ordered by position (ties by index), so every
    callable's calls spread evenly from the loop's start to its end whatever
    its count.  ``counts``: non-negative ints.  Returns callable indices.
    """
    slots = [((k + 0.5) / n, i) for i, n in enumerate(counts) for k in range(n)]
    return [i for _, i in sorted(slots)]


def time_interleaved(backend: Backend, calls: Sequence[Timed]) -> list[list[float]]:
    """Per-repetition ms of each of ``calls``, timed interleaved.

    Each callable gets what ``triton.testing.do_bench`` (and
    ``krex_client.testing.bench_loop``) gives it: an estimate from five
    calls, each after an L2 flush; ``max(1, int(warmup / estimate))``
    warm-up calls and ``max(1, int(rep / estimate))`` repetitions, each
    after resetting ``grad_to_none``'s gradients and flushing L2, timed by
    its own event pair.  Only the order differs: the estimates run first,
    one callable after the other; then the warm-up calls and then the
    repetitions of all callables, interleaved, synchronized every
    :data:`EVENT_PAIRS` repetitions so that their events can time the next
    ones (Triton's loop synchronizes once, after its last repetition).

    Args:
        backend: the device's timing backend (:mod:`krex_client._timing`).
        calls: what to time; each ``fn`` launches on the current stream.

    Returns:
        One list per call, in ``calls``' order: its repetitions' ms in the
        order they ran.

    Raises:
        Exception: what a ``fn`` (or the backend) raised; work already
            queued is left to the caller to synchronize.
    """
    cache = backend.flush_buffer()
    warmups: list[int] = []
    repeats: list[int] = []
    for call in calls:
        estimate_ms = _timing.estimate_ms(backend, call.fn, cache)
        warmups.append(count(call.warmup_ms, estimate_ms))
        repeats.append(count(call.rep_ms, estimate_ms))
    for i in schedule(warmups):
        calls[i].fn()
    times: list[list[float]] = [[] for _ in calls]
    order = schedule(repeats)
    pool = [(backend.event(), backend.event()) for _ in range(min(len(order), EVENT_PAIRS))]
    for first in range(0, len(order), EVENT_PAIRS):
        block = order[first : first + EVENT_PAIRS]
        for i, (start, end) in zip(block, pool, strict=False):
            clear_grads(calls[i].grad_to_none)
            backend.flush(cache)
            start.record()
            calls[i].fn()
            end.record()
        backend.synchronize()
        for i, (start, end) in zip(block, pool, strict=False):
            times[i].append(float(start.elapsed_time(end)))
    return times
