"""krexd's reader of the fake driver's per-process activity rings, on a file written here
(the layout of docs/design/interfaces.md; test_fakecuda_checkpoint.py reads the driver's own)."""

from __future__ import annotations

import struct
from pathlib import Path

from krexd.memory import activity, sources

MS = 1_000_000


def _state(path: Path, pid: int, ops: int, entries: dict[int, tuple[int, int, int, int]]) -> None:
    """A state file whose record 1 is ``pid`` with ``ops`` recorded and ring ``entries``
    (index -> seq, start, end, gpu)."""
    with open(path, "wb") as f:
        f.truncate(activity.FILE_BYTES)
        f.write(struct.pack("<Q", sources.FAKE_MAGIC))
        rec = sources.FAKE_PROCS_OFF + sources.FAKE_PROC_BYTES
        f.seek(rec)
        f.write(struct.pack("<i", pid))
        f.seek(rec + activity.OPS_OFF)
        f.write(struct.pack("<Q", ops))
        ring = activity.RINGS_OFF + activity.RING_OPS * activity.RING_ENTRY_BYTES
        for i, (seq, start, end, gpu) in entries.items():
            f.seek(ring + i * activity.RING_ENTRY_BYTES)
            f.write(struct.pack("<QQQI4x", seq, start, end, gpu))


def test_busy_is_the_union_of_a_pid_operations_in_the_window(tmp_path: Path) -> None:
    path = tmp_path / "state"
    entries = {
        0: (257, 0, 10 * MS, 0),  # operation 257 in entry 0
        1: (2, 100 * MS, 200 * MS, 0),  # overwritten long ago: dropped
        2: (259, 150 * MS, 250 * MS, 0),
        3: (260, 200 * MS, 300 * MS, 0),  # overlaps the previous one (another stream)
        4: (261, 400 * MS, 500 * MS, 1),  # another GPU
        5: (7, 0, 10**12, 0),  # not the entry of operation 7: dropped
    }
    _state(path, 4242, 261, entries)
    src = activity.FakeActivitySource(str(path))
    assert src.busy(0, 0, 10**9) == {4242: 10 * MS + 150 * MS}
    assert src.busy(0, 180 * MS, 220 * MS) == {4242: 40 * MS}
    assert src.busy(0, 300 * MS, 400 * MS) == {}  # half-open: ends at 300
    assert src.busy(1, 0, 10**9) == {4242: 100 * MS}
    assert src.busy(0, 5 * MS, 5 * MS) == {}


def test_no_file_or_another_format_reads_as_idle(tmp_path: Path) -> None:
    assert activity.FakeActivitySource(str(tmp_path / "absent")).busy(0, 0, 10**9) == {}
    small = tmp_path / "small"
    small.write_bytes(b"rexfksv2" + bytes(100))
    assert activity.FakeActivitySource(str(small)).busy(0, 0, 10**9) == {}
