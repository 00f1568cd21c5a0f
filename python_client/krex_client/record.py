"""The region record: one JSON line per critical region (docs/design/region-log.md).

With ``KREX_REGION_LOG=PATH`` (``krex run --region-log``) the holder
appends one object to PATH after each region (its fields and warnings:
region-log.md "Fields", "Warnings"), one ``write(2)`` under an exclusive
``flock`` (``krex_client.logfile``), so several processes of one command
may share PATH.  Nothing here runs inside the timed code.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from krex_client import logfile
from krex_client.devicestate import DeviceState, open_state

ENV_VAR = "KREX_REGION_LOG"
"""Environment variable naming the region log (a path; empty: no log)."""

VERSION = 1
COLD_CLOCK = 0.8
"""A region entered with the SM clock below this fraction of its maximum is cold."""
OTHER_STREAMS_WARN_MS = 0.1
"""Work left on other streams above this (ms of device time at exit) is warned about;
below it the exit synchronization of idle contexts is indistinguishable from work."""


def log_path() -> str | None:
    """The region log's path from ``KREX_REGION_LOG``, or None when unset."""
    path = os.environ.get(ENV_VAR, "")
    return path or None


class Recorder:
    """Builds and appends the records of one process's regions to ``path``."""

    def __init__(self, path: str, state: DeviceState | None = None) -> None:
        # ``state``: the process's view of its GPU when it has one already (the clock warm-up's).
        self.path = path
        self.state = state if state is not None else open_state()
        self.device = self.state.device()
        self._outside = (0, 0)  # events (recorded, timed) outside regions at the last record
        self._lock = threading.Lock()

    def sample(self) -> dict[str, Any]:
        """Clocks, temperature and power now (:meth:`DeviceState.sample`)."""
        return self.state.sample()

    def record(
        self,
        figures: dict[str, Any],
        entry: dict[str, Any],
        exit_: dict[str, Any],
        events_outside: tuple[int, int],
        warmed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The record of one region.

        Args:
            figures: epoch, the timings in ms (wait_ms, drain_ms, freeze_ms,
                entry_ms, warmup_ms, region_ms, sync_ms, thaw_ms),
                other_streams_ms (or None), launches, l2_flushed, and
                ``warmup`` (what the clock warm-up did:
                docs/design/region-log.md).
            entry, exit_: :meth:`sample` after the grant and before the exit.
            events_outside: the shim's (recorded, timed) counts so far.
            warmed: ``{sm_clock_mhz}`` after the clock warm-up
                (krex_client.warmup); None: the entry clock (no warm-up ran).
        """
        with self._lock:
            since = (events_outside[0] - self._outside[0], events_outside[1] - self._outside[1])
            self._outside = events_outside
        rec: dict[str, Any] = {
            "v": VERSION,
            "time": time.time(),
            "pid": os.getpid(),
            "tenant": _int_env("KREX_TENANT"),
            "gpu": _int_env("KREX_GPU"),
            **figures,
            "device": dict(self.device),
            "entry": entry,
            "warmed": warmed if warmed is not None else {"sm_clock_mhz": entry.get("sm_clock_mhz")},
            "exit": exit_,
            "events_outside": {"recorded": events_outside[0], "timed": events_outside[1]},
        }
        rec["warnings"] = warnings_for(rec, since)
        return rec

    def append(self, rec: dict[str, Any]) -> None:
        """Append ``rec`` as one line (one ``write``, ``O_APPEND``, bounded ``flock``).

        Raises OSError (``logfile.LogFileError``) for a link, a FIFO or a write error.
        """
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        logfile.append_line(self.path, line)


def warnings_for(rec: dict[str, Any], since: tuple[int, int]) -> list[dict[str, str]]:
    """The record's warnings: ``[{kind, message}]``.

    Kinds: ``cold_clock`` (SM clock below ``COLD_CLOCK`` of its maximum
    after the clock warm-up, or at entry when none ran),
    ``contaminated`` (krexd's witness saw another process's GPU work inside
    the region: ``witness.others`` names each), ``timing_outside_region``
    (``since``: events recorded and timed outside any region since this
    process's previous region; timing warns, a record alone does not:
    frameworks record events for stream ordering), ``work_on_other_stream``
    (more than ``OTHER_STREAMS_WARN_MS`` of device work left on streams
    other than the timed one at exit).
    """
    out: list[dict[str, str]] = []
    cold = _cold_clock(rec)
    if cold is not None:
        out.append({"kind": "cold_clock", "message": cold})
    if since[1] > 0:
        out.append(
            {
                "kind": "timing_outside_region",
                "message": f"{since[1]} CUDA event timing(s) and {since[0]} event record(s) "
                "outside any region since the previous region: those measurements ran "
                "unprotected",
            }
        )
    witness = rec.get("witness") or {}
    if witness.get("contaminated"):
        names = ", ".join(
            f"pid {o.get('pid')} ({o.get('command')}, {o.get('busy_ms')} ms)"
            for o in witness.get("others", [])
        )
        out.append(
            {
                "kind": "contaminated",
                "message": f"other processes ran GPU work inside the region ({names}): "
                "its timing was not exclusive",
            }
        )
    other = rec.get("other_streams_ms")
    if other is not None and other > OTHER_STREAMS_WARN_MS:
        out.append(
            {
                "kind": "work_on_other_stream",
                "message": f"{other:.3f} ms of device work was left on streams other than "
                "the timed one when the region ended: the timing did not cover it",
            }
        )
    return out


def _cold_clock(rec: dict[str, Any]) -> str | None:
    """The ``cold_clock`` message when the clock the timed code began on was cold."""
    entry, top = rec["entry"].get("sm_clock_mhz"), rec["device"].get("sm_clock_max_mhz")
    warmup_ms = rec.get("warmup_ms") or 0.0
    sm = entry
    if warmup_ms > 0:
        sm = (rec.get("warmed") or {}).get("sm_clock_mhz")
    if sm is None or not top or sm >= COLD_CLOCK * top:
        return None
    if warmup_ms > 0:
        return (
            f"SM clock {sm} MHz after {warmup_ms:.1f} ms of warm-up ({entry} MHz at entry), "
            f"{100 * sm / top:.0f}% of its maximum {top} MHz: the region's code began "
            "before the GPU clocked up"
        )
    return (
        f"SM clock {sm} MHz at entry, {100 * sm / top:.0f}% of its "
        f"maximum {top} MHz: the region started before the GPU clocked up"
    )


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
