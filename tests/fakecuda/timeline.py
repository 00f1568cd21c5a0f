"""Read the fake driver's timeline file and ask what ran when.

The fake ``libcuda.so.1`` appends one line per kernel, memset and copy to
the file named by ``KREX_FAKE_TIMELINE`` (tests/fakecuda/README.md)::

    pid tid stream_id kind start_ns end_ns captured

Times are CLOCK_MONOTONIC nanoseconds, the clock of ``time.monotonic_ns()``.
Integration tests use :func:`overlapping` to prove that no sibling's kernel
ran inside a critical region (tests/fakecuda/README.md "Timeline file").

This module imports nothing from the project, so a test or tenant script
can load it by path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KERNEL = "K"
MEMSET = "S"
COPY = "C"
GRAPH_KERNEL = "G"
KINDS = frozenset({KERNEL, MEMSET, COPY, GRAPH_KERNEL})


class TimelineError(ValueError):
    """A timeline line does not have the documented format."""


@dataclass(frozen=True, slots=True)
class Record:
    """One operation the simulated device ran.

    ``start_ns``/``end_ns`` are CLOCK_MONOTONIC ns; ``stream`` is 0 for a
    context's legacy default stream, else unique within ``pid``; ``kind`` is
    one of KINDS; ``captured`` is True for work replayed from a graph.
    """

    pid: int
    tid: int
    stream: int
    kind: str
    start_ns: int
    end_ns: int
    captured: bool

    @property
    def duration_ns(self) -> int:
        """Length of the operation in ns."""
        return self.end_ns - self.start_ns


def parse_line(line: str, lineno: int = 0) -> Record:
    """Parse one timeline line (without or with its newline).

    Raises TimelineError naming ``lineno`` when the line is malformed.
    """
    fields = line.split()
    where = f"timeline line {lineno}: {line.rstrip()!r}"
    if len(fields) != 7:
        raise TimelineError(f"{where}: expected 7 fields, got {len(fields)}")
    pid, tid, stream, kind, start, end, captured = fields
    if kind not in KINDS:
        raise TimelineError(f"{where}: unknown kind {kind!r}")
    if captured not in ("0", "1"):
        raise TimelineError(f"{where}: captured must be 0 or 1")
    try:
        rec = Record(int(pid), int(tid), int(stream), kind, int(start), int(end), captured == "1")
    except ValueError as exc:
        raise TimelineError(f"{where}: {exc}") from None
    if rec.end_ns < rec.start_ns:
        raise TimelineError(f"{where}: ends before it starts")
    return rec


def parse(text: str) -> list[Record]:
    """Parse a whole timeline.

    A last line without its newline is ignored: it is a line still being
    written by a running process (each line is written by one write(2)).
    """
    lines = text.split("\n")
    complete = lines[:-1]  # text after the last newline is incomplete (or empty)
    return [parse_line(line, i + 1) for i, line in enumerate(complete) if line]


def read(path: str | Path, missing_ok: bool = False) -> list[Record]:
    """Read and parse the timeline file at ``path``.

    A missing file raises FileNotFoundError unless ``missing_ok`` (then no
    work was recorded: the file is created by the first cuInit).
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    return parse(text)


def overlapping(
    records: Iterable[Record],
    start_ns: int,
    end_ns: int,
    exclude_pid: int | Iterable[int] | None = None,
) -> list[Record]:
    """Records whose interval intersects the open window (start_ns, end_ns).

    Intervals are half-open: work ending exactly at ``start_ns`` or starting
    exactly at ``end_ns`` does not overlap; a zero-length record strictly
    inside the window does.  ``exclude_pid`` (a pid or several) drops the
    holder's own work.  Sorted by start time.
    """
    if exclude_pid is None:
        excluded: frozenset[int] = frozenset()
    elif isinstance(exclude_pid, int):
        excluded = frozenset({exclude_pid})
    else:
        excluded = frozenset(exclude_pid)
    hits = [
        r for r in records if r.pid not in excluded and r.start_ns < end_ns and r.end_ns > start_ns
    ]
    return sorted(hits, key=lambda r: (r.start_ns, r.end_ns))


def by_pid(records: Iterable[Record]) -> dict[int, list[Record]]:
    """Group records by process id, each list sorted by start time."""
    groups: defaultdict[int, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.pid].append(r)
    return {pid: sorted(rs, key=lambda r: (r.start_ns, r.end_ns)) for pid, rs in groups.items()}


def by_stream(records: Iterable[Record]) -> dict[tuple[int, int], list[Record]]:
    """Group records by (pid, stream), each list sorted by start time."""
    groups: defaultdict[tuple[int, int], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.pid, r.stream)].append(r)
    return {key: sorted(rs, key=lambda r: (r.start_ns, r.end_ns)) for key, rs in groups.items()}
