"""The clock warm-up at region entry (docs/design/region-log.md, "Clock warm-up").

After the grant and the L2 flush the holder keeps the GPU busy until its SM
clock is warm: matmuls (``krex_client.warmup_matmul``) where the process's
torch drives CUDA, else the shim's memsets (:func:`choose`), stopped by
NVML's clock or a fixed budget (``KREX_REGION_WARM_*``).  No dependencies:
the slices and the clock come in as functions.
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
KIND_VAR = "KREX_REGION_WARM_KIND"
"""``auto`` (default: matmuls where torch drives CUDA, else memsets) or ``memset``."""
DEFAULT_PCT = 90.0
DEFAULT_MS = 100.0
STEP_MS = 200.0
"""Budget (ms) of the warm-up that runs whole in an autotuning step's region
(:meth:`Policy.for_tuning_step`)."""
KINDS = ("auto", "memset")
SLICE_MS = 2.0
"""Length of one slice when NVML decides: the clock is read between slices."""

STOPS = ("off", "no_clock", "warm_at_entry", "warm", "budget", "failed", "nothing_to_warm")
"""Why a warm-up stopped (or never ran): turned off, no clock to judge by and
no explicit budget, warm at entry, warm, budget spent, a slice failed, a
slice had nothing to warm with (no context, an open capture)."""

_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Policy:
    """How to warm: ``pct`` of the maximum SM clock, ``budget_ms``, whether
    ``budget_ms`` was set explicitly (``explicit``: warm even without NVML),
    and the ``kind`` asked for (one of :data:`KINDS`)."""

    pct: float = DEFAULT_PCT
    budget_ms: float = DEFAULT_MS
    explicit: bool = False
    kind: str = "auto"

    @classmethod
    def from_env(cls) -> Policy:
        """The policy of ``KREX_REGION_WARM_PCT``, ``_MS`` and ``_KIND``.

        An unparsable or out-of-range value warns once (RuntimeWarning) and
        its default applies.
        """
        pct = _env_float(PCT_VAR, 100.0)
        budget = _env_float(MS_VAR, float(2**32 // 1000 - 1))
        kind = os.environ.get(KIND_VAR, "").strip().lower() or "auto"
        if kind not in KINDS:
            warn_once(KIND_VAR, f"{KIND_VAR}={kind!r} is not one of {', '.join(KINDS)}")
            kind = "auto"
        return cls(
            pct=DEFAULT_PCT if pct is None else pct,
            budget_ms=DEFAULT_MS if budget is None else budget,
            explicit=budget is not None,
            kind=kind,
        )

    @classmethod
    def for_tuning_step(cls) -> Policy:
        """The warm-up of an autotuning step's region (krex_client.tuning_step).

        With NVML, its whole budget, :data:`STEP_MS`, unless the clock is
        at its maximum (an idle, cool GPU); without NVML, as for any region,
        none unless ``KREX_REGION_WARM_MS`` is set.  Chosen by measurement,
        not by a model of the GPU's clock control: on the H200, 8 concurrent
        autotuners whose steps warmed for 200 ms picked the serial winner
        238 times in 240 (all 8 in 10 of 10 trials in two runs, 8 of 10 in
        a third), against 78 in 80 both with the 90% threshold (which
        stopped after about 120 ms) and with no warm-up
        (docs/bench/autotune-h200.md).  ``KREX_REGION_WARM_PCT``
        and ``KREX_REGION_WARM_MS``, when set to valid values, apply as they
        do to any region (an invalid one warns once and is ignored: 100% and
        :data:`STEP_MS` apply).
        """
        policy = cls.from_env()
        pct_valid = _env_float(PCT_VAR, 100.0) is not None  # invalid: warned, ignored
        return cls(
            pct=policy.pct if pct_valid else 100.0,
            budget_ms=policy.budget_ms if policy.explicit else STEP_MS,
            explicit=policy.explicit,
            kind=policy.kind,
        )


def warn_once(name: str, message: str) -> None:
    """Warn (RuntimeWarning) that variable ``name`` was ignored, once per process."""
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"krex_client: {message}; ignored", RuntimeWarning, stacklevel=5)


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
    warn_once(name, f"{name}={raw!r} is not a number in [0, {top:g}]")
    return None


@dataclass(frozen=True, slots=True)
class Result:
    """What a warm-up did.

    ``ms``: wall time spent (0 when none ran); ``sm_clock_mhz``: the SM
    clock after it (the entry clock when none ran; None without NVML);
    ``error``: why a slice failed (``"CUresult 700"``, ``"RuntimeError:
    ..."``; None when none failed); ``kind``: ``"matmul"``, ``"memset"`` or
    ``"none"`` (none ran); ``slices``: slices run; ``stop``: one of
    :data:`STOPS`; ``first_mhz``: the SM clock before it (None without NVML).
    """

    ms: float
    sm_clock_mhz: int | None
    error: str | None = None
    kind: str = "none"
    slices: int = 0
    stop: str = "off"
    first_mhz: int | None = None


Slice = Callable[[int], int]
"""Keeps the GPU busy for about N µs, its work finished on return; returns the
µs spent, 0 when it had nothing to warm with, or a negative CUresult; may
raise (the warm-up then stops and says why)."""


def choose(policy: Policy, memset: Slice | None, matmul: Slice | None) -> tuple[str, Slice | None]:
    """The kind of warm-up to run and its slice function: ``("matmul", fn)``
    when ``matmul`` is given and the policy does not ask for memsets, else
    ``("memset", memset)``, or ``("none", None)`` when neither is there."""
    if matmul is not None and policy.kind != "memset":
        return "matmul", matmul
    if memset is not None:
        return "memset", memset
    return "none", None


def warm_up(
    warm_us: Slice,
    policy: Policy,
    clock: Callable[[], int | None] | None = None,
    top_mhz: int | None = None,
    first_mhz: int | None = None,
    now: Callable[[], float] = time.monotonic,
    kind: str = "memset",
) -> Result:
    """Keep the GPU busy at region entry until its clock is warm.

    With a ``clock`` (NVML), only when the SM clock is below the policy's
    percent of its maximum, in slices of :data:`SLICE_MS` until it reaches
    that or the budget is spent; without one, only when the budget was set
    explicitly, for that fixed time.  A zero budget turns it off.

    Args:
        warm_us: one slice of warm-up (:data:`Slice`): the shim's
            ``krex_shim_region_warm`` or a :class:`krex_client.warmup_matmul.Matmuls`.
        policy: threshold and budget.
        clock: reads the SM clock now (MHz, None when NVML cannot); None
            without NVML.
        top_mhz: the SM clock's maximum (MHz); None when unknown.
        first_mhz: the SM clock at entry (MHz), already read.
        now: a monotonic clock in seconds (tests pass a fake).
        kind: what ``warm_us`` runs (``"matmul"`` or ``"memset"``), for the result.

    Returns:
        A :class:`Result`; never raises for a failed slice (the region runs
        unwarmed rather than not at all).
    """
    by_clock = clock is not None and bool(top_mhz) and first_mhz is not None
    if policy.budget_ms <= 0:
        return Result(0.0, first_mhz, first_mhz=first_mhz)
    if not (by_clock or policy.explicit):
        return Result(0.0, first_mhz, stop="no_clock", first_mhz=first_mhz)
    threshold = policy.pct / 100.0 * (top_mhz or 0)
    sm, error, t0, slices, stop = first_mhz, None, now(), 0, "budget"
    while True:
        left_ms = policy.budget_ms - (now() - t0) * 1e3
        slice_us = round(min(SLICE_MS if by_clock else left_ms, left_ms) * 1e3)
        if by_clock and (sm is None or sm >= threshold):
            stop = "warm" if slices else "warm_at_entry"
            break
        if slice_us < 1:
            break  # the budget is spent (to the µs the shims count in)
        slices += 1
        try:
            spent = warm_us(slice_us)
        except Exception as exc:  # noqa: BLE001 - a failed slice: run the region unwarmed
            error, stop = f"{type(exc).__name__}: {exc}", "failed"
            break
        if spent < 0:
            error, stop = f"CUresult {-spent}", "failed"
            break
        if clock is not None:
            sm = clock()
        if spent == 0:
            stop = "nothing_to_warm"  # asking again would not change that
            break
    if stop == "warm" and sm is None:
        stop = "no_clock"  # the clock became unreadable: stopped, not warm
    ran = slices > 0
    return Result(
        (now() - t0) * 1e3 if ran else 0.0,
        sm,
        error,
        kind if ran else "none",
        slices,
        stop,
        first_mhz,
    )
