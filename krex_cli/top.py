"""``krexctl top [--interval S] [--iterations N] [--socket PATH]``: a live view of krexd.

Refreshes every ``--interval`` seconds (1) with, per GPU, the region holder,
the region queue, slots used/total, parked commands, regions entered and the
entry latency p50/p99 over the last minute (``gpus[].region.recent_entry_ms``,
kept by krexd), then the last events it saw between two refreshes (tenants
admitted and ended, regions granted, commands krex ended and why, refused
region entries).  Plain ANSI escapes (no curses): it works over SSH in any
terminal; on a terminal it draws on the alternate screen and hides the
cursor, and Ctrl-C (or SIGTERM) restores both and exits 0.  When stdout is
not a terminal each refresh is printed as plain text, one after another.
"""

from __future__ import annotations

import collections
import shutil
import signal
import sys
import time
from typing import Any, TextIO

from krex_cli import argtypes
from krex_client.connection import Connection, KrexUnavailable, RemoteError

MIN_INTERVAL_S = 0.1
"""The shortest ``--interval`` (each refresh asks krexd for its whole status)."""

ENTER_ALT = "\x1b[?1049h\x1b[?25l"
LEAVE_ALT = "\x1b[?25h\x1b[?1049l"
HOME_CLEAR = "\x1b[H\x1b[2J"
EVENTS = 8
"""How many recent events the view keeps."""


def add_parser(sub: Any) -> None:
    """Add the ``top`` subcommand to ``krexctl``'s subparsers ``sub``."""
    p = sub.add_parser(
        "top",
        help="live view: holders, queues, slots, entry latency, recent events",
        description="A live view of krexd, refreshed every second; Ctrl-C leaves (exit 0).",
    )
    p.add_argument(
        "--interval",
        type=argtypes.seconds(MIN_INTERVAL_S, 3600.0, low_open=False),
        default=1.0,
        metavar="S",
        help=f"seconds between refreshes ({MIN_INTERVAL_S:g} to 3600; default 1)",
    )
    p.add_argument(
        "--iterations",
        type=argtypes.integer(0, argtypes.MAX_COUNT, "a count"),
        default=0,
        metavar="N",
        help="stop after N refreshes (0: never)",
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="krexd's socket (default: $KREX_SOCKET or /run/krex/krexd.sock)",
    )


class Events:
    """What changed between two ``status`` replies, as short lines (newest last)."""

    def __init__(self, keep: int = EVENTS) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._last: dict[str, Any] | None = None

    def update(self, st: dict[str, Any], now: str) -> None:
        """Compare ``st`` with the previous status; ``now``: the time stamp for new lines."""
        last, self._last = self._last, st
        if last is None:
            return
        before = {t["id"]: t for t in last.get("tenants") or []}
        after = {t["id"]: t for t in st.get("tenants") or []}
        for tid in sorted(after.keys() - before.keys()):
            self.lines.append(f"{now} t{tid} admitted on gpu{after[tid].get('gpu')}")
        # Commands that came and went between two refreshes: krexd's admission total.
        admitted = (st.get("queue") or {}).get("granted_total", 0)
        unseen = admitted - (last.get("queue") or {}).get("granted_total", 0)
        unseen -= len(after.keys() - before.keys())
        if unseen > 0:
            self.lines.append(f"{now} {unseen} command(s) admitted and ended")
        for tid in sorted(before.keys() - after.keys()):
            self.lines.append(f"{now} t{tid} ended")
        old = {g["index"]: g for g in last.get("gpus") or []}
        for g in st.get("gpus") or []:
            self._gpu(old.get(g["index"]) or {}, g, now)

    def _gpu(self, old: dict[str, Any], new: dict[str, Any], now: str) -> None:
        gpu = new["index"]
        o_reg, n_reg = old.get("region") or {}, new.get("region") or {}
        granted = (n_reg.get("regions") or {}).get("granted", 0)
        before = (o_reg.get("regions") or {}).get("granted", 0)
        if granted > before:
            holder = new.get("holder")
            who = f", held by t{holder}" if holder is not None else ""
            self.lines.append(f"{now} gpu{gpu}: {granted - before} region(s) granted{who}")
        pairs = (
            ("command(s) ended", o_reg.get("commands_ended"), n_reg.get("commands_ended")),
            (
                "region entries refused",
                (o_reg.get("regions") or {}).get("refused"),
                (n_reg.get("regions") or {}).get("refused"),
            ),
        )
        for what, o, n in pairs:
            for reason, count in sorted((n or {}).items()):
                grown = count - (o or {}).get(reason, 0)
                if grown > 0:
                    self.lines.append(f"{now} gpu{gpu}: {grown} {what}: {reason}")


def _cell_ms(p: dict[str, Any] | None) -> str:
    if not p or not p.get("n"):
        return "-"
    return f"{p.get('p50', 0):.2f}/{p.get('p99', 0):.2f} (n={p['n']})"


def render(st: dict[str, Any] | None, events: Events, error: str | None, width: int = 100) -> str:
    """One screen: header, one row per GPU, the recent events (plain text, no escapes)."""
    stamp = time.strftime("%H:%M:%S")
    if st is None:
        return f"krexctl top  {stamp}\n\nkrexd: {error or 'no answer'}\n"
    q = st.get("queue") or {}
    lines = [
        f"krexctl top  {stamp}  krexd {st.get('version')} pid {st.get('pid')}  "
        f"up {st.get('uptime_s', 0):.0f}s  {len(st.get('tenants') or [])} tenant(s)  "
        f"{q.get('parked', 0)} parked",
        "",
    ]
    rows = [["GPU", "HOLDER", "QUEUE", "SLOTS", "REGIONS", "ENTRY p50/p99 ms (1 min)"]]
    for g in st.get("gpus") or []:
        reg = g.get("region") or {}
        holder = g.get("holder")
        rows.append(
            [
                str(g["index"]),
                f"t{holder}" if holder is not None else "-",
                str(reg.get("queue_length", 0)),
                f"{g.get('slots_used')}/{g.get('slots_total')}",
                str((reg.get("regions") or {}).get("granted", 0)),
                _cell_ms(reg.get("recent_entry_ms")),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += ["", "recent events:"]
    lines += [f"  {e}" for e in events.lines] or ["  (none yet)"]
    return "\n".join(line[:width] for line in lines) + "\n"


def _fetch(conn: Connection | None, socket: str) -> tuple[Connection | None, Any, str | None]:
    """One ``status``: (the connection to keep, the reply or None, the error or None)."""
    try:
        if conn is None:
            conn = Connection(socket, timeout_s=2.0)
        return conn, conn.request("status"), None
    except (KrexUnavailable, RemoteError, OSError) as exc:
        if conn is not None:
            conn.close()
        return None, None, str(exc)


def run(socket: str, interval_s: float, iterations: int, out: TextIO = sys.stdout) -> int:
    """Refresh until Ctrl-C (or ``iterations`` refreshes); returns 0."""
    tty = out.isatty()
    events = Events()
    conn: Connection | None = None

    def stop(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    if tty:
        out.write(ENTER_ALT)
    try:
        n = 0
        while True:
            conn, st, error = _fetch(conn, socket)
            if st is not None:
                events.update(st, time.strftime("%H:%M:%S"))
            width = shutil.get_terminal_size((100, 24)).columns
            out.write((HOME_CLEAR if tty else "") + render(st, events, error, width))
            out.flush()
            n += 1
            if iterations and n >= iterations:
                return 0
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
    finally:
        if tty:
            out.write(LEAVE_ALT)
            out.flush()
        signal.signal(signal.SIGTERM, previous)
        if conn is not None:
            conn.close()
