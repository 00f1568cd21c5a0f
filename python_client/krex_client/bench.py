"""``krex_client.do_bench``: the original timing entry point.

``do_bench(fn, warmup_ms=25, rep_ms=100) -> float`` times ``fn`` inside one
critical region and returns the median in ms.  It runs the same measurement
as :func:`krex_client.testing.do_bench` (the first call outside the region;
estimate, warm-up, L2 flush and an event pair per repetition inside it);
only the parameter names and the default statistic differ.  Code written
for ``triton.testing`` should use :mod:`krex_client.testing`, whose
signatures are Triton's.

PyTorch is imported on first use only: ``import krex_client`` works anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from krex_client._timing import check_return_mode, current_backend, summarize
from krex_client.testing import measure

ReturnMode = Literal["median", "mean", "min", "max", "all"]


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
        return_mode: "median" (default; the lower middle sample of an even
            count, as ``torch.median``), "mean", "min", "max" of the
            per-repetition times, or "all" for the list of them.
        grad_to_none: tensors whose ``.grad`` is reset before each
            repetition (as triton's do_bench does for backward passes).

    Returns:
        The statistic in ms, or the list of per-repetition ms for "all".

    Raises:
        ValueError: unknown ``return_mode``.
        krex_client.region.RegionError: krexd refused the region.
    """
    check_return_mode(return_mode)
    times = measure(current_backend(), fn, warmup_ms, rep_ms, grad_to_none)
    return summarize(times, None, return_mode)
