"""The clock warm-up at region entry (docs/design/region-log.md, "Clock warm-up").

A region often begins on an idle GPU: krexd drained it, the tenants were
compiling between measurements.  An idle GPU lowers its SM clock, and a
timing loop's own warm-up (Triton's 25 ms) does not always bring it back, so
two measurements timed in two regions can run at two clocks
(docs/bench/autotune-h200.md).  After the grant and the L2 flush, the holder
therefore keeps the GPU busy (the shim's ``krex_shim_region_warm``: memsets
of the L2 flush buffer in the current context) until the clock is warm:

* with NVML (``pynvml``), when the SM clock is below ``KREX_REGION_WARM_PCT``
  (default 90) percent of its maximum, in slices of ``SLICE_MS`` until it
  reaches that or ``KREX_REGION_WARM_MS`` (default 50) ms are spent;
* without NVML (or when it cannot read the SM clock), only when
  ``KREX_REGION_WARM_MS`` is set explicitly, for that fixed time.

``KREX_REGION_WARM_MS=0`` turns the warm-up off.  This module has no
dependencies: the shim call and the clock come in as functions.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

PCT_VAR = "KREX_REGION_WARM_PCT"
"""Warm threshold, percent of the SM clock's maximum (0-100)."""
MS_VAR = "KREX_REGION_WARM_MS"
"""Warm-up budget in ms per region (0: off); set, it also warms without NVML."""
DEFAULT_PCT = 90.0
DEFAULT_MS = 50.0
SLICE_MS = 2.0
"""Length of one shim call when NVML decides: the clock is read between slices."""

_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Policy:
    """How to warm: ``pct`` of the maximum SM clock, ``budget_ms``, and whether
    ``budget_ms`` was set explicitly (``explicit``: warm even without NVML)."""

    pct: float = DEFAULT_PCT
    budget_ms: float = DEFAULT_MS
    explicit: bool = False

    @classmethod
    def from_env(cls) -> Policy:
        """The policy of ``KREX_REGION_WARM_PCT`` and ``KREX_REGION_WARM_MS``.

        An unparsable or out-of-range value warns once (RuntimeWarning) and
        its default applies.
        """
        pct = _env_float(PCT_VAR, 100.0)
        budget = _env_float(MS_VAR, float(2**32 // 1000 - 1))
        return cls(
            pct=DEFAULT_PCT if pct is None else pct,
            budget_ms=DEFAULT_MS if budget is None else budget,
            explicit=budget is not None,
        )


def _env_float(name: str, top: float) -> float | None:
    """``name``'s value in [0, top]; None when unset, empty or invalid (warned once)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if 0.0 <= value <= top:
        return value
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"krex_client: {name}={raw!r} is not a number in [0, {top:g}]; ignored",
            RuntimeWarning,
            stacklevel=4,
        )
    return None


@dataclass(frozen=True, slots=True)
class Result:
    """What a warm-up did: ``ms`` spent (wall time, 0 when none ran), the SM
    clock (MHz) after it (the entry clock when none ran; None without NVML),
    and the CUresult of a failed slice (None when none failed)."""

    ms: float
    sm_clock_mhz: int | None
    error: int | None = None


def warm_up(
    warm_us: Callable[[int], int],
    policy: Policy,
    clock: Callable[[], int | None] | None = None,
    top_mhz: int | None = None,
    first_mhz: int | None = None,
    now: Callable[[], float] = time.monotonic,
) -> Result:
    """Keep the GPU busy at region entry until its clock is warm (module docstring).

    Args:
        warm_us: the shim's ``krex_shim_region_warm``: busy for about N µs,
            returns the µs spent, 0 when it had nothing to warm with (no
            context, an open capture), or a negative CUresult.
        policy: threshold and budget.
        clock: reads the SM clock now (MHz, None when NVML cannot); None
            without NVML.
        top_mhz: the SM clock's maximum (MHz); None when unknown.
        first_mhz: the SM clock at entry (MHz), already read.
        now: a monotonic clock in seconds (tests pass a fake).

    Returns:
        A :class:`Result`; never raises for a failed slice (the region runs
        unwarmed rather than not at all).
    """
    by_clock = clock is not None and bool(top_mhz) and first_mhz is not None
    if policy.budget_ms <= 0 or not (by_clock or policy.explicit):
        return Result(0.0, first_mhz)
    threshold = policy.pct / 100.0 * (top_mhz or 0)
    sm, error, t0, ran = first_mhz, None, now(), False
    while True:
        left_ms = policy.budget_ms - (now() - t0) * 1e3
        slice_us = round(min(SLICE_MS if by_clock else left_ms, left_ms) * 1e3)
        if slice_us < 1 or (by_clock and (sm is None or sm >= threshold)):
            break  # the budget is spent (to the µs the shim counts in), or the clock is warm
        spent = warm_us(slice_us)
        ran = True
        if spent < 0:
            error = -spent
            break
        if clock is not None:
            sm = clock()
        if spent == 0:
            break  # nothing to warm with; asking again would not change that
    return Result((now() - t0) * 1e3 if ran else 0.0, sm, error)
