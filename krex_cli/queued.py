"""What ``krex run`` says while krexd keeps its ``admit`` parked: nothing waits silently.

After :data:`FIRST_S` of waiting, ``krex run`` finds its own parked request
in krexd's ``status`` and says in one line on stderr its place in the queue
and what it waits for (:func:`describe`); on a terminal the line is
rewritten every :data:`REFRESH_S`, elsewhere printed only with ``-v``, as a
new line when its text changes.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from krex_client.connection import Connection, KrexUnavailable, RemoteError
from krex_client.sizes import format_size

FIRST_S = 1.0
"""Seconds of waiting before the first line."""

REFRESH_S = 2.0
"""Seconds between two ``status`` requests (and updates of the line)."""

STATUS_TIMEOUT_S = 2.0
"""Seconds one ``status`` request may take; no answer: the line without a position."""

StatusFn = Callable[[], dict[str, Any] | None]


def describe(status: dict[str, Any] | None, pid: int, gpu: int | None) -> str:
    """The line for the request of launcher ``pid`` (asked for GPU ``gpu``, None: any).

    ``status`` is krexd's ``status`` reply (None when there was none).
    Returns e.g. ``queued: 2 of 3 parked requests; waiting for a free slot on
    GPU 1 (4 of 4 in use)``.

    krexd shows a caller its own parked requests in full (``queue.queue``, in
    FIFO order): the line says the request's place and what it waits for, a
    free slot on GPU N (with the GPUs' slot counts), GPU memory on GPU N, or a
    GPU with no tenants (``--exclusive``).  Where krexd cannot say (a status
    refused or not answered, a krexd that does not show the request) it says
    only "waiting for a free slot on GPU N" (or "on any GPU").
    """
    rows = list(((status or {}).get("queue") or {}).get("queue") or [])
    for i, row in enumerate(rows):
        if isinstance(row, dict) and row.get("launcher_pid") == pid:
            place = f"{i + 1} of {len(rows)} parked request{'s' if len(rows) > 1 else ''}"
            return f"queued: {place}; waiting for {_waits_for(row, status or {})}"
    where = f"GPU {gpu}" if gpu is not None else "any GPU"
    return f"queued: waiting for a free slot on {where}"


def _waits_for(row: dict[str, Any], status: dict[str, Any]) -> str:
    """What a parked request ``row`` (a ``queue.queue`` entry) waits for, in words."""
    gpu = row.get("gpu")
    if row.get("waiting_for") == "memory" and row.get("mem_gpu") is not None:
        need = format_size(int(row.get("mem_bytes") or 0))
        return f"{need} of GPU memory on GPU {row['mem_gpu']}"
    if row.get("exclusive"):
        which = f"GPU {gpu}" if gpu is not None else "a GPU"
        return f"{which} to have no tenants (--exclusive)"
    gpus = [g for g in status.get("gpus") or [] if gpu is None or g.get("index") == gpu]
    used = sum(int(g.get("slots_used") or 0) for g in gpus)
    total = sum(int(g.get("slots_total") or 0) for g in gpus)
    where = f"GPU {gpu}" if gpu is not None else "any GPU"
    slots = f" ({used} of {total} in use)" if gpus else ""
    return f"a free slot on {where}{slots}"


class QueueNotice:
    """The line ``krex run`` keeps on stderr while its ``admit`` waits (module docstring).

    Args:
        status: returns krexd's ``status`` reply, or None when it has none.
        gpu: the GPU asked for (``--gpu``), None for any.
        terminal: rewrite one line in place (stderr is a terminal).
        verbose: print, off a terminal, a line whenever the text changes.
        stream: where to write (default ``sys.stderr``).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        status: StatusFn,
        gpu: int | None,
        *,
        terminal: bool,
        verbose: bool,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._status = status
        self._gpu = gpu
        self._terminal = terminal
        self._on = terminal or verbose
        self._stream = stream
        self._clock = clock
        self._since = clock()
        self._next = self._since + FIRST_S
        self._last = ""
        self._open = False  # a line on the terminal waits for its end

    def poll(self) -> None:
        """Called while the ``admit`` waits: says or updates the line when it is time."""
        now = self._clock()
        if not self._on or now < self._next:
            return
        self._next = now + REFRESH_S
        text = describe(self._status(), os.getpid(), self._gpu)
        out = self._stream or sys.stderr
        if self._terminal:
            out.write(f"\rkrex: {text} ({now - self._since:.0f} s)\x1b[K")
            self._open = True
        elif text != self._last:
            out.write(f"krex: {text}\n")
        self._last = text
        out.flush()

    def done(self) -> None:
        """The ``admit`` was answered (or given up): end the line on a terminal."""
        if self._open:
            out = self._stream or sys.stderr
            out.write("\n")
            out.flush()
            self._open = False


def for_run(socket: str, gpu: int | None, verbose: bool) -> tuple[QueueNotice, Callable[[], None]]:
    """``krex run``'s notice for krexd at ``socket``, and a function closing its connection.

    ``status`` goes over a connection of its own, opened at the first line.
    """
    conn: list[Connection] = []

    def status() -> dict[str, Any] | None:
        try:
            if not conn:
                conn.append(Connection(socket, timeout_s=STATUS_TIMEOUT_S))
            return conn[0].request("status")
        except (KrexUnavailable, RemoteError):
            return None

    def close() -> None:
        for c in conn:
            c.close()

    notice = QueueNotice(status, gpu, terminal=_is_terminal(sys.stderr), verbose=verbose)
    return notice, close


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
