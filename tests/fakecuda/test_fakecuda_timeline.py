"""The timeline file: concurrent appenders never interleave lines, and the
timeline.py helpers answer what ran inside a window."""

from __future__ import annotations

import subprocess

import pytest

from . import timeline
from .harness import FakeCuda
from .timeline import Record, TimelineError


def test_many_processes_appending_never_interleave(fc: FakeCuda) -> None:
    procs = [
        subprocess.Popen(
            [str(fc.build.fakebench), "--count", "5000", "--kernel-ns", "0", "--streams", "2"],
            env=fc.env(),
            stdout=subprocess.DEVNULL,
        )
        for _ in range(8)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    text = fc.timeline_path.read_text()
    lines = text.splitlines()
    assert len(lines) == 8 * 5000 and text.endswith("\n")
    recs = timeline.parse(text)  # raises on any torn or merged line
    per_pid = timeline.by_pid(recs)
    assert sorted(per_pid) == sorted(p.pid for p in procs)
    assert all(len(rs) == 5000 for rs in per_pid.values())
    assert all({r.stream for r in rs} == {1, 2} for rs in per_pid.values())


def rec(pid: int, start: int, end: int, stream: int = 1, kind: str = "K") -> Record:
    return Record(pid, pid, stream, kind, start, end, False)


def test_overlapping_window_edges() -> None:
    recs = [
        rec(1, 0, 100),  # ends where the window starts
        rec(2, 50, 150),  # straddles the start
        rec(3, 120, 120),  # zero length, inside
        rec(4, 190, 300),  # straddles the end
        rec(5, 200, 300),  # starts where the window ends
        rec(6, 100, 100),  # zero length, on the edge
    ]
    hits = timeline.overlapping(recs, 100, 200)
    assert [r.pid for r in hits] == [2, 3, 4]
    assert [r.pid for r in timeline.overlapping(recs, 100, 200, exclude_pid=2)] == [3, 4]
    assert [r.pid for r in timeline.overlapping(recs, 100, 200, exclude_pid=[2, 4])] == [3]


def test_by_pid_and_by_stream_sort_by_start() -> None:
    recs = [rec(1, 50, 60, 2), rec(2, 0, 10), rec(1, 10, 20, 1), rec(1, 30, 40, 2)]
    assert [r.start_ns for r in timeline.by_pid(recs)[1]] == [10, 30, 50]
    assert [r.start_ns for r in timeline.by_stream(recs)[(1, 2)]] == [30, 50]


def test_parse_format_and_errors() -> None:
    text = "10 11 0 K 100 200 0\n10 12 3 G 200 250 1\n10 1"  # last line still being written
    a, b = timeline.parse(text)
    assert a == Record(10, 11, 0, "K", 100, 200, False)
    assert b.kind == "G" and b.captured and b.duration_ns == 50
    for bad in (
        "1 2 3 K 4 5\n",
        "1 2 3 X 4 5 0\n",
        "1 2 3 K 9 5 0\n",
        "1 2 3 K a 5 0\n",
        "1 2 3 K 4 5 2\n",
    ):
        with pytest.raises(TimelineError, match="line 1"):
            timeline.parse(bad)


def test_read_missing_file() -> None:
    assert timeline.read("/nonexistent/timeline", missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        timeline.read("/nonexistent/timeline")
