"""The holder's own steps around the timed code: the clock warm-up, the region record.

:func:`warm_up` runs inside the region, after the grant and the L2 flush
(:mod:`krex_client.warmup` decides how and how long); :func:`log` appends
the region's record after the exit (:mod:`krex_client.record`, nothing there
is timed).  :mod:`krex_client.region` calls both from its region and keeps
the per-process state (the shim binding, NVML, the recorder).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from krex_client import warmup

if TYPE_CHECKING:
    from krex_client.devicestate import DeviceState
    from krex_client.record import Recorder


class HolderShim(Protocol):
    """What these steps use of the shim's holder-side entry points (``shim_binding.Shim``)."""

    warm: Any  # krex_shim_region_warm, or None without the shim

    def launches(self) -> int | None:
        """Launches since the last ``region_begin`` so far; None without the shim."""
        ...

    def other_streams_ms(self) -> float | None:
        """Device time (ms) left on other streams at the last ``region_end``, or None."""
        ...

    def events_outside(self) -> tuple[int, int]:
        """CUDA events (recorded, timed) outside any region in this process so far."""
        ...


def warm_up(
    shim: HolderShim,
    device_view: Callable[[], DeviceState],
    policy: warmup.Policy,
    entry: dict[str, Any],
) -> tuple[warmup.Result, int]:
    """The clock warm-up, inside the region (after the grant and the L2 flush):
    its result and the kernel launches it made (matmuls; memsets launch none).

    ``device_view`` gives the process's view of its GPU (NVML or AMD SMI,
    ``krex_client.devicestate``; opened on first use);
    ``entry`` is the region log's entry sample (empty without a log).
    A failed warm-up warns (RuntimeWarning) and the region goes on.
    """
    first = entry.get("sm_clock_mhz")
    if policy.budget_ms <= 0:
        return warmup.Result(0.0, first, first_mhz=first), 0
    from krex_client import warmup_matmul

    matmuls = warmup_matmul.for_process() if policy.kind != "memset" else None
    kind, slice_fn = warmup.choose(policy, shim.warm, matmuls)
    if slice_fn is None:  # no shim and no torch: nothing to warm with
        return warmup.Result(0.0, first, stop="nothing_to_warm", first_mhz=first), 0
    state = device_view()
    clock = state.sm_clock if state.available else None
    if clock is not None and not entry:
        first = clock()  # no region log: the entry clock is read here
    top = state.sm_clock_max()
    before = shim.launches()
    result = warmup.warm_up(slice_fn, policy, clock, top, first, kind=kind)
    after = shim.launches()
    if result.error is not None:
        warnings.warn(
            f"krex_client: {kind} clock warm-up at region entry failed ({result.error})",
            RuntimeWarning,
            stacklevel=5,
        )
    launched = after - before if before is not None and after is not None else 0
    return result, max(0, launched)


def log(
    recorder: Recorder,
    shim: HolderShim,
    st: dict[str, float],
    grant: dict[str, Any],
    reply: dict[str, Any],
    samples: tuple[dict[str, Any], dict[str, Any]],
    warm: tuple[warmup.Result, int, warmup.Policy],
) -> None:
    """Append this region's record (after the exit: nothing here is timed).

    ``st`` is the region's figures (``Region.stats()``), ``grant`` and
    ``reply`` krexd's ``region_enter`` and ``region_exit`` bodies,
    ``samples`` the NVML samples at entry and exit, ``warm`` the warm-up's
    result, its launches and its policy.  A log that cannot be written warns.
    """
    result, warm_launches, policy = warm
    figures: dict[str, Any] = {
        "epoch": int(grant["epoch"]),
        **{k: st[k] for k in ("wait_ms", "drain_ms", "freeze_ms", "entry_ms")},
        "warmup_ms": st["warmup_ms"],
        "region_ms": st["region_ms"],
        "sync_ms": st["sync_ms"],
        "thaw_ms": float(reply.get("thaw_ms", 0.0)),
        "other_streams_ms": shim.other_streams_ms(),
        "launches": int(st["launches"]),
        "l2_flushed": bool(st["l2_flushed"]),
        "driver_lock": grant.get("driver_lock"),
        "witness": reply.get("witness"),
        "warmup": {
            "kind": result.kind,
            "ms": result.ms,
            "budget_ms": policy.budget_ms,
            "slices": result.slices,
            "launches": warm_launches,
            "stop": result.stop,
            "error": result.error,
            "sm_clock_before_mhz": result.first_mhz,
            "sm_clock_after_mhz": result.sm_clock_mhz,
        },
    }
    try:
        entry, exit_ = samples
        warmed = {"sm_clock_mhz": result.sm_clock_mhz}
        outside = shim.events_outside()
        recorder.append(recorder.record(figures, entry, exit_, outside, warmed))
    except OSError as exc:
        warnings.warn(f"krex_client: region log {recorder.path}: {exc}", stacklevel=4)
