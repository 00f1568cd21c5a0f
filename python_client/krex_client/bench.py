"""``do_bench``: time a GPU callable inside a critical region.

Follows the convention of ``triton.testing.do_bench``, which kernel agents
and their harnesses use: estimate one call, derive warm-up and repetition
counts from time budgets, flush L2 before every repetition, time each
repetition with a CUDA event pair, and report the median (or the mean, or
all samples).  The whole loop, warm-up included, runs inside
``region.critical()`` (paper §4.1: warm-up belongs to the measurement), so
krex gives it the GPU and its CPU cores alone.

PyTorch is imported on first use only: ``import krex_client`` works anywhere.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, Literal

from krex_client.region import region

ReturnMode = Literal["median", "mean", "min", "max", "all"]

# Fallback when the device does not report its L2 size (bytes).
_DEFAULT_L2_BYTES = 256 * 1024 * 1024


def do_bench(
    fn: Callable[[], Any],
    warmup_ms: float = 25,
    rep_ms: float = 100,
    return_mode: ReturnMode = "median",
    grad_to_none: list[Any] | None = None,
) -> float | list[float]:
    """Time ``fn`` on the current CUDA device; returns milliseconds.

    Args:
        fn: the callable to time; it launches GPU work on the current stream.
        warmup_ms: warm-up budget in ms (at least one call).
        rep_ms: measurement budget in ms (at least one repetition).
        return_mode: "median" (default), "mean", "min", "max" of the
            per-repetition times, or "all" for the list of them.
        grad_to_none: tensors whose ``.grad`` is reset before each
            repetition (as triton's do_bench does for backward passes).

    Returns:
        The statistic in ms, or the list of per-repetition ms for "all".

    Raises:
        ImportError: PyTorch with CUDA is not available.
        ValueError: unknown ``return_mode``.
        krex_client.region.RegionError: krexd refused the region.
    """
    if return_mode not in ("median", "mean", "min", "max", "all"):
        raise ValueError(f"unknown return_mode {return_mode!r}")
    import torch

    with region.critical():
        times = _time_reps(torch, fn, warmup_ms, rep_ms, grad_to_none)
    if return_mode == "all":
        return times
    if return_mode == "median":
        return float(statistics.median(times))
    if return_mode == "mean":
        return float(statistics.fmean(times))
    if return_mode == "min":
        return float(min(times))
    return float(max(times))


def _time_reps(
    torch: Any,
    fn: Callable[[], Any],
    warmup_ms: float,
    rep_ms: float,
    grad_to_none: list[Any] | None,
) -> list[float]:
    """The event-timed loop; one L2 flush before every repetition."""
    device = torch.cuda.current_device()
    l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    cache = torch.empty(max(l2_bytes, _DEFAULT_L2_BYTES) // 4, dtype=torch.int, device="cuda")

    fn()
    torch.cuda.synchronize()
    # Estimate the duration of one call (with a flush, as in the timed loop).
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
    n_warmup = max(1, int(warmup_ms / estimate_ms))
    n_repeat = max(1, int(rep_ms / estimate_ms))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_repeat):
        if grad_to_none is not None:
            for x in grad_to_none:
                x.grad = None
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]
